"""Backend-agnostic generation helpers: thought-by-thought generation and thought spans.

A *thought* is one reasoning step ending with a delimiter token sequence (default ``</thought>``,
kept in the tokens). :func:`generate_thoughts` samples one thought per backend call (METHODS.md
section 2), or all of them in one call that ends thoughts token by token; :func:`thought_spans`
recovers the thoughts of a token sequence at the token-id level.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

from creditlab.interfaces import GenerationBackend
from creditlab.step.stops import ThoughtWatch
from creditlab.types import Completion, GenerationRequest, SamplingParams, Spans, ThoughtConfig


def thought_spans(response_ids: Sequence[int], delimiter_ids: Sequence[int]) -> Spans:
    """Split a token sequence after each occurrence of the delimiter token sequence.

    Occurrences are matched left to right without overlap. Each span ends right after a
    delimiter occurrence, and tokens after the last one form a final span; spans partition
    ``[0, len(response_ids))`` (an empty sequence has no spans).

    Args:
        response_ids: (R,) token ids.
        delimiter_ids: (D,) ids of the delimiter, D >= 1.

    Returns:
        ``((start, end), ...)`` with end exclusive.
    """
    ids, delim = list(response_ids), list(delimiter_ids)
    d = len(delim)
    if d == 0:
        raise ValueError("delimiter_ids must not be empty")
    spans: list[tuple[int, int]] = []
    start, i, last = 0, 0, len(ids) - d
    first = delim[0]
    while i <= last:
        if ids[i] == first and (d == 1 or ids[i : i + d] == delim):
            spans.append((start, i + d))
            start = i = i + d
        else:
            i += 1
    if start < len(ids):
        spans.append((start, len(ids)))
    return tuple(spans)


def merge_eos_tail(spans: Spans, ids: Sequence[int], eos_id: int | None) -> Spans:
    """``spans`` with a final span holding only ``eos_id`` merged into the one before it.

    An EOS right after the last delimiter is not a thought of its own (a continuation from
    there, or a value estimate before it, would be meaningless).
    """
    if eos_id is None or len(spans) < 2:
        return spans
    a, b = spans[-1]
    if b - a == 1 and ids[a] == eos_id:
        return (*spans[:-2], (spans[-2][0], b))
    return spans


def completion_spans(
    completion: Completion, delimiter_ids: Sequence[int], eos_id: int | None = None
) -> Spans:
    """The thought spans of a completion: from its ``segment_ids`` when thought-by-thought
    generation recorded them (a capped thought without delimiter stays its own thought), else
    :func:`thought_spans` over its response ids; a trailing lone EOS joins the last thought."""
    seg, ids = completion.segment_ids, completion.response_ids
    if not seg:
        return merge_eos_tail(thought_spans(ids, delimiter_ids), ids, eos_id)
    spans, start = [], 0
    for i in range(1, len(seg) + 1):
        if i == len(seg) or seg[i] != seg[start]:
            spans.append((start, i))
            start = i
    return merge_eos_tail(tuple(spans), ids, eos_id)


def span_texts(tokenizer: object, ids: Sequence[int], spans: Spans) -> list[str]:
    """Decoded text of each span of ``ids`` (special tokens skipped, delimiters kept)."""
    return [
        tokenizer.decode(list(ids[a:b]), skip_special_tokens=True)  # type: ignore[attr-defined]
        for a, b in spans
    ]


def round_seed(seed: int, round_index: int) -> int:
    """The seed of thought round ``round_index`` (a 63-bit hash of ``seed`` and the round)."""
    digest = hashlib.blake2b(f"{seed}/{round_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class _Row:
    """Generation state of one request."""

    prompt_ids: tuple[int, ...]
    prefix_len: int
    ids: list[int]  # original prefix + thoughts generated so far
    segment_ids: list[int]
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] | None = field(default_factory=list)  # None once a round has none
    thought: int = 0  # index of the thought generated next
    partial: list[int] = field(default_factory=list)  # unfinished prefix thought, continued next
    finish: str | None = None


def _prefix_spans(req: GenerationRequest, delim: tuple[int, ...]) -> Spans:
    """The thought spans of a request's prefix: from ``prefix_segment_ids`` (a new span at each
    change of id) when given, else :func:`thought_spans`."""
    seg = req.prefix_segment_ids
    if seg is None:
        return thought_spans(req.prefix_ids, delim)
    if len(seg) != len(req.prefix_ids):
        raise ValueError(
            f"prefix_segment_ids has {len(seg)} entries for {len(req.prefix_ids)} prefix ids; "
            "give one thought index per prefix token (or None)"
        )
    cuts = [0] + [i for i in range(1, len(seg)) if seg[i] != seg[i - 1]] + [len(seg)]
    return tuple(pairwise(cuts)) if seg else ()


def _finished(
    last: list[int], req: GenerationRequest, tok: object, delim: tuple[int, ...], cfg: ThoughtConfig
) -> bool:
    """Whether the prefix's last thought ``last`` was finished: it ends with the delimiter ids or,
    with ``prefix_segment_ids``, its text holds the delimiter (the round's stop string) or it has
    ``max_thought_tokens`` tokens (capped). Shorter, it was cut inside a thought."""
    if tuple(last[-len(delim) :]) == delim:
        return True
    if req.prefix_segment_ids is None:
        return False
    text = tok.decode(last, skip_special_tokens=False)  # type: ignore[attr-defined]
    return len(last) >= cfg.max_thought_tokens or cfg.delimiter in text


def _start(
    req: GenerationRequest, tok: object, delim: tuple[int, ...], eos: int | None, cfg: ThoughtConfig
) -> _Row:
    prefix = list(req.prefix_ids)
    spans = _prefix_spans(req, delim)
    seg = [j for j, (a, b) in enumerate(spans) for _ in range(a, b)]
    row = _Row(tuple(req.prompt_ids), len(prefix), prefix, seg, thought=len(spans))
    if spans and not _finished(prefix[spans[-1][0] :], req, tok, delim, cfg):
        row.thought = len(spans) - 1  # the prefix ends mid-thought: continue that thought
        row.partial = prefix[spans[-1][0] :]
    if prefix and eos is not None and prefix[-1] == eos and cfg.end_at_eos:
        row.finish = "eos"
    elif row.thought >= cfg.max_thoughts:
        row.finish = "length"
    return row


def _take(row: _Row, out: Completion) -> list[int]:
    """Append a backend's continuation of ``row`` (its new ids, log-probs and entropies) to the
    row; returns the new ids."""
    if tuple(out.response_ids[: len(row.ids)]) != tuple(row.ids):
        raise RuntimeError("backend changed the prefix ids of a continuation")
    new = list(out.response_ids[len(row.ids) :])
    row.ids.extend(new)
    row.logprobs.extend(out.logprobs)
    if row.entropies is not None and out.entropies is not None:
        row.entropies.extend(out.entropies)
    else:
        row.entropies = None
    return new


def _one_pass(
    backend: GenerationBackend, active: list[_Row], sampling: SamplingParams, cfg: ThoughtConfig, base_seed: int
) -> None:
    """Decode every thought of the ``active`` rows in one ``generate_watched`` call, a
    :class:`~creditlab.step.stops.ThoughtWatch` ending thoughts and rows (``decoding="one_pass"``).
    Its budget is what the thought caps allow, at most up to the model's context: a chain that
    reaches the context ends there with ``"length"`` (the rounds raise the context error)."""
    if not backend.watches:
        raise ValueError(f"{type(backend).__name__} cannot decode thoughts in one pass (it has no "
                         "generate_watched): use rollout.thought_decoding=rounds, or the hf backend")
    if not active:
        return
    watch = ThoughtWatch(backend.tokenizer, cfg, [(row.thought, row.partial) for row in active])
    budget = max(cfg.max_thoughts - row.thought for row in active) * cfg.max_thought_tokens
    context = getattr(getattr(getattr(backend, "model", None), "config", None), "max_position_embeddings", None)
    room = context - max(len(row.prompt_ids) + len(row.ids) for row in active) if context else budget
    budget = min(budget, room) if room >= 1 else budget  # a chain ends at the model's context ("length")
    params = replace(sampling, max_new_tokens=budget, stop=(), seed=round_seed(base_seed, 0))
    outs = backend.generate_watched(
        [GenerationRequest(row.prompt_ids, tuple(row.ids)) for row in active], params, watch)
    for i, (row, out) in enumerate(zip(active, outs, strict=True)):
        new = _take(row, out)
        row.segment_ids.extend(watch.segment_ids(i, row.thought, len(new)))
        row.finish = out.finish_reason


def generate_thoughts(
    backend: GenerationBackend,
    requests: Sequence[GenerationRequest],
    sampling: SamplingParams,
    cfg: ThoughtConfig | None = None,
) -> list[Completion]:
    """Generate responses thought by thought.

    With ``cfg.decoding == "rounds"`` (the default), each round calls ``backend.generate`` once
    on the still-active requests, continuing from
    ``prompt_ids`` + (the request's ``prefix_ids`` + thoughts so far) with ``stop=(delimiter,)``
    and ``max_new_tokens=max_thought_tokens`` (``sampling``'s temperature/top-p/top-k are kept,
    its ``max_new_tokens`` is ignored). Round r is seeded with ``round_seed(sampling.seed, r)``
    (a fresh random base seed when ``sampling.seed`` is None). A row ends at EOS
    (``finish_reason="eos"``; with ``end_at_eos=False`` the next thought follows the EOS), once a
    thought contains ``final_marker`` (``"stop"``), or once it holds ``max_thoughts`` thoughts
    (``"length"``). With ``"one_pass"``, one ``backend.generate_watched`` call applies the same
    rules token by token (:class:`~creditlab.step.stops.ThoughtWatch`; seeded with round 0's
    seed): each row's tokens have the same distribution, drawn otherwise.

    Args:
        backend: Any generation backend (only ``generate`` and ``tokenizer`` are used).
        requests: N requests; ``prefix_ids`` (a prefix to continue) are kept exactly. The
            prefix's thoughts come from ``prefix_segment_ids`` when given (pass the seed's
            segment ids: a thought capped without delimiter stays one thought), else from its
            delimiters. Its last thought is continued when it was cut inside a thought (no
            delimiter and, with segment ids, fewer than ``max_thought_tokens`` tokens).
        sampling: Sampling settings; ``sampling.stop`` must be empty.
        cfg: Thought settings (defaults: :class:`ThoughtConfig`).

    Returns:
        N completions in request order: ``response_ids`` = prefix + all new thoughts (R,),
        ``logprobs`` and ``entropies`` of the new tokens (R - prefix_len,; entropies None when a
        round's backend output had none), ``segment_ids`` (R,) the thought index
        of each token (prefix tokens: their thought from ``prefix_segment_ids``, renumbered
        from 0, or else the number of delimiters before them, as :func:`thought_spans`; each
        round after that is one thought, so a capped thought without delimiter is its own
        segment here although ``thought_spans`` would merge it with the next),
        ``prefix_len`` = len(request prefix).
    """
    cfg = cfg if cfg is not None else ThoughtConfig()
    if not cfg.delimiter:
        raise ValueError("ThoughtConfig.delimiter must be a non-empty string")
    if cfg.max_thoughts < 1 or cfg.max_thought_tokens < 1:
        raise ValueError(
            f"max_thoughts and max_thought_tokens must be >= 1, got {cfg.max_thoughts}, "
            f"{cfg.max_thought_tokens}"
        )
    if cfg.decoding not in ("rounds", "one_pass"):
        raise ValueError(f"ThoughtConfig.decoding must be rounds or one_pass, got {cfg.decoding!r}")
    if sampling.stop:
        raise ValueError(
            "generate_thoughts sets the stop string itself (the delimiter); "
            f"got stop={sampling.stop}"
        )
    tok = backend.tokenizer
    delim = tuple(tok.encode(cfg.delimiter, add_special_tokens=False))
    if not delim:
        raise ValueError(f"delimiter {cfg.delimiter!r} encodes to no tokens")
    eos = tok.eos_token_id
    base_seed = sampling.seed if sampling.seed is not None else secrets.randbits(63)
    rows = [_start(r, tok, delim, eos, cfg) for r in requests]
    if cfg.decoding == "one_pass":
        _one_pass(backend, [row for row in rows if row.finish is None], sampling, cfg, base_seed)

    round_index = 0
    while active := [row for row in rows if row.finish is None]:
        params = replace(
            sampling,
            max_new_tokens=cfg.max_thought_tokens,
            stop=(cfg.delimiter,),
            seed=round_seed(base_seed, round_index),
        )
        outs = backend.generate(
            [GenerationRequest(row.prompt_ids, tuple(row.ids)) for row in active], params
        )
        if len(outs) != len(active):
            raise RuntimeError(f"backend returned {len(outs)} completions for {len(active)}")
        for row, out in zip(active, outs):
            new = _take(row, out)
            row.segment_ids.extend([row.thought] * len(new))
            text = tok.decode(row.partial + new, skip_special_tokens=True)
            row.partial = []
            row.thought += 1
            if out.finish_reason == "eos" and cfg.end_at_eos:
                row.finish = "eos"
            elif cfg.final_marker and cfg.final_marker in text:
                row.finish = "stop"
            elif row.thought >= cfg.max_thoughts:
                row.finish = "length"
        round_index += 1

    texts = tok.batch_decode(
        [row.ids for row in rows], skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    return [
        Completion(
            prompt_ids=row.prompt_ids,
            response_ids=tuple(row.ids),
            logprobs=tuple(row.logprobs),
            entropies=tuple(row.entropies) if row.entropies is not None else None,
            finish_reason=row.finish or "length",
            text=text,
            prefix_len=row.prefix_len,
            segment_ids=tuple(row.segment_ids),
        )
        for row, text in zip(rows, texts)
    ]
