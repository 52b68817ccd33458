"""The ``keyword_entropy`` segmenter of RREDCoT — "Segment-Level Reward Redistribution for
Reasoning Models", arXiv 2606.06475 (METHODS.md §5).

[paper] Reasoning chains are split into segments by keywords plus token entropy. [ours] The
concrete rules, none of which the paper's abstract pins down:

* **Delimiters** (``delimiters``, default ``</thought>`` and a blank line ``"\\n\\n"``): a segment
  ends right after the token that completes an occurrence (the delimiter stays in the segment it
  closes, as in the ``thought`` segmenter).
* **Reflection keywords** (``keywords``, "Wait", "Alternatively", "Let me check", "But", "Hmm",
  ...): a segment starts at the token where a keyword starts. Matching is on the decoded text,
  case-sensitive, on whole words (the characters around the keyword are not letters or digits,
  so "But" does not match "Butter" nor "Wait" "Await"), and only where the keyword starts at a
  token boundary — the token holding its first character has nothing but whitespace before it
  (``" Wait"`` in byte-level BPE, ``"▁Wait"`` in SentencePiece). With a character-level tokenizer
  a keyword spans many tokens; only its first token starts the segment.
* **Uncertain tokens**: a segment starts at every token whose score exceeds the
  ``entropy_quantile`` of the row's scores (strictly, so a constant row gives none; ``null``
  turns this off). The score (``score``) is the policy's predictive entropy at that token
  (``Completion.entropies``: both backends record it, at the sampling temperature before
  top-p/top-k; vLLM's from its top-k log-probs, see its backend) and, for a completion without
  entropies, the **surprisal** ``-log p`` of the sampled token from ``batch.gen_logprobs``
  (``score: auto``); ``entropy`` requires entropies, ``surprisal`` always uses the surprisal.
  Reset-prefix tokens have no entropies nor generation log-probs and are never entropy
  boundaries. The card (docs/methods/rredcot.md) compares both scores on the embedded task.
* **Priorities and minimum length**: candidates are taken in the order delimiters (by position),
  keywords (by position), uncertain tokens (highest score first); one is kept only if it is at
  least ``min_segment_tokens`` from every kept boundary and from both ends of the response, and
  while fewer than ``max_segments`` segments exist (0 = no cap). Trailing special tokens (EOS)
  never start a segment, so they join the last one.

Token text: each id is decoded once (cached) after an anchor token (``"a"``) so tokenizers that
drop a leading space when a token is decoded alone (SentencePiece) keep it; the response text is
the concatenation of the pieces, which fixes every token's character offsets.

Spans partition ``[0, response_mask[i].sum())`` exactly; padding is never looked at.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from creditlab import ConfigError, Mean, RolloutBatch, Segmenter, Segments, Spans

DEFAULT_DELIMITERS = ("</thought>", "\n\n")
SCORES = ("auto", "entropy", "surprisal")
DEFAULT_KEYWORDS = (
    "Wait", "Alternatively", "Let me check", "Let me verify", "Let me double-check", "But", "Hmm",
    "Actually", "However", "Hold on",
)


def _str_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"segmenter.{where} must be a list of strings; got {value!r}")
    out = list(value)
    if not all(isinstance(v, str) and v for v in out):
        raise ConfigError(f"segmenter.{where} must hold non-empty strings; got {out!r}")
    return out


def spans_from_boundaries(boundaries: Sequence[int], length: int) -> Spans:
    """Spans ``[(0, b1), (b1, b2), ..., (bk, length)]`` from sorted boundaries in ``(0, length)``.

    An empty response gets ``((0, 0),)``, as the ``whole`` segmenter gives it.
    """
    cuts = [0, *boundaries, length]
    return tuple((a, b) for a, b in zip(cuts, cuts[1:])) if length > 0 else ((0, 0),)


class KeywordEntropySegmenter(Segmenter):
    """Segments at delimiters, before reflection keywords and before uncertain tokens."""

    @dataclass
    class Config:
        """Attributes:
        delimiters: Texts that end a segment (the delimiter stays in it).
        keywords: Texts that start a segment (whole words, at a token boundary, case-sensitive).
        entropy_quantile: A token whose score exceeds this quantile of its row's scores starts a
            segment; ``None`` turns uncertainty boundaries off.
        min_segment_tokens: No boundary closer than this to another or to either end.
        max_segments: At most this many segments per response (0 = no cap); each costs one
            value row per candidate answer in the ``rredcot`` estimator.
        score: Uncertainty score: ``auto`` (the completion's entropies, else the surprisal),
            ``entropy`` (entropies required) or ``surprisal`` (``-log p`` of the sampled token).
        """

        delimiters: list[str] = field(default_factory=lambda: list(DEFAULT_DELIMITERS))
        keywords: list[str] = field(default_factory=lambda: list(DEFAULT_KEYWORDS))
        entropy_quantile: float | None = 0.9
        min_segment_tokens: int = 4
        max_segments: int = 0
        score: str = "auto"

        def __post_init__(self) -> None:
            self.delimiters = _str_list(self.delimiters, "delimiters")
            self.keywords = _str_list(self.keywords, "keywords")
            q = self.entropy_quantile
            if q is not None and not 0.0 <= q <= 1.0:
                raise ConfigError(
                    f"segmenter.entropy_quantile must be in [0, 1] or null; got {q!r}"
                )
            if self.min_segment_tokens < 1:
                raise ConfigError(
                    f"segmenter.min_segment_tokens must be >= 1; got {self.min_segment_tokens}"
                )
            if self.max_segments < 0:
                raise ConfigError(f"segmenter.max_segments must be >= 0; got {self.max_segments}")
            if self.score not in SCORES:
                raise ConfigError(f"segmenter.score must be one of {SCORES}; got {self.score!r}")

    def __init__(self, config: Config | None = None, *, tokenizer: Any = None) -> None:
        super().__init__(config, tokenizer=tokenizer)
        self._pieces: dict[int, str] = {}
        self._anchor: tuple[list[int], str] | None = None
        self._totals: dict[str, float] = {}

    # ----------------------------------------------------------------------------- token text
    def _piece(self, token_id: int) -> str:
        """The text token ``token_id`` contributes inside a sequence (leading space kept)."""
        if token_id not in self._pieces:
            tok = self.tokenizer
            if self._anchor is None:
                ids = list(tok.encode("a", add_special_tokens=False))
                self._anchor = (ids, self._decode(ids)) if len(ids) == 1 else ([], "")
            anchor_ids, anchor_text = self._anchor
            text = self._decode([*anchor_ids, token_id])
            if anchor_ids and text.startswith(anchor_text):
                text = text[len(anchor_text):]
            elif anchor_ids:
                text = self._decode([token_id])
            self._pieces[token_id] = text
        return self._pieces[token_id]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    # ------------------------------------------------------------------------ candidates
    def text_boundaries(self, ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Delimiter and keyword boundaries of one response.

        Args:
            ids: (n,) response token ids (no padding).

        Returns:
            ``(delimiter_boundaries, keyword_boundaries)``: token positions in ``[0, n]`` where a
            segment starts, ascending, possibly including 0 and n (filtered by the caller).
        """
        pieces = [self._piece(int(i)) for i in ids]
        starts, pos = [], 0
        for p in pieces:
            starts.append(pos)
            pos += len(p)
        text = "".join(pieces)

        def token_at(char: int) -> int:
            return bisect.bisect_right(starts, char) - 1

        delims = set()
        for d in self.config.delimiters:
            i = text.find(d)
            while i >= 0:
                delims.add(token_at(i + len(d) - 1) + 1)
                i = text.find(d, i + len(d))
        keywords = set()
        for kw in self.config.keywords:
            i = text.find(kw)
            while i >= 0:
                end = i + len(kw)
                whole = (i == 0 or not text[i - 1].isalnum()) and (
                    end == len(text) or not text[end].isalnum()
                )
                j = token_at(i)
                if whole and text[starts[j]:i].strip() == "":
                    keywords.add(j)
                i = text.find(kw, i + 1)
        return sorted(delims), sorted(keywords)

    def token_scores(self, batch: RolloutBatch, row: int, n: int) -> tuple[torch.Tensor, bool]:
        """Uncertainty score per response token of ``row`` and whether it is an entropy.

        Returns:
            ``(scores (n,) float64 with NaN on unscored tokens, from_entropies)``: the
            completion's ``entropies`` when present (and ``score`` is not ``surprisal``), else
            the surprisal ``-gen_logprobs`` of the generated tokens (reset-prefix tokens
            unscored).
        """
        c = batch.trajectories[row].completion
        scores = torch.full((n,), float("nan"), dtype=torch.float64, device="cpu")
        entropies = c.entropies if self.config.score != "surprisal" else None
        if entropies is None and self.config.score == "entropy":
            raise ValueError(
                f"row {row}: segmenter.score=entropy but the completion has no entropies (the "
                "backend did not record them); use score=auto or surprisal"
            )
        if entropies is not None:
            e = torch.as_tensor(list(entropies), dtype=torch.float64, device="cpu")
            if e.numel() == n:
                scores = e
            elif e.numel() == n - c.prefix_len:
                scores[c.prefix_len:] = e
            else:
                raise ValueError(
                    f"row {row}: {e.numel()} entropies for {n} response tokens "
                    f"({c.prefix_len} of them a prefix)"
                )
            return scores, True
        scores[c.prefix_len:] = -batch.gen_logprobs[row, c.prefix_len:n].to(torch.float64)
        return scores, False

    def segment_row(
        self, ids: Sequence[int], scores: torch.Tensor | None, n_content: int | None = None
    ) -> tuple[Spans, dict[str, int]]:
        """Spans of one response.

        Args:
            ids: (n,) response token ids.
            scores: (n,) float scores (NaN = unscored) or ``None`` for no uncertainty boundaries.
            n_content: Boundaries must lie below this (default n); trailing specials excluded.

        Returns:
            ``(spans, counts)`` with the kept boundaries per kind
            (``delimiter``/``keyword``/``entropy``).
        """
        cfg, n = self.config, len(ids)
        n_content = n if n_content is None else n_content
        delims, keywords = self.text_boundaries(ids) if self.tokenizer is not None else ([], [])
        ordered = [("delimiter", p) for p in delims] + [("keyword", p) for p in keywords]
        if scores is not None and cfg.entropy_quantile is not None:
            scored = ~torch.isnan(scores)
            if int(scored.sum()) >= 2:
                q = torch.quantile(scores[scored], cfg.entropy_quantile)
                over = [t for t in range(1, n) if bool(scored[t]) and float(scores[t]) > float(q)]
                over.sort(key=lambda t: (-float(scores[t]), t))
                ordered += [("entropy", t) for t in over]
        kept: list[int] = []
        counts = {"delimiter": 0, "keyword": 0, "entropy": 0}
        m = cfg.min_segment_tokens
        for kind, p in ordered:
            if cfg.max_segments and len(kept) + 1 >= cfg.max_segments:
                break
            if not 0 < p < n_content or p < m or n - p < m:
                continue
            k = bisect.bisect_left(kept, p)
            if (k > 0 and p - kept[k - 1] < m) or (k < len(kept) and kept[k] - p < m):
                continue
            kept.insert(k, p)
            counts[kind] += 1
        return spans_from_boundaries(kept, n), counts

    def segment(self, batch: RolloutBatch) -> Segments:
        """Spans per trajectory, partitioning each row's response mask exactly.

        Args:
            batch: Uses ``trajectories`` (their ``completion.response_ids``, ``prefix_len`` and
                optional ``entropies``), ``response_mask`` (B, T) and ``gen_logprobs`` (B, T).
        """
        batch = batch.to("cpu")  # per-row bookkeeping runs on the host: one copy
        if self.tokenizer is None and (self.config.delimiters or self.config.keywords):
            raise ValueError(
                "the 'keyword_entropy' segmenter needs the policy's tokenizer for delimiters "
                "and keywords (or set both lists to [])"
            )
        special = set(getattr(self.tokenizer, "all_special_ids", None) or ())
        lengths = [int(x) for x in batch.response_mask.sum(dim=1).tolist()]
        out = []
        totals = self._totals
        for row, (traj, n) in enumerate(zip(batch.trajectories, lengths)):
            ids = traj.completion.response_ids
            if len(ids) != n:
                raise ValueError(f"trajectory of {len(ids)} response tokens sits in a row of {n}")
            n_content = n
            while n_content > 0 and ids[n_content - 1] in special:
                n_content -= 1
            scores, from_entropies = self.token_scores(batch, row, n)
            spans, counts = self.segment_row(ids, scores, n_content)
            out.append(spans)
            totals["rows"] = totals.get("rows", 0.0) + 1
            totals["segments"] = totals.get("segments", 0.0) + len(spans)
            totals["entropy_rows"] = totals.get("entropy_rows", 0.0) + float(from_entropies)
            for kind, c in counts.items():
                totals[kind] = totals.get(kind, 0.0) + c
        return Segments(tuple(out))

    def metrics(self) -> dict[str, float]:
        """Per-row means since the last call (then reset): ``segments_per_row``,
        ``{delimiter,keyword,entropy}_boundaries_per_row`` and ``entropy_score_share`` (rows
        scored by backend entropies rather than the surprisal fallback)."""
        t, self._totals = self._totals, {}
        rows = t.get("rows", 0.0)
        if not rows:
            return {}
        out: dict[str, float] = {
            "segments_per_row": Mean(t["segments"] / rows),
            "entropy_score_share": Mean(t["entropy_rows"] / rows),
        }
        for kind in ("delimiter", "keyword", "entropy"):
            out[f"{kind}_boundaries_per_row"] = Mean(t.get(kind, 0.0) / rows)
        return out
