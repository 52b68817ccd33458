"""Sampling settings checked and applied the same way by every backend: validation, the context
check, and the per-step draw and row endings of the HF backend's decoding loop.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from creditlab.errors import InputError
from creditlab.interfaces import DecodeWatch
from creditlab.step.stops import completes, split_stops, window
from creditlab.types import GenerationRequest, SamplingParams

__all__ = [
    "END_REASONS", "SAMPLERS", "SamplingPlan", "check_requests", "end_rows", "inverse_cdf",
    "make_plan", "sample_tokens", "split_stops", "text_stop", "validate_sampling",
]

#: A completion's finish reasons, indexed as the decoding loop records them.
END_REASONS = ("length", "eos", "stop")


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


#: How the HF backend draws a token: ``inverse_cdf`` (the default: one uniform per row and step)
#: or ``multinomial`` (``torch.multinomial`` at every step, as before issue 40: kept so that runs
#: made before it reproduce exactly, with ``backend.compact_fraction=0.25``).
SAMPLERS = ("inverse_cdf", "multinomial")


def make_plan(tokenizer: Any, sp: SamplingParams) -> SamplingPlan:
    """The plan of ``sp`` for ``tokenizer``: its EOS and pad ids, stop strings split into token
    ids and texts (:func:`split_stops`), and a fresh random seed when ``sp.seed`` is None."""
    stop_ids, stop_texts = split_stops(tokenizer, sp.stop)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos if eos is not None else 0)
    return SamplingPlan(
        temperature=float(sp.temperature),
        top_p=float(sp.top_p),
        top_k=int(sp.top_k),
        max_new_tokens=int(sp.max_new_tokens),
        stop=tuple(sp.stop),
        seed=int(sp.seed) if sp.seed is not None else secrets.randbits(63),
        eos_token_id=eos,
        pad_token_id=pad,
        stop_token_ids=stop_ids,
        stop_texts=stop_texts,
    )


def sample_tokens(
    logits: torch.Tensor, plan: SamplingPlan, uniforms: torch.Tensor | torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Choose one token per row; return its log-prob and the distribution's entropy, both
    before truncation.

    Args:
        logits: (A, V) float32 next-token logits.
        plan: Sampling settings (temperature, top_k, top_p).
        uniforms: (A,) float64 in [0, 1), one per row (``None`` when greedy): the row's draw is
            the token where its cumulative distribution passes ``uniforms`` (inverse CDF), so a
            row's token depends on its own logits and uniform only, never on the other rows.
            A ``torch.Generator`` instead: the ``multinomial`` sampler (:data:`SAMPLERS`), whose
            draws depend on every row of the batch.

    Returns:
        ``(tokens, logprobs, entropies)``, each (A,): with ``logp = log_softmax(logits / T)``
        (T = 1 when greedy), ``logprobs = logp[token]`` and ``entropies = -sum(exp(logp) * logp)``
        in nats, i.e. of the temperature-scaled distribution before top-k/top-p truncation.
    """
    legacy = isinstance(uniforms, torch.Generator)
    entropy = _masked_entropy if legacy else _entropy
    if plan.greedy:
        tok = logits.argmax(-1)
        logp = torch.log_softmax(logits, -1)
        return tok, logp.gather(1, tok[:, None]).squeeze(1), entropy(logp, logp.exp())
    if uniforms is None:
        raise ValueError("sampling at temperature > 0 needs one uniform per row")

    def draw(weights: torch.Tensor) -> torch.Tensor:
        if legacy:
            return torch.multinomial(weights, 1, generator=uniforms).squeeze(1)
        return inverse_cdf(weights, uniforms)

    scaled = logits / plan.temperature if plan.temperature != 1 else logits
    logp = torch.log_softmax(scaled, -1)
    probs_all = logp.exp()
    vocab = scaled.shape[-1]
    k = plan.top_k if 0 < plan.top_k < vocab else 0
    if k == 0 and plan.top_p >= 1:
        tok = draw(probs_all)
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
        tok = idx.gather(1, draw(torch.softmax(vals, -1))[:, None]).squeeze(1)
    return tok, logp.gather(1, tok[:, None]).squeeze(1), entropy(logp, probs_all)


