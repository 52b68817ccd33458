"""Micro-batches by tokens, not only rows: the rows of a mini-batch sorted by length and packed
under a token budget, and every micro-batch cut to its own longest prompt and response, so the
update computes (almost) no padding.

A rollout batch is as wide as its longest prompt plus its longest response (prompts left-padded,
responses right-padded: :class:`~creditlab.types.RolloutBatch`); a micro-batch of shorter rows
drawn from it carries columns that are padding in every one of its rows. :func:`columns` finds
the columns a micro-batch needs, :func:`pack_rows` groups rows of similar length so that few are
needed (the idea of verl's dynamic batch size, ``use_dynamic_bsz``; no code taken from it).

Cutting columns that are padding in every row changes no value: a padded key is masked out of
every attention row, and the loss masks padded positions; the sums run over other shapes, so
results agree to float rounding. The loss denominators are the mini-batch's, computed before any
micro-batch (:class:`~creditlab.step.aggregation.MiniBatchStats`), so the packing does not change
the loss either.
"""

from __future__ import annotations

import torch

__all__ = ["columns", "pack_rows"]


def pack_rows(
    rows: torch.Tensor, prompt_lens: torch.Tensor, response_lens: torch.Tensor,
    max_rows: int = 0, max_tokens: int = 0,
) -> list[torch.Tensor]:
    """The micro-batches of a mini-batch's ``rows``.

    Args:
        rows: (n,) long, the mini-batch's row indices, in the order the update drew them.
        prompt_lens: (n,) the rows' real prompt tokens.
        response_lens: (n,) the rows' real response tokens.
        max_rows: Rows per micro-batch at most (0: no limit).
        max_tokens: Padded tokens per micro-batch at most, ``rows x (longest prompt + longest
            response)`` (0: no token budget). A row longer than the budget goes alone.

    Returns:
        Non-empty (b,) index tensors covering ``rows`` once each. Without a token budget:
        consecutive runs of ``max_rows`` in the given order (the whole mini-batch when
        ``max_rows`` is 0). With one: the rows sorted longest response first (then longest
        prompt; stable) and filled greedily;
        when they all fit in one micro-batch, that micro-batch keeps the given order.
    """
    n = len(rows)
    if n == 0:
        return []
    if max_tokens <= 0:
        return list(torch.split(rows, max_rows or n))
    p, r = prompt_lens.long().tolist(), response_lens.long().tolist()
    if n * (max(p) + max(r)) <= max_tokens and (max_rows <= 0 or n <= max_rows):
        return [rows]
    # by response length, then prompt length (stable: ties keep the drawn order): a micro-batch's
    # padded response positions are what the head and the backward pay for; prompts are shared
    order = sorted(range(n), key=lambda i: (-r[i], -p[i]))
    out, current, wp, wr = [], [], 0, 0
    for i in order:
        np_, nr = max(wp, p[i]), max(wr, r[i])
        full = max_rows > 0 and len(current) >= max_rows
        if current and (full or (len(current) + 1) * (np_ + nr) > max_tokens):
            out.append(rows[current])
            current, np_, nr = [], p[i], r[i]
        current.append(i)
        wp, wr = np_, nr
    out.append(rows[current])
    return out


def columns(prompt_len: int, prompt_lens: torch.Tensor, response_lens: torch.Tensor) -> tuple[int, int]:
    """``(start, width)`` of the response-bearing columns a micro-batch needs: its input columns are
    ``[start, prompt_len + width)`` (``start = prompt_len -`` its longest prompt) and its response
    positions ``[0, width)`` (its longest response, at least 1).

    Args:
        prompt_len: The batch's prompt width P.
        prompt_lens: (b,) the micro-batch's real prompt tokens.
        response_lens: (b,) the micro-batch's real response tokens.
    """
    longest_prompt = int(prompt_lens.max()) if len(prompt_lens) else prompt_len
    width = max(int(response_lens.max()) if len(response_lens) else 1, 1)
    return prompt_len - longest_prompt, width
