"""Sampling settings checked and applied the same way by every backend: validation, the context
check, and the per-step draw of the HF backend's decoding loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from creditlab.errors import InputError
from creditlab.types import GenerationRequest, SamplingParams


def validate_sampling(sp: SamplingParams) -> None:
    """Raise ``ValueError`` naming the field when ``sp`` is not a valid setting."""
    t = sp.temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
    p = sp.top_p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")
    for name in ("top_k", "max_new_tokens"):
        v = getattr(sp, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    if isinstance(sp.stop, str) or not all(isinstance(s, str) and s for s in sp.stop):
        raise ValueError(f"stop must be a tuple of non-empty strings, got {sp.stop!r}")
    if sp.seed is not None and (isinstance(sp.seed, bool) or not isinstance(sp.seed, int)):
        raise ValueError(f"seed must be an int or None, got {sp.seed!r}")


def check_requests(
    requests: Sequence[GenerationRequest], sampling: SamplingParams, context: int | None
) -> None:
    """Raise when a request is empty, or needs more positions than the model's ``context``.

    Raises:
        ValueError: A request has neither prompt nor prefix ids.
        InputError: prompt + prefix + ``max_new_tokens`` exceeds ``context`` (None: no limit).
    """
    for i, r in enumerate(requests):
        if len(r.prompt_ids) + len(r.prefix_ids) == 0:
            raise ValueError(f"request {i} has neither prompt_ids nor prefix_ids")
        need = len(r.prompt_ids) + len(r.prefix_ids) + sampling.max_new_tokens
        if context is not None and need > context:
            raise InputError(
                f"request {i}: prompt ({len(r.prompt_ids)} tokens) + prefix "
                f"({len(r.prefix_ids)}) + max_new_tokens ({sampling.max_new_tokens}) = {need} "
                f"exceeds the model's context of {context} positions. Shorten the prompt "
                f"(task.prompt_template / task.limit), lower rollout.max_new_tokens, or use a "
                f"model with a longer context."
            )


@dataclass(frozen=True)
class SamplingPlan:
    """Everything the decoding loop reads: built from SamplingParams and the tokenizer only.

    Positional order: temperature, top_p, top_k, max_new_tokens, stop, seed, eos_token_id,
    pad_token_id, stop_token_ids, stop_texts.
    """

    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: int
    eos_token_id: int | None
    pad_token_id: int
    stop_token_ids: tuple[int, ...]  # stop strings that are exactly one token
    stop_texts: tuple[str, ...] = field(default=())  # the others, matched in decoded text

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_tokens(
    logits: torch.Tensor, plan: SamplingPlan, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose one token per row; return its log-prob and the distribution's entropy, both
    before truncation.

    Args:
        logits: (A, V) float32 next-token logits.
        plan: Sampling settings (temperature, top_k, top_p).
        gen: RNG for the draws.

    Returns:
        ``(tokens, logprobs, entropies)``, each (A,): with ``logp = log_softmax(logits / T)``
        (T = 1 when greedy), ``logprobs = logp[token]`` and ``entropies = -sum(exp(logp) * logp)``
        in nats, i.e. of the temperature-scaled distribution before top-k/top-p truncation.
    """
    if plan.greedy:
        tok = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1), _entropy(logp, logp.exp())
    scaled = logits / plan.temperature
    logp = torch.log_softmax(scaled, -1)
    probs_all = logp.exp()
    vocab = scaled.shape[-1]
    k = plan.top_k if 0 < plan.top_k < vocab else 0
    if k == 0 and plan.top_p >= 1:
        tok = torch.multinomial(probs_all, 1, generator=gen).squeeze(1)
    else:
        if plan.top_p < 1:
            vals, idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
            if k:
                vals, idx = vals[:, :k], idx[:, :k]
            probs = torch.softmax(vals, -1)
            # Keep the smallest head whose mass reaches top_p: drop a token once the mass
            # before it already reaches top_p (the first token is always kept).
            drop = (probs.cumsum(-1) - probs) >= plan.top_p
            vals = vals.masked_fill(drop, float("-inf"))
        else:
            vals, idx = torch.topk(scaled, k, dim=-1)
        choice = torch.multinomial(torch.softmax(vals, -1), 1, generator=gen)
        tok = idx.gather(1, choice).squeeze(1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1), _entropy(logp, probs_all)


def _entropy(logp: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """(A,) entropy of each row of (A, V) log-probs (tokens of probability 0 add 0, not NaN)."""
    return -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)


def split_stops(tokenizer: Any, stop: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(token ids, texts)``: stop strings that are exactly one token (matched by id, as the HF
    backend does) and the others (matched in the generated text)."""
    ids, texts = [], []
    for s in stop:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1 and tokenizer.decode(enc, skip_special_tokens=False) == s:
            ids.append(int(enc[0]))
        else:
            texts.append(s)
    return tuple(ids), tuple(texts)
