"""Alignment of two responses over token ids, for IBPO (arXiv 2605.16302; METHODS.md §4).

[paper] IBPO's credit concentrates on the tokens where an incorrect trajectory differs from a
correct one. [ours] "Differs" is read off a ``difflib.SequenceMatcher`` alignment
(``autojunk=False``, no junk function, so the result depends only on the two id sequences and is
deterministic) over token ids, never re-tokenized text:

* ``token`` granularity: one alignment of the two id sequences; the tokens inside its matching
  blocks are *matched*.
* ``segment`` granularity: first an alignment of the two segment sequences, a segment being the
  tuple of its token ids (two segments are equal only when identical). Segments in ``equal`` runs
  are matched whole; each ``replace`` run (some segments of ``a`` against some of ``b``) is then
  aligned at token level as above; deleted or inserted segments are unmatched. With one segment
  per response (``segmenter=whole``) this is the token granularity.

``min_match`` drops token-level matching blocks shorter than it (1 keeps all of them); with a
character-level tokenizer, single-token matches inside otherwise different text are mostly chance.
Whole equal segments are always matched.

Every function returns the matched masks of *both* sequences from one alignment, so a pair is
aligned once and the two masks describe the same matched token pairs.
"""

from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

Spans = Sequence[tuple[int, int]]


def token_matches(
    a: Sequence[int], b: Sequence[int], min_match: int = 1
) -> tuple[list[bool], list[bool]]:
    """Matched tokens of ``a`` and ``b`` in their token-level alignment.

    Args:
        a: (La,) token ids.
        b: (Lb,) token ids.
        min_match: Matching blocks shorter than this many tokens count as unmatched.

    Returns:
        ``(matched_a, matched_b)``: La and Lb booleans.
    """
    ma, mb = [False] * len(a), [False] * len(b)
    if not a or not b:
        return ma, mb
    sm = SequenceMatcher(None, list(a), list(b), autojunk=False)
    for i, j, size in sm.get_matching_blocks():
        if size and size >= min_match:
            ma[i : i + size] = [True] * size
            mb[j : j + size] = [True] * size
    return ma, mb


def _check_spans(spans: Spans, n: int) -> None:
    end = 0
    for start, stop in spans:
        if start != end or stop <= start:
            raise ValueError(f"segment spans {tuple(spans)} do not partition [0, {n})")
        end = stop
    if end != n:
        raise ValueError(f"segment spans {tuple(spans)} do not partition [0, {n})")


def segment_matches(
    a: Sequence[int], a_spans: Spans, b: Sequence[int], b_spans: Spans, min_match: int = 1
) -> tuple[list[bool], list[bool]]:
    """Matched tokens of ``a`` and ``b``: segments first, tokens within differing segments.

    Args:
        a: (La,) token ids.
        a_spans: Segments of ``a``, ``(start, end)`` spans partitioning ``[0, La)``.
        b: (Lb,) token ids.
        b_spans: Segments of ``b``, partitioning ``[0, Lb)``.
        min_match: As :func:`token_matches`, for the token-level alignments.

    Returns:
        ``(matched_a, matched_b)``: La and Lb booleans.

    Raises:
        ValueError: Spans that do not partition their sequence.
    """
    ma, mb = [False] * len(a), [False] * len(b)
    if not a or not b:
        return ma, mb
    _check_spans(a_spans, len(a))
    _check_spans(b_spans, len(b))
    seg_a = [tuple(a[s:e]) for s, e in a_spans]
    seg_b = [tuple(b[s:e]) for s, e in b_spans]
    sm = SequenceMatcher(None, seg_a, seg_b, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("delete", "insert"):
            continue
        lo_a, hi_a = a_spans[i1][0], a_spans[i2 - 1][1]
        lo_b, hi_b = b_spans[j1][0], b_spans[j2 - 1][1]
        if tag == "equal":
            ma[lo_a:hi_a] = [True] * (hi_a - lo_a)
            mb[lo_b:hi_b] = [True] * (hi_b - lo_b)
        else:  # replace: token level inside the run
            sub_a, sub_b = token_matches(a[lo_a:hi_a], b[lo_b:hi_b], min_match)
            ma[lo_a:hi_a] = sub_a
            mb[lo_b:hi_b] = sub_b
    return ma, mb


def align(
    a: Sequence[int],
    b: Sequence[int],
    a_spans: Spans | None = None,
    b_spans: Spans | None = None,
    min_match: int = 1,
) -> tuple[list[bool], list[bool]]:
    """:func:`segment_matches` when both span tuples are given, else :func:`token_matches`."""
    if a_spans is not None and b_spans is not None:
        return segment_matches(a, a_spans, b, b_spans, min_match)
    return token_matches(a, b, min_match)


def similarity(matched_a: Sequence[bool], matched_b: Sequence[bool]) -> float:
    """``2 M / (La + Lb)`` with M matched tokens (difflib's ``ratio`` for the same alignment);
    1.0 for two empty sequences."""
    total = len(matched_a) + len(matched_b)
    return (sum(matched_a) + sum(matched_b)) / total if total else 1.0
