"""Loading the policy model (optionally with LoRA adapters) and the :class:`PolicyHandle` parts
use to reach it.

LoRA (``model.lora.enabled``) wraps the loaded model in a ``peft`` ``PeftModelForCausalLM``: only
the adapter weights require grad (so the optimizer gets only them), everything that calls the
model (generation, the training forward, the handle's log-probs and input gradients) calls the
wrapper, and the fused fast paths of :mod:`creditlab.fused` decline it (they reproduce plain
``transformers`` modules only) so the model's own forward runs. :func:`merged_state_dict` gives the
weights with the adapters merged in, under the base model's names: what a generation engine
with its own copy of the weights (``GenerationBackend.load_weights``, e.g. vLLM) loads.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from creditlab.interfaces import GenerationBackend, PolicyHandle
from creditlab.losses import gather_logprobs
from creditlab.registry import ConfigError, registry
from creditlab.types import Completion, GenerationRequest, Problem, SamplingParams, Trajectory

log = logging.getLogger(__name__)
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
        localization_template: The self-localization prompt this model follows (SRPO's
            ``reset_selector.template``): ``paper`` for instruction-following models, ``compact``
            for the tiny arith model, which is warm-started on it.
        localization_max_new_tokens: How many tokens this model's localization answers need: the
            default of ``reset_selector.max_new_tokens`` for ``self_localize``.
    """

    name_or_path: str | None = None
    recipe: str | None = None
    recipe_args: dict = field(default_factory=dict)
    dtype: str = "float32"
    trust_remote_code: bool = False
    localization_template: str = "paper"
    localization_max_new_tokens: int = 64
    lora: Any = field(default_factory=LoraConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.lora, LoraConfig):
            from creditlab.registry import build_config

            self.lora = build_config(LoraConfig, dict(self.lora or {}), "model.lora")
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
    with LoRA adapters when ``cfg.lora.enabled`` (initialized from ``seed``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

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
    return apply_lora(model, cfg.lora, seed), tokenizer, path


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
    from peft import LoraConfig as PeftLoraConfig
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
    from peft.tuners.lora import LoraLayer

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


def encode_prompt(tokenizer: Any, text: str) -> tuple[int, ...]:
    """Prompt text to ids: the chat template when the tokenizer has one, else plain encoding."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return tuple(int(i) for i in ids)
    return tuple(tokenizer(text, add_special_tokens=True)["input_ids"])


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions counting only real tokens (left padding gets 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def offset_embeddings(embeddings: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    """``embeddings + offset`` (the offset cast to their dtype and device, not differentiated), or
    ``embeddings`` itself when ``offset`` is ``None``: the forward input of
    :meth:`PolicyHandle.input_gradients`.

    Raises:
        ValueError: ``offset`` does not have the shape of ``embeddings``.
    """
    if offset is None:
        return embeddings
    if offset.shape != embeddings.shape:
        raise ValueError(
            f"embedding_offset must have the embeddings' shape {tuple(embeddings.shape)}; "
            f"got {tuple(offset.shape)}"
        )
    return embeddings + offset.detach().to(embeddings)


def forward_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L, V) logits of a left/right padded batch."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
    )
    return out.logits


class ModelPolicyHandle(PolicyHandle):
    """The current policy as parts see it: the trained module, its tokenizer and the backend.

    Args:
        model: The policy (``transformers`` causal LM).
        tokenizer: Its tokenizer.
        backend: The generation backend.
        rng: The step's generator.
        temperature: Sampling temperature of training rollouts (log-probs use it).
        micro_batch_size: Rows per forward pass in :meth:`logprobs` (0 = all at once).
        rollout_fn: ``(problems, requests, seed) -> list[Trajectory]``, the planner's sample-and-
            score, behind :meth:`rollouts`.

    ``generated_tokens`` counts the tokens of :meth:`generate` calls (e.g. SRPO's localizations;
    :meth:`rollouts` are counted by the planner) so runs compare on all generated tokens.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        backend: GenerationBackend,
        rng: torch.Generator,
        temperature: float = 1.0,
        micro_batch_size: int = 0,
        rollout_fn: Any = None,
    ) -> None:
        self.model = model
        self.rollout_fn = rollout_fn
        self.generated_tokens = 0
        self._tokenizer = tokenizer
        self.backend = backend
        self._rng = rng
        self.temperature = temperature if temperature > 0 else 1.0
        self.micro_batch_size = micro_batch_size

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def rng(self) -> torch.Generator:
        return self._rng

    def encode(self, text: str) -> tuple[int, ...]:
        return encode_prompt(self._tokenizer, text)

    @torch.no_grad()
    def logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        step = self.micro_batch_size or input_ids.shape[0]
        out = torch.zeros(input_ids.shape, dtype=torch.float32)
        for s in range(0, input_ids.shape[0], step):
            ids, mask = input_ids[s : s + step], attention_mask[s : s + step]
            logits = forward_logits(self.model, ids, mask)[:, :-1].float()
            out[s : s + step, 1:] = gather_logprobs(logits, ids[:, 1:], self.temperature)
        return out * attention_mask

    def branch_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        rows: torch.Tensor,
        at: torch.Tensor,
        branch_ids: torch.Tensor,
        branch_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Each trunk runs once; branches continue from its KV cache
        (:func:`creditlab.forward.branch_logits`), or the plain default when the model's cache
        cannot be shared."""
        from creditlab.forward import branch_logits

        if len(rows):
            logits = branch_logits(
                self.model, input_ids, attention_mask, rows, at, branch_ids, branch_mask,
                chunk=self.micro_batch_size,
            )
            if logits is not None:
                return gather_logprobs(logits, branch_ids, self.temperature) * branch_mask
        return super().branch_logprobs(input_ids, attention_mask, rows, at, branch_ids, branch_mask)

    def input_gradients(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        objective: Any,
        *,
        embedding_offset: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings = self.model.get_input_embeddings()(input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            logits = self.model(
                inputs_embeds=offset_embeddings(embeddings, embedding_offset),
                attention_mask=attention_mask,
                position_ids=position_ids(attention_mask),
                use_cache=False,
            ).logits
            value = objective(embeddings, logits)
            (grad,) = torch.autograd.grad(value, embeddings)
        return embeddings.detach(), grad.detach()

    def generate(
        self, requests: Sequence[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        out = self.backend.generate(requests, sampling)
        self.generated_tokens += sum(len(c.logprobs) for c in out)
        return out

    def rollouts(
        self, problems: Sequence[Problem], requests: Sequence[GenerationRequest]
    ) -> list[Trajectory]:
        if self.rollout_fn is None:
            return super().rollouts(problems, requests)
        seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
        return self.rollout_fn(problems, requests, seed)
