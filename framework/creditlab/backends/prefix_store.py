"""Keys/values of sequences the HF backend decoded, kept for later calls that continue them.

Thought-by-thought generation calls the backend once per thought, each time with the whole
sequence so far; resets and Monte-Carlo continuations start from prefixes of earlier rollouts.
Without a store every such call prefills its whole context again. With it, the backend keeps the
keys/values of each decoded row (the context and every generated token but the last, which was
never fed), and a later request prefills only what no stored sequence shares with it: its
context's longest common prefix with any stored sequence is taken from the store (at most all
but the context's last token, whose logits the prefill must compute), when that prefix covers the
stored sequence's whole context and so continues what that row generated. When only that last
token is new for every context of a batch (the common case: a next thought, a reset, a
continuation), no prefill runs: the token is fed as the first decoding step (:func:`feed_last`).
A context that only shares a prompt with a stored one (a second call on the same prompts, e.g. an
evaluation's samples after its greedy pass) is prefilled as without a store, so such calls sample
exactly as before.

Keys/values at a position depend only on the tokens up to it, so a stored prefix is the
prefill's own result up to float rounding (it was computed by the decoding steps, in another
batch shape). The backend empties the store when the weights change (a ``generate`` call finds
the parameters' versions moved) and in ``release()``, before every update; it holds at most
``budget_mb``: the oldest sequences leave first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from creditlab.backends.kv_cache import make_cache, plain_kv

__all__ = ["PrefixStore", "feed_last", "keep_rows", "past_cache"]


@dataclass(frozen=True)
class Stored:
    """One decoded sequence: ``tokens`` (L + 1,), of which the first ``context`` were its
    request's context, and the keys/values of its first L positions, ``kv`` (layers, 2, H_kv, L,
    D)."""

    tokens: tuple[int, ...]
    context: int
    kv: torch.Tensor


class PrefixStore:
    """The stored sequences, oldest first, within ``budget_mb``."""

    def __init__(self, budget_mb: float) -> None:
        self.budget = budget_mb * 2**20
        self.entries: deque[Stored] = deque()
        self.bytes = 0

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def add(self, tokens: tuple[int, ...], context: int, kv: torch.Tensor) -> None:
        """Keep ``tokens`` (its first ``context`` the request's context) with ``kv`` (layers, 2,
        H_kv, len(tokens) - 1, D), evicting the oldest sequences beyond the budget (a sequence
        larger than the whole budget, or with nothing generated, is not kept)."""
        size = kv.nbytes
        if size > self.budget or len(tokens) <= context:
            return
        while self.entries and self.bytes + size > self.budget:
            self.bytes -= self.entries.popleft().kv.nbytes
        self.entries.append(Stored(tokens, context, kv))
        self.bytes += size

    def match(self, contexts: list[tuple[int, ...]]) -> list[tuple[int, Stored | None]]:
        """Per context: ``(n, entry)``, the longest reusable prefix (n positions of ``entry``'s
        keys/values, ``entry.context <= n <= len(context) - 1``) over every stored sequence, or
        ``(0, None)``."""
        if not self.entries:
            return [(0, None)] * len(contexts)
        width = max(len(e.tokens) for e in self.entries)
        host = torch.device("cpu")  # token ids are matched on the host
        stored = torch.full((len(self.entries), width), -1, dtype=torch.long, device=host)
        for i, e in enumerate(self.entries):
            stored[i, : len(e.tokens)] = torch.tensor(e.tokens, device=host)
        usable = torch.tensor([len(e.tokens) - 1 for e in self.entries], device=host)
        least = torch.tensor([e.context for e in self.entries], device=host)
        out = []
        for c in contexts:
            m = min(len(c), width)
            same = stored[:, :m] == torch.tensor(c[:m], device=host)
            common = same.long().cumprod(1).sum(1)  # longest common prefix with each entry
            reuse = torch.minimum(common, usable).clamp_max(len(c) - 1)
            reuse = torch.where(reuse >= least, reuse, 0)  # continues a stored row's generation
            best = int(reuse.argmax())
            n = int(reuse[best])
            out.append((n, self.entries[best]) if n > 0 else (0, None))
        return out


def past_cache(
    cache: Any, matches: list[tuple[int, Stored | None]], contexts: list[tuple[int, ...]],
    pad: int, device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Write the reused keys/values of U contexts into ``cache`` (a fresh, preallocated one);
    return the prefill's ``(input_ids, attention_mask, position_ids)`` for the rest.

    Layout of each row: ``[padding | reused prefix (n) | padding | suffix (len(c) - n)]``, P + S
    columns, P = the longest reused prefix, S the longest suffix; the mask is 1 on reused and
    suffix positions only. Returns ids (U, S), mask (U, P + S) and positions (U, S).
    """
    p = max(n for n, _ in matches)
    s = max(len(c) - n for c, (n, _) in zip(contexts, matches))
    first = next(e for _, e in matches if e is not None).kv
    layers, _, h, _, d = first.shape
    past = first.new_zeros((layers, 2, len(contexts), h, p, d))
    ids = torch.full((len(contexts), s), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(contexts), p + s), dtype=torch.long, device=device)
    pos = torch.zeros((len(contexts), s), dtype=torch.long, device=device)
    for u, (c, (n, entry)) in enumerate(zip(contexts, matches)):
        if n:
            past[:, :, u, :, p - n :] = entry.kv[:, :, :, :n]
            mask[u, p - n : p] = 1
        rest = c[n:]
        ids[u, s - len(rest) :] = torch.tensor(rest, device=device)
        mask[u, p + s - len(rest) :] = 1
        pos[u, s - len(rest) :] = torch.arange(n, len(c), device=device)
    for i, layer in enumerate(cache.layers):
        layer.update(past[i, 0], past[i, 1])
    return ids, mask, pos


