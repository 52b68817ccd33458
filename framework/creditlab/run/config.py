"""A run's configuration: the top-level knobs (:class:`RunConfig`), :func:`validate` of every
section before anything heavy happens, :func:`build_parts` through the registries and the
provenance written beside every run.

Unknown plug-in names and config keys fail with a message naming the closest valid choice, before
the model loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from creditlab.analysis.preregistration import parse as parse_preregistration
from creditlab.errors import ConfigError, RegistryError, closest
from creditlab.registry import REGISTRIES, build_config
from creditlab.run.compose import CONF_DIR
from creditlab.run.layout import plan
from creditlab.run import precision
from creditlab.run.models import ModelConfig
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.types import RolloutConfig

#: Config sections that name a registered part (``name:``) and hold its ``Config`` keys. The
#: ``rollout`` section also holds the core's :class:`~creditlab.types.RolloutConfig` keys.
PART_KINDS = ("task", "backend", "verifier", "segmenter", "reset_selector", "rollout", "advantage")
LIBRARY_SECTIONS = ("trainer", "logger", "optim", "hydra")
#: How the runs will be compared (:mod:`creditlab.analysis.preregistration`); recorded, not used by training.
DECLARATIONS = ("preregistration",)
ROLLOUT_KEYS = frozenset(f.name for f in fields(RolloutConfig))


@dataclass
class RunConfig:
    """Top-level knobs of ``conf/train.yaml`` (sections are validated by their own schemas).

    Attributes:
        seed: Seeds model init, prompt order and every sampling call.
        prompts_per_step: Problems per RL step (each gets ``rollout.group_size`` completions).
        grad_clip: Max gradient norm (0 = off).
        checkpoint_every: Save a checkpoint every this many RL steps (0 = only at the end).
        resume: ``auto`` (resume from the newest intact checkpoint in ``<run_dir>/checkpoints``
            when there is one), a checkpoint path, or null (start fresh).
        resume_mismatch: ``refuse``: a resume whose config differs from the run_dir's
            ``config.yaml`` (apart from the step budget) stops; ``allow`` resumes anyway.
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
    resume_mismatch: str = "refuse"
    threads: int = 0
    run_dir: str = "runs/default"
    method: str = "custom"
    tags: list | None = None


SECTIONS: dict[str, type] = {"loss": LossConfig, "eval": EvalConfig, "model": ModelConfig}


