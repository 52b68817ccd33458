"""Loading the policy model: which checkpoint (:class:`ModelConfig`, a model id, a local folder or
a model recipe), ``from_pretrained`` for every model alike, and LoRA adapters through ``peft``.

LoRA (``model.lora.enabled``; the optional extra ``creditlab[lora]``) wraps the loaded model in a
``peft`` ``PeftModelForCausalLM``: only the adapter weights require grad (so the optimizer gets
only them), and everything that calls the model (generation, the training forward, the handle's
log-probs and input gradients) calls the wrapper. :func:`merged_state_dict` gives the weights with
the adapters merged in, under the base model's names: what a generation engine with its own copy
of the weights (``GenerationBackend.load_weights``, e.g. vLLM) loads.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

try:  # transformers >= 4.52: each decoder layer checkpoints itself
    from transformers.modeling_layers import GradientCheckpointingLayer
except ImportError:  # pragma: no cover - older transformers: the model body loops over its layers
    GradientCheckpointingLayer = None

from creditlab.accel import MODES, compile_model
from creditlab.errors import ConfigError
from creditlab.registry import build_config, registry

#: peft is an optional dependency (``pip install 'creditlab[lora]'``), imported when LoRA is used.
LORA_HINT = "model.lora.enabled needs peft: pip install 'creditlab[lora]' (or pip install peft)"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoraConfig:
    """LoRA adapters (``peft``) trained instead of the model's weights.

    Attributes:
        enabled: Wrap the model with adapters after loading; only they are trained.
        r: Adapter rank.
        alpha: Scale numerator: a layer computes ``W x + (alpha / r) B A x``.
        dropout: Must be 0: the policy runs in eval mode (the trainer's log-probs must equal the
            sampler's, TESTING.md trap 4), so adapter dropout would never apply.
        target_modules: Module names to adapt (a name matches a module whose path ends with it,
            e.g. ``q_proj``), or ``all-linear`` (every linear layer but the output head).
    """

    enabled: bool = False
    r: int = 64
    alpha: float = 64.0
    dropout: float = 0.0
    target_modules: Any = "all-linear"

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ValueError(f"model.lora.r must be an integer >= 1, got {self.r!r}")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha must be > 0, got {self.alpha!r}")
        if self.dropout != 0:
            raise ValueError(
                f"model.lora.dropout must be 0, got {self.dropout!r}: the policy runs in eval mode "
                "(the trainer's log-probs must equal the sampler's), so dropout would never apply"
            )
        targets = self.target_modules
        if not isinstance(targets, str):
            targets = list(targets or [])
            if not targets or not all(isinstance(t, str) and t for t in targets):
                raise ValueError(
                    f"model.lora.target_modules must be 'all-linear' or a list of module names, "
                    f"got {self.target_modules!r}"
                )
            self.target_modules = targets


@dataclass
class ModelConfig:
    """Which causal LM to train.

    Attributes:
        name_or_path: A ``transformers`` model id or local directory.
        recipe: Name of a model recipe (entry-point group ``creditlab.model_recipe``) that builds
            a local checkpoint and returns its path; used when ``name_or_path`` is null.
        recipe_args: Keyword arguments for the recipe.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        trust_remote_code: Passed to ``from_pretrained``.
        hints: Free-form facts about this model for the plug-ins that ask (a model preset's
            ``hints``, read by plug-in configs through interpolation, e.g. the prompt format a
            reset selector should use); the core never reads them.
        accelerator: Optional speed path (:mod:`creditlab.accel`): ``auto`` (fused decoding where
            supported), ``none``, ``fused`` or ``compile`` (``torch.compile`` of the forward,
            applied by :func:`load_policy`); the HF backend's ``accelerator`` reads it too.
        gradient_checkpointing: Keep only each decoder layer's input for the backward and
            recompute the layer there (:func:`enable_gradient_checkpointing`): activation memory
            of the update falls from every layer's intermediate tensors to one hidden state per
            layer, for about one more forward of compute.
    """

    name_or_path: str | None = None
    recipe: str | None = None
    recipe_args: dict = field(default_factory=dict)
    dtype: str = "float32"
    trust_remote_code: bool = False
    hints: dict = field(default_factory=dict)
    accelerator: str = "auto"
    gradient_checkpointing: bool = False
    lora: Any = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.lora, LoraConfig):
            self.lora = build_config(LoraConfig, dict(self.lora or {}), "model.lora")
        if self.lora.enabled and importlib.util.find_spec("peft") is None:
            raise ValueError(LORA_HINT)
        if self.accelerator not in MODES:
            raise ValueError(f"model.accelerator must be one of {', '.join(MODES)}, got '{self.accelerator}'")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {sorted(DTYPES)}, got '{self.dtype}'")
        if not self.name_or_path and not self.recipe:
            raise ValueError("set model.name_or_path (a model id or directory) or model.recipe")


def resolve_model_path(cfg: ModelConfig) -> str:
    """The local path or model id to load (building it through the recipe when asked)."""
    if cfg.name_or_path:
        return cfg.name_or_path
    recipe: Callable[[dict], str] = registry("model_recipe").get(cfg.recipe)
    return recipe(dict(cfg.recipe_args))


def load_policy(cfg: ModelConfig, seed: int = 0) -> tuple[Any, Any, str]:
    """``(model, tokenizer, path)`` loaded with ``from_pretrained``, the same path for every model,
    with LoRA adapters when ``cfg.lora.enabled`` (initialized from ``seed``), gradient
    checkpointing when ``cfg.gradient_checkpointing`` and its forward compiled when
    ``cfg.accelerator`` is ``compile``."""
    path = resolve_model_path(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[cfg.dtype], trust_remote_code=cfg.trust_remote_code
        )
    except OSError as exc:
        raise ConfigError(
            f"could not load model '{path}': {exc}. Pass a local directory as "
            f"model.name_or_path, or a hub id on a machine with network access."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = apply_lora(model, cfg.lora, seed)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return compile_model(model, cfg.accelerator), tokenizer, path


def enable_gradient_checkpointing(model: Any) -> list[torch.nn.Module]:
    """Turn on ``transformers``' gradient (activation) checkpointing of every decoder layer, in
    the policy's eval mode; returns the layers that checkpoint.

    ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` before ``transformers``
    5.24 renamed it) with ``use_reentrant=False``: torch's non-reentrant checkpoint, which needs
    no input that requires grad (a LoRA model's frozen embeddings; ``transformers`` also hooks the
    embeddings' output to require grad, which changes no gradient). A LoRA model is enabled on its
    base model: the adapters sit inside the checkpointed layers and are recomputed with them.

    The trap: ``transformers`` checkpoints a layer only while that layer module is in training
    mode, and the policy stays in eval mode on purpose (no dropout: the trainer's log-probs must
    equal the sampler's). So the decoder-layer modules alone (those whose ``gradient_checkpointing``
    flag is now on: ``GradientCheckpointingLayer``, or the model body in ``transformers`` before
    it) get ``training = True``, not their children: attention dropout reads the attention
    module's flag, which stays False, and nothing else in these layers reads ``training`` (Llama,
    Qwen2, OLMo-3 in ``transformers`` 5.24). A later ``model.eval()`` turns checkpointing off
    again; the HF backend restores every module's flag after generating, and under
    ``torch.no_grad`` (generation, old and reference log-probs) a layer never checkpoints.
    ``creditlab.step.forward`` sees the flags and runs the plain forward instead of the shared-prompt
    one (checkpointed layers drop the KV cache).
    """
    base = model.get_base_model() if is_peft(model) else model
    kwargs = {"use_reentrant": False}
    fix = "set model.gradient_checkpointing=false for this model"
    try:
        if callable(getattr(base, "activation_checkpointing_enable", None)):  # transformers >= 5.24
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    except ValueError as exc:  # the architecture does not support it
        raise ConfigError(f"model.gradient_checkpointing=true: {exc} ({fix})") from exc
    kind = GradientCheckpointingLayer or torch.nn.Module
    layers = [
        m for m in base.modules()
        if isinstance(m, kind) and getattr(m, "gradient_checkpointing", False) is True
    ]
    if not layers:
        raise ConfigError(
            f"model.gradient_checkpointing=true, but {type(base).__name__} has no layer that "
            f"checkpoints: {fix}."
        )
    for layer in layers:
        layer.training = True  # this module only (see above): .train() would turn dropout on
    return layers


#: Module types ``peft``'s LoRA can adapt (matched by class name, so that ``transformers``'
#: ``Conv1D`` counts without importing it).
_ADAPTABLE = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D")


def adaptable_module_names(model: torch.nn.Module) -> list[str]:
    """The distinct last path components of the modules LoRA can adapt, e.g. ``q_proj``."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if n and type(m).__name__ in _ADAPTABLE}
    return sorted(names)


def apply_lora(model: Any, cfg: LoraConfig, seed: int = 0) -> Any:
    """``model`` wrapped with LoRA adapters (``peft.get_peft_model``) when ``cfg.enabled``, else
    ``model`` itself. Base weights are frozen; the adapted model starts equal to the base model
    (peft initializes B = 0; A is drawn from ``seed``, whatever the global RNG's state).

    Raises:
        ConfigError: A target module name that matches no module of the model (the message lists
            the names that do).
    """
    if not cfg.enabled:
        return model
    from peft import LoraConfig as PeftLoraConfig  # optional dependency (creditlab[lora])
    from peft import get_peft_model

    targets = cfg.target_modules
    if targets != "all-linear":
        names = [n for n, _ in model.named_modules()]
        patterns = [targets] if isinstance(targets, str) else targets
        missing = [t for t in patterns if not any(n == t or n.endswith("." + t) for n in names)]
        if missing:
            raise ConfigError(
                f"model.lora.target_modules: {', '.join(missing)} matches no module of "
                f"{type(model).__name__}. Module names LoRA can adapt: "
                f"{', '.join(adaptable_module_names(model))} (or all-linear)."
            )
    peft_config = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
        target_modules=targets if isinstance(targets, str) else list(targets), task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft -> transformers
        torch.manual_seed(seed)
        return get_peft_model(model, peft_config)


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` wrapper."""
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights with every active LoRA adapter merged in, under the base model's names.

    For a plain model: its ``state_dict()``. For a ``peft`` LoRA model: the base model's state dict
    (``model.layers.0.self_attn.q_proj.weight``, ...) where each adapted layer's weight is
    ``W + (alpha / r) B A`` (peft's ``get_delta_weight``); adapter tensors are left out. The model
    itself is not changed (no merge/unmerge round trip, which would round the base weights). This
    is what a generation engine holding its own copy of the weights loads after each update: the
    module calls ``backend.load_weights(None)`` after every update, and such a backend (vLLM)
    reads ``merged_state_dict(self.model)`` there (``self.model`` is the trained module, also
    under DDP).

    Args:
        model: A causal LM, or a ``peft`` model wrapping one.

    Returns:
        ``{name: tensor}``; tensors are detached (new tensors for merged layers, the model's own
        for the others).
    """
    if not is_peft(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer  # optional dependency; a peft model implies it is there

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            active = [a for a in module.active_adapters if a in module.lora_A or a in module.lora_embedding_A]
            if active and not module.merged:
                deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        key = key.replace(".base_layer.", ".")
        out[key] = (value + deltas[key].to(value.dtype)) if key in deltas else value.detach()
    return out