def feed_last(
    decoder: Any, model: Any, matches: list[tuple[int, Stored | None]],
    contexts: list[tuple[int, ...]], inverse: torch.Tensor, pad: int, device: torch.device,
    max_new: int, min_shared: int,
) -> torch.Tensor | None:
    """Start ``decoder`` (a :class:`~creditlab.accel.fused_decode.FusedDecoder`) without a
    prefill when each of the U distinct ``contexts`` is a stored prefix and one token more (the
    next round of a thought-by-thought row, a reset, a continuation): the stored keys/values
    become its context and that last token is fed as its first decoding step, which computes the
    token's keys/values and the logits a prefill would have (``max_new`` steps allocated, this
    one included). Returns those logits, (A, V) with ``inverse`` (A,) the context of each row, or
    ``None`` when some context needs a prefill (nothing stored for it, or more than one token
    new)."""
    if any(n == 0 or len(c) - n != 1 for c, (n, _) in zip(contexts, matches)):
        return None
    cache = make_cache(model, max(n for n, _ in matches), True)
    ids, mask, pos = past_cache(cache, matches, contexts, pad, device)
    if not plain_kv(cache):
        return None
    real = mask[:, :-1].bool()  # (U, P): the stored positions of each row
    decoder.start(cache, inverse, None if bool(real.all()) else real, max_new, min_shared)
    return decoder.step(ids[inverse, 0], pos[inverse, 0])


def keep_rows(store: PrefixStore, decoder: Any, rows: torch.Tensor, which: torch.Tensor | None,
              contexts: list[tuple[int, ...]], out_tokens: torch.Tensor, ended_at: torch.Tensor,
              lead: int = 0) -> None:
    """Store the batch rows ``which`` ((A,) bool; None: all) of ``decoder`` (a
    :class:`~creditlab.accel.fused_decode.FusedDecoder`): batch row b holds request ``rows[b]``,
    whose context is ``contexts[rows[b]]`` and response ``out_tokens[rows[b], :ended_at[rows[b]]]``;
    its keys/values cover all but the response's last token (never fed). ``lead``: context tokens
    the decoder fed as steps before the response's (1 after :func:`feed_last`, else 0)."""
    batch = torch.arange(len(rows), device=rows.device) if which is None else which.nonzero().squeeze(1)
    req = rows[batch].tolist()
    for b, r, end in zip(batch.tolist(), req, ended_at[rows[batch]].tolist()):
        if end > 0:
            response = tuple(out_tokens[r, :end].tolist())
            c = contexts[r]
            store.add(tuple(c) + response, len(c), decoder.row_kv(b, end - 1 + lead))