@dataclass(frozen=True)
class Range:
    """The values one numeric key allows: a finite number (an integer when ``integer``; a list of
    ``length`` such numbers when ``length``) from ``low`` to ``high`` (inclusive unless ``open_low``
    / ``open_high``; None = unbounded), or null when ``optional``. ``note`` says what a special
    value means; ``part``: the key is only checked when its section names this part (``backend``)."""

    low: float | None = None
    high: float | None = None
    integer: bool = False
    open_low: bool = False
    open_high: bool = False
    optional: bool = False
    length: int = 0
    note: str = ""
    part: str | None = None

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.length:
            return isinstance(value, (list, tuple)) and len(value) == self.length and all(
                self._number_ok(v) for v in value
            )
        return self._number_ok(value)

    def _number_ok(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int if self.integer else (int, float)):
            return False
        if not math.isfinite(v):
            return False
        low_ok = self.low is None or (v > self.low if self.open_low else v >= self.low)
        return low_ok and (self.high is None or (v < self.high if self.open_high else v <= self.high))

    def text(self) -> str:
        """The allowed values in words, e.g. ``a finite number in (0, 1]``."""
        what = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            lo, hi = "(" if self.open_low else "[", ")" if self.open_high else "]"
            bound = f" in {lo}{_num(self.low)}, {_num(self.high)}{hi}"
        elif self.low is not None:
            bound = f" {'>' if self.open_low else '>='} {_num(self.low)}"
        elif self.high is not None:
            bound = f" {'<' if self.open_high else '<='} {_num(self.high)}"
        else:
            bound = ""
        if self.length:
            what = f"a list of {self.length} {'integers' if self.integer else 'finite numbers'}"
        out = ("null or " if self.optional else "") + what + bound
        return out + (f" ({self.note})" if self.note else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else str(x)


def _int(low: int, note: str = "", **kw: Any) -> Range:
    return Range(low=low, integer=True, note=note, **kw)


#: Every numeric key of the core sections and the libraries' sections, with its allowed values:
#: checked on the composed config before anything loads (:func:`check_ranges`), listed in
#: docs/configuration.md. Keys a section does not set are skipped.
RANGES: dict[str, Range] = {
    "seed": _int(0, high=2**32 - 1),
    "prompts_per_step": _int(1),
    "grad_clip": Range(0, note="0 = no clipping"),
    "checkpoint_every": _int(0, "0 = only at the end"),
    "threads": _int(0, "0 = torch's default"),
    "rollout.group_size": _int(1),
    "rollout.temperature": Range(0, note="0 = greedy decoding"),
    "rollout.top_p": Range(0, 1, open_low=True, note="1 = no nucleus truncation"),
    "rollout.top_k": _int(0, "0 = no top-k truncation"),
    "rollout.max_new_tokens": _int(1),
    "rollout.max_thoughts": _int(1),
    "rollout.max_thought_tokens": _int(1),
    "rollout.truncation_reward": Range(),
    "rollout.success_reward": Range(),
    "optim.lr": Range(0, open_low=True),
    "optim.weight_decay": Range(0),
    "optim.betas": Range(0, 1, open_high=True, length=2),
    "optim.eps": Range(0, open_low=True),
    "optim.momentum": Range(0),
    "eval.every": _int(0, "0 = never"),
    "eval.problems": _int(0, "0 = every test problem"),
    "eval.holdout": _int(0, "0 = the task's test split"),
    "eval.samples": _int(0, "0 = greedy pass@1 only"),
    "eval.k": _int(1),
    "eval.temperature": Range(0, note="0 = greedy decoding"),
    "eval.batch_size": _int(1),
    "trainer.max_steps": _int(1, "RL steps"),
    "trainer.num_nodes": _int(1),
    "trainer.log_every_n_steps": _int(1),
    "trainer.num_sanity_val_steps": _int(0),
    "backend.max_batch_size": _int(1, part="hf"),
    "backend.compact_fraction": Range(0, 1, part="hf"),
    "backend.fused_copy_budget_mb": Range(0, part="hf"),
    "backend.prefix_cache_mb": Range(0, part="hf"),
    "backend.fused_shared_context_min": _int(0, part="hf"),
    "backend.max_model_len": _int(1, "null = the model's max_position_embeddings", optional=True, part="vllm"),
    "backend.kv_cache_gib": Range(0, open_low=True, part="vllm"),
    "backend.gpu_memory_utilization": Range(0, 1, open_low=True, part="vllm"),
    "backend.max_num_seqs": _int(1, part="vllm"),
}
#: String-valued library keys and the values they allow.
CHOICES: dict[str, tuple[Any, ...]] = {
    "trainer.accelerator": ("cpu", "gpu", "cuda", "mps", "tpu", "hpu", "auto"),
    "trainer.precision": (
        "32-true", "32", 32, "64-true", "64", 64, "16-mixed", "16", 16, "bf16-mixed", "bf16",
        "16-true", "bf16-true", "transformer-engine", "transformer-engine-float16",
        "auto",  # resolved by validate() (creditlab.run.precision): bf16-mixed only where the hardware has bf16 units
    ),
}
_ABSENT = object()


def vllm_workers(engine_kwargs: Mapping[str, Any]) -> int:
    """The workers a ``vllm.LLM`` built with ``engine_kwargs`` runs (tensor x pipeline parallel)."""
    return int(engine_kwargs.get("tensor_parallel_size", 1)) * int(engine_kwargs.get("pipeline_parallel_size", 1))


def vllm_weight_sync(mode: str, engine_kwargs: Mapping[str, Any]) -> str:
    """How a vLLM engine's weight syncs travel, ``memory`` or ``file``: ``backend.weight_sync``,
    where ``auto`` is ``memory`` for an engine of one worker (read by the backend and the memory
    plan alike)."""
    return mode if mode != "auto" else ("memory" if vllm_workers(engine_kwargs) == 1 else "file")


def check_ranges(cfg: DictConfig) -> None:
    """Check every key of :data:`RANGES` and :data:`CHOICES` that ``cfg`` sets.

    Raises:
        ConfigError: Naming the key, its value and the values it allows.
    """
    for path, rng in RANGES.items():
        value = OmegaConf.select(cfg, path, default=_ABSENT)
        section = path.partition(".")[0]
        if value is _ABSENT or (rng.part and OmegaConf.select(cfg, f"{section}.name") != rng.part):
            continue
        value = _plain(value) if isinstance(value, DictConfig) else value
        value = list(value) if OmegaConf.is_list(value) else value
        if not rng.allows(value):
            raise ConfigError(f"{path}={value!r}: must be {rng.text()}.")
    for path, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, path, default=_ABSENT)
        if value is not _ABSENT and not isinstance(value, DictConfig) and value not in allowed:
            hint = closest(str(value), [str(a) for a in allowed])
            raise ConfigError(
                f"{path}={value!r}: must be one of {', '.join(dict.fromkeys(str(a) for a in allowed))}."
                + (f" Did you mean '{hint}'?" if hint else "")
            )


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


