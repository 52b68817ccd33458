"""Built-in segmenters: ``whole``, ``newline`` and ``thought``.

A segmenter returns, per trajectory, token spans ``(start, end)`` in response coordinates that
partition ``[0, length)`` exactly, where ``length = response_mask[i].sum()``.
"""

from __future__ import annotations

from dataclasses import dataclass

from creditlab.interfaces import Segmenter
from creditlab.step.generation import completion_spans
from creditlab.types import RolloutBatch, Segments, Spans


def _lengths(batch: RolloutBatch) -> list[int]:
    return [int(n) for n in batch.response_mask.sum(dim=1).tolist()]


def spans_from_ends(ends: list[int], length: int) -> Spans:
    """Spans that end after each position in ``ends`` (exclusive ends), plus a trailing span.

    Args:
        ends: Exclusive end positions of segments, increasing, each in ``(0, length]``.
        length: The response length.
    """
    spans, start = [], 0
    for end in ends:
        if start < end <= length:
            spans.append((start, end))
            start = end
    if start < length or not spans:
        spans.append((start, length))
    return tuple(spans)


class WholeSegmenter(Segmenter):
    """The whole response is one segment."""

    def segment(self, batch: RolloutBatch) -> Segments:
        return Segments(tuple(((0, n),) for n in _lengths(batch)))


class NewlineSegmenter(WholeSegmenter):
    """A segment ends after every token whose text contains a newline."""

    def segment(self, batch: RolloutBatch) -> Segments:
        if self.tokenizer is None:
            raise ValueError("the 'newline' segmenter needs the policy's tokenizer")
        out = []
        for row, n in zip(batch.response_ids.tolist(), _lengths(batch)):
            pieces = self.tokenizer.convert_ids_to_tokens(row[:n])
            texts = [self.tokenizer.convert_tokens_to_string([p]) for p in pieces]
            ends = [t + 1 for t, text in enumerate(texts) if "\n" in text]
            out.append(spans_from_ends(ends, n))
        return Segments(tuple(out))


@dataclass
class ThoughtSegmenterConfig:
    delimiter: str = "</thought>"


class ThoughtSegmenter(WholeSegmenter):
    """One segment per thought: spans end after each occurrence of the delimiter's token ids.

    Uses the completion's ``segment_ids`` when thought-by-thought generation recorded them; a
    trailing lone EOS token joins the last thought (see :func:`creditlab.step.generation.completion_spans`).
    """

    Config = ThoughtSegmenterConfig

    def segment(self, batch: RolloutBatch) -> Segments:
        if self.tokenizer is None:
            raise ValueError("the 'thought' segmenter needs the policy's tokenizer")
        delimiter_ids = tuple(self.tokenizer.encode(self.config.delimiter, add_special_tokens=False))
        eos = self.tokenizer.eos_token_id
        out = []
        for traj, n in zip(batch.trajectories, _lengths(batch)):
            c = traj.completion
            if len(c.response_ids) != n or (c.segment_ids is not None and len(c.segment_ids) != n):
                raise ValueError(
                    f"trajectory of {len(c.response_ids)} response tokens sits in a row of {n}"
                )
            out.append(completion_spans(c, delimiter_ids, eos))
        return Segments(tuple(out))
