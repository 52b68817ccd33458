"""The vLLM backend's per-request settings and results, built without the engine: each request's
seed, the ``vllm.SamplingParams`` read back against what was asked (TESTING.md trap 7), vLLM's
finish reasons in creditlab's words, the completions and the head sizes its CPU attention
takes."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

from creditlab.errors import InputError
from creditlab.types import Completion, GenerationRequest, SamplingParams

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


def check_head_size(config: Any) -> None:
    """On CPU, refuse a head size vLLM's CPU attention lacks, naming the supported ones."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise InputError(
            f"vLLM's CPU attention supports head sizes {sizes}; this model has {head} "
            f"(hidden_size / num_attention_heads). Use backend=hf, or a model with a "
            f"supported head size."
        )


def completions(tokenizer: Any, requests: Sequence[GenerationRequest], rows: Sequence[tuple]) -> list[Completion]:
    """Completions from ``(generated ids, log-probs, finish reason, entropies or None)`` per
    request; the text is ``decode(response_ids, skip_special_tokens=True)`` as the HF backend's."""
    responses = [tuple(r.prefix_ids) + row[0] for r, row in zip(requests, rows)]
    texts = tokenizer.batch_decode([list(x) for x in responses], skip_special_tokens=True,
                                   clean_up_tokenization_spaces=False)
    return [
        Completion(prompt_ids=tuple(r.prompt_ids), response_ids=resp, logprobs=logps, entropies=ents,
                   finish_reason=reason, text=text, prefix_len=len(r.prefix_ids))
        for r, resp, text, (_, logps, reason, ents) in zip(requests, responses, texts, rows)
    ]