def check_machine(cfg: DictConfig, launch: Any) -> None:
    """What running ``cfg`` on this machine needs beyond a valid config (:func:`validate` also
    accepts configs meant for other machines): a GPU accelerator needs as many CUDA GPUs as
    ``trainer.devices`` asks (``launch``: the :class:`~creditlab.run.layout.LaunchPlan`).

    Raises:
        ConfigError: Naming what this machine has and the setting to use instead.
    """
    accelerator = OmegaConf.select(cfg, "trainer.accelerator", default="cpu")
    if accelerator not in ("gpu", "cuda"):
        return
    have = torch.cuda.device_count()
    remote = "or run it on GPU nodes with hydra/launcher=slurm"
    if have == 0:
        raise ConfigError(
            f"trainer.accelerator={accelerator} needs a CUDA GPU, but torch finds none on this machine: "
            f"use trainer=cpu (one process) or trainer=ddp (data parallel over CPU cores), {remote}."
        )
    if launch.devices > have:
        raise ConfigError(
            f"trainer.devices={launch.devices} asks for {launch.devices} GPUs, but this machine has "
            f"{have}: set trainer.devices={have}, {remote}."
        )


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
        ``run`` (:class:`RunConfig`), ``preregistration`` (a
        :class:`~creditlab.analysis.preregistration.Preregistration` or None), ``rollout`` (the core's
        :class:`~creditlab.types.RolloutConfig`), ``loss``, ``eval``, ``model``, ``(class, config)``
        per part kind (the rollout strategy's under ``rollout_strategy``), and ``launch`` (the
        :class:`~creditlab.run.layout.LaunchPlan`) when there is a ``trainer`` section.

    ``trainer.precision: auto`` is resolved here, in ``cfg`` itself (:func:`creditlab.run.precision.resolve`),
    so that everything after (the memory plan, ``config.yaml``, the trainer) sees the precision
    chosen; ``precision`` is then the line saying what was chosen and why (None otherwise).

    Raises:
        ConfigError: Unknown top-level key or section key, wrong type, inconsistent settings.
        RegistryError: Unknown or broken plug-in.
    """
    chosen = precision.resolve(cfg)
    known = {f.name for f in fields(RunConfig)} | set(SECTIONS) | set(PART_KINDS) | set(LIBRARY_SECTIONS)
    known |= set(DECLARATIONS)
    for key in cfg:
        if key not in known:
            hint = closest(str(key), sorted(known))
            raise ConfigError(
                f"unknown top-level config key '{key}'."
                + (f" Did you mean '{hint}'?" if hint else "")
                + f" Valid keys: {', '.join(sorted(known))}."
            )
    check_ranges(cfg)
    top = {k: _plain(cfg[k]) for k in cfg if k in {f.name for f in fields(RunConfig)}}
    out: dict[str, Any] = {"run": build_config(RunConfig, top, "config"), "precision": chosen}
    out["preregistration"] = parse_preregistration(_plain(cfg.get("preregistration")), require_margin=True)
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
    if core.thought_decoding == "one_pass" and not out["backend"][0].watches:
        raise ConfigError(f"rollout.thought_decoding=one_pass needs a backend that decodes with a watch "
                          f"(backend=hf); backend={cfg.backend.name} has none: use rollout.thought_decoding=rounds.")
    selector = cfg.reset_selector.name if "reset_selector" in cfg else "none"
    _check_reset_selector(strategy_name, strategy.uses_reset_selector, selector)
    if "trainer" in cfg:
        out["launch"] = plan(_plain(cfg.trainer), out["run"].prompts_per_step)
    return out


def build_parts(checked: dict[str, Any], model: Any, tokenizer: Any, task: Any = None) -> dict[str, Any]:
    """Instantiate the parts from validated sections (the rollout strategy last: it gets the
    run's rollout settings, the tokenizer and the reset selector); ``task``: one built already
    (the runner loads the data before the model)."""
    def make(kind: str, **kw: Any) -> Any:
        cls, config = checked["rollout_strategy" if kind == "rollout" else kind]
        return cls(config, **kw)

    parts = {
        "task": task if task is not None else make("task"),
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
