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


#: The fixed cost of one more micro-batch (the layers' launches, whatever of a forward and
#: backward does not scale with tokens), in positions: what a cut must save to be worth it. 0,
#: measured: on SmolLM2-135M on a 2-core CPU, 15 micro-batches of one batch updated no slower
#: than the 5 of the fewest that fit (38.6 against 40.3 s, within noise; benchmarks/README.md,
#: "update_packing.py"). Ties go to fewer micro-batches. A device with a larger fixed cost per
#: call (a GPU's kernel launches) would want more.
MICRO_BATCH_COST = 0


def pack_rows(
    rows: torch.Tensor, prompt_lens: torch.Tensor, response_lens: torch.Tensor,
    max_rows: int = 0, max_tokens: int = 0, prompt_keys: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """The micro-batches of a mini-batch's ``rows``.

    Args:
        rows: (n,) long, the mini-batch's row indices, in the order the update drew them.
        prompt_lens: (n,) the rows' real prompt tokens.
        response_lens: (n,) the rows' real response tokens.
        max_rows: Rows per micro-batch at most (0: no limit).
        max_tokens: Padded tokens per micro-batch at most, ``rows x (longest prompt + longest
            response)`` (0: no token budget). A row longer than the budget goes alone.
        prompt_keys: (n,) long, equal for rows with the same prompt (a micro-batch runs each
            distinct prompt once), or None: every prompt distinct.

    Returns:
        Non-empty (b,) index tensors covering ``rows`` once each. Without a token budget:
        consecutive runs of ``max_rows`` in the given order (the whole mini-batch when
        ``max_rows`` is 0). With one: the rows sorted longest response first (then longest
        prompt; stable) and cut where the positions computed are fewest (:func:`_partition`);
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
    keys = list(range(n)) if prompt_keys is None else prompt_keys.long().tolist()
    # by response length, then prompt length (stable: ties keep the drawn order): a micro-batch's
    # padded response positions are what the head and the backward pay for
    order = sorted(range(n), key=lambda i: (-r[i], -p[i]))
    cuts = _partition([p[i] for i in order], [r[i] for i in order], [keys[i] for i in order], max_rows, max_tokens)
    return [rows[order[a:b]] for a, b in zip(cuts, cuts[1:])]


def _partition(p: list[int], r: list[int], keys: list[int], max_rows: int, max_tokens: int) -> list[int]:
    """Cut points ``0 = c_0 < ... < c_k = n`` of rows sorted by response length (``r``
    non-increasing) into micro-batches whose padded tokens ``size x (longest prompt + longest
    response)`` stay within ``max_tokens`` (a single row always goes), computing the fewest
    positions: each distinct prompt (``keys``) once at the run's longest prompt, each row at the
    run's longest response, plus :data:`MICRO_BATCH_COST` a micro-batch; ties go to fewer
    micro-batches. Dynamic programming over contiguous runs of the sorted rows, each run grown
    backwards until it no longer fits (its size and both lengths only grow)."""
    n = len(r)
    best: list[tuple[int, int]] = [(0, 0)] + [(2**62, 0)] * n  # (positions + cost, micro-batches)
    back = [0] * (n + 1)
    for i in range(1, n + 1):  # the last run is rows [j, i)
        longest_prompt, prompts = 0, set()
        for j in range(i - 1, -1, -1):
            longest_prompt, size = max(longest_prompt, p[j]), i - j
            prompts.add(keys[j])
            if size > 1 and (size * (longest_prompt + r[j]) > max_tokens or 0 < max_rows < size):
                break
            positions = len(prompts) * longest_prompt + size * r[j] + MICRO_BATCH_COST
            cand = (best[j][0] + positions, best[j][1] + 1)
            if cand < best[i]:
                best[i], back[i] = cand, j
    cuts = [n]
    while cuts[-1] > 0:
        cuts.append(back[cuts[-1]])
    return cuts[::-1]


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