def inverse_cdf(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """(A,) long: per row of (A, V) non-negative ``weights`` (not necessarily normalised), the
    first index whose cumulative weight exceeds ``uniforms`` (A,) times the row's total, i.e. a
    draw with probability proportional to the weights (an index of weight 0 is never drawn).
    The sums run in float64, so no token is lost to float32 rounding of the cumulative sum."""
    cdf = weights.cumsum(-1, dtype=torch.float64)
    x = (uniforms.to(torch.float64) * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, x, right=True).squeeze(1).clamp_max_(weights.shape[-1] - 1)


def _entropy(logp: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """(A,) entropy of each row of (A, V) log-probs (tokens of probability 0, whose log-prob
    may be -inf, add 0, not NaN)."""
    return -torch.linalg.vecdot(probs, logp.clamp_min(torch.finfo(logp.dtype).min))


def _masked_entropy(logp: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """:func:`_entropy` as computed before issue 40 (the ``multinomial`` sampler's, bit for bit)."""
    return -(probs * logp.masked_fill(probs == 0, 0.0)).sum(-1)


def text_stop(
    tokenizer: Any, plan: SamplingPlan, out_tokens: torch.Tensor, rows: torch.Tensor, n_new: int
) -> torch.Tensor:
    """(len(rows),) bool: the latest generated token completes a multi-token stop string.

    Args:
        tokenizer: Decodes the windows of the latest tokens.
        plan: ``plan.stop_texts`` are the stop strings matched in text.
        out_tokens: (N, max_new) generated tokens of the whole batch.
        rows: (A',) batch rows to check.
        n_new: Tokens generated so far (the latest is at column ``n_new - 1``).
    """
    windows = out_tokens[rows, max(0, n_new - window(plan.stop_texts)) : n_new].tolist()
    kw = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    full = tokenizer.batch_decode(windows, **kw)
    prev = tokenizer.batch_decode([w[:-1] for w in windows], **kw)
    hit = [completes(t, p, plan.stop_texts) for t, p in zip(full, prev)]
    return torch.tensor(hit, dtype=torch.bool, device=rows.device)


def end_rows(
    tokenizer: Any, plan: SamplingPlan, step: int, tok: torch.Tensor, out_tokens: torch.Tensor,
    rows: torch.Tensor, alive: torch.Tensor, ended_at: torch.Tensor, why: torch.Tensor,
    stop_ids: torch.Tensor, watch: tuple[DecodeWatch, Sequence[int]] | None = None,
) -> None:
    """Record the rows that the step's tokens end: at EOS, after a stop string, or where a
    :class:`~creditlab.interfaces.DecodeWatch` says; clears them in ``alive`` (in place).

    Args:
        tokenizer, plan: The call's tokenizer and sampling plan.
        step: The step (its tokens are column ``step`` of ``out_tokens``).
        tok: (A,) the step's tokens, one per batch row in ``rows``.
        out_tokens: (N, max_new) generated tokens of the forward batch.
        rows: (A,) long, batch row -> row of the forward batch.
        alive: (A,) bool, rows not ended before this step.
        ended_at, why: (N,) each row's length and index in :data:`END_REASONS`, set for the
            rows this step ends.
        stop_ids: ``plan.stop_token_ids`` as a tensor on the tokens' device (made once per batch).
        watch: The watch and, per row of the forward batch, its request index (or None).
    """
    is_eos = tok == plan.eos_token_id if plan.eos_token_id is not None else None
    is_stop = torch.isin(tok, stop_ids) if plan.stop_token_ids else None
    if plan.stop_texts:
        text_hit = torch.zeros_like(alive)
        text_hit[alive] = text_stop(tokenizer, plan, out_tokens, rows[alive], step + 1).to(alive.device)
        is_stop = text_hit if is_stop is None else is_stop | text_hit
    ended = torch.zeros_like(alive)
    for flag, reason in ((is_eos, END_REASONS.index("eos")), (is_stop, END_REASONS.index("stop"))):
        if flag is None:
            continue
        newly = flag & alive & ~ended
        ended_at[rows] = torch.where(newly, step + 1, ended_at[rows])
        why[rows] = torch.where(newly, reason, why[rows])
        ended |= newly
    alive &= ~ended
    if watch is None:
        return
    dec, request_of = watch
    live = alive.nonzero().squeeze(1)
    for i, b, t in zip(live.tolist(), rows[live].tolist(), tok[live].tolist()):  # on the host
        reason = dec.observe(request_of[b], t)
        if reason is not None:
            ended_at[b], why[b], alive[i] = step + 1, END_REASONS.index(reason), False
