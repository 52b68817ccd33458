"""Loading the policy model and the :class:`PolicyHandle` parts use to reach it."""

from __future__ import annotations

import logging
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
    """

    name_or_path: str | None = None
    recipe: str | None = None
    recipe_args: dict = field(default_factory=dict)
    dtype: str = "float32"
    trust_remote_code: bool = False
    localization_template: str = "paper"

    def __post_init__(self) -> None:
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


def load_policy(cfg: ModelConfig) -> tuple[Any, Any, str]:
    """``(model, tokenizer, path)`` loaded with ``from_pretrained``, the same path for every model."""
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
    return model, tokenizer, path


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
