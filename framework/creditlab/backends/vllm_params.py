"""The vLLM backend's per-request settings, built without the engine: each request's seed, the
``vllm.SamplingParams`` read back against what was asked (TESTING.md trap 7) and vLLM's finish
reasons in creditlab's words."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from creditlab.types import SamplingParams

#: vLLM samples greedily below this temperature (``vllm.sampling_params._SAMPLING_EPS``).
GREEDY_BELOW = 1e-5


def request_seed(seed: int, index: int) -> int:
    """The sampling seed of request ``index`` of a call seeded with ``seed`` (63-bit hash)."""
    digest = hashlib.blake2b(f"{seed}/request/{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def finish_reason(reason: str | None, stop_reason: int | str | None) -> str:
    """vLLM's ``(finish_reason, stop_reason)`` as ``eos`` / ``stop`` / ``length``.

    vLLM reports ``"stop"`` for EOS (``stop_reason`` None) and for a stop id or string.
    """
    if reason == "length":
        return "length"
    if reason == "stop":
        return "eos" if stop_reason is None else "stop"
    raise RuntimeError(f"vLLM finished a request with reason {reason!r} ({stop_reason!r})")


def topk_entropy(entries: Mapping[int, Any], k: int) -> float:
    """Entropy (nats) of one step from vLLM's top-``k`` log-probs (``k = -1``: every token).

    ``H_k = -sum p log p`` over the ``k`` most likely tokens (entries of ``rank <= k``; vLLM
    adds the sampled token when it ranks lower), plus the tail mass ``m = 1 - sum p`` times
    ``-log p_k`` (each tail token has probability at most ``p_k``, so each of its nats is at
    least ``-log p_k``): a lower bound, exact when ``k`` covers the vocabulary or ``m = 0``.
    """
    lps = sorted((float(e.logprob) for e in entries.values() if k < 0 or (e.rank or 0) <= k),
                 reverse=True)
    probs = [math.exp(lp) for lp in lps]
    head = -sum(p * lp for p, lp in zip(probs, lps) if p > 0)
    tail = max(0.0, 1.0 - sum(probs))
    if k < 0 or tail <= 1e-9 or not lps or not math.isfinite(lps[-1]):
        return head
    return head + tail * -lps[-1]


def vllm_params(
    sp: SamplingParams, top_k: int, stop_ids: Sequence[int], stop_texts: Sequence[str], seed: int,
    logprobs: int = 0,
) -> Any:
    """One ``vllm.SamplingParams``, read back and checked against the request before use.
    ``logprobs``: top log-probs returned per token besides the sampled one (-1: all).

    Raises:
        RuntimeError: vLLM would change a setting (e.g. a temperature it treats as greedy).
    """
    from vllm import SamplingParams as VLLMSamplingParams  # optional dependency (creditlab[vllm])

    want = dict(
        temperature=float(sp.temperature), top_p=float(sp.top_p), top_k=top_k,
        max_tokens=int(sp.max_new_tokens), seed=seed, stop=list(stop_texts),
        stop_token_ids=list(stop_ids), logprobs=logprobs,
    )
    p = VLLMSamplingParams(
        n=1, **want, min_tokens=0, ignore_eos=False, skip_special_tokens=False,
        spaces_between_special_tokens=False, include_stop_str_in_output=True,
    )
    neutral = dict(
        n=1, repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, min_p=0.0,
        ignore_eos=False, min_tokens=0, logit_bias=None, bad_words=[],
    )
    check = {**want, **neutral}
    if want["temperature"] == 0:  # greedy: vLLM resets truncation, which greedy ignores
        check.pop("top_p"), check.pop("top_k")
    wrong = {
        k: (v, getattr(p, k, None)) for k, v in check.items()
        if not _same(getattr(p, k, None), v)
    }
    if wrong:
        raise RuntimeError(
            f"vLLM would not sample as requested: {{setting: (requested, vLLM's)}} = {wrong}. "
            "Use settings vLLM keeps (e.g. temperature 0 or >= 0.01)."
        )
    return p


def _same(got: Any, want: Any) -> bool:
    """Equal, counting None and [] (vLLM's "none") as the same."""
    if want in (None, []) and got in (None, []):
        return True
    return got == want
