"""Where generation stops: stop strings (split into token ids and texts, matched in text) and
:class:`ThoughtWatch`, which ends thoughts and rows in one decoding pass as
:func:`creditlab.step.generation.generate_thoughts`' rounds would.

Both the HF backend's stop strings and the watch use these rules: a stop string that is exactly
one token is matched by id; any other is matched in the decoded text of the tokens generated
since the sequence (or thought) began, and the sequence ends after the token completing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from creditlab.interfaces import DecodeWatch
from creditlab.types import ThoughtConfig

_RAW = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}


def split_stops(tokenizer: Any, stop: Sequence[str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(token ids, texts)``: stop strings that are exactly one token (matched by id, as the HF
    backend does) and the others (matched in the generated text)."""
    ids, texts = [], []
    for s in stop:
        enc = tokenizer.encode(s, add_special_tokens=False)
        if len(enc) == 1 and tokenizer.decode(enc, skip_special_tokens=False) == s:
            ids.append(int(enc[0]))
        else:
            texts.append(s)
    return tuple(ids), tuple(texts)


def window(stops: Sequence[str]) -> int:
    """How many of the latest tokens to decode to see whether the latest completes a stop string
    of ``stops`` (each token decodes to at least one character, plus two for merged bytes)."""
    return max(len(s) for s in stops) + 2


def completes(full: str, before: str, stops: Sequence[str]) -> bool:
    """Whether ``full`` (the decoded window, latest token included) holds one of ``stops`` that
    ``before`` (the same window without the latest token) did not: the latest token completes it."""
    return any(full.find(s, max(0, len(before) - len(s) + 1)) != -1 for s in stops)


@dataclass
class _Thoughts:
    """One row's thoughts: the tokens of the current one, where the earlier ones ended."""

    thought: int  # index of the current thought
    partial: list[int]  # an unfinished prefix thought that the current one continues
    current: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # new-token counts at which a thought ended
    generated: int = 0


class ThoughtWatch(DecodeWatch):
    """Thought-by-thought generation in one decoding pass (``rollout.thought_decoding=one_pass``).

    A thought ends after ``max_thought_tokens`` new tokens or after the token completing the
    delimiter (matched in the thought's own new tokens, as a round's stop string is), and then
    the row ends with ``"stop"`` when the thought's text (with an unfinished prefix thought it
    continues) holds ``final_marker``, or with ``"length"`` once it holds ``max_thoughts``
    thoughts. EOS ends the row in the backend (``end_at_eos`` must be true). These are the rules
    of the rounds, applied token by token, so each row's tokens follow the same distribution;
    only the random draws differ (one seeded call instead of one per round).

    Args:
        tokenizer: Decodes thoughts.
        cfg: The thought settings.
        starts: Per request row, ``(index of its next thought, the tokens of an unfinished
            prefix thought that it continues, else [])``.
    """

    def __init__(self, tokenizer: Any, cfg: ThoughtConfig, starts: Sequence[tuple[int, Sequence[int]]]) -> None:
        if not cfg.end_at_eos:
            raise ValueError("one-pass thought decoding ends rows at EOS; with end_at_eos=False use rounds")
        self.tokenizer, self.cfg = tokenizer, cfg
        self.stop_ids, self.stop_texts = split_stops(tokenizer, (cfg.delimiter,))
        self.rows = [_Thoughts(thought, list(partial)) for thought, partial in starts]

    def observe(self, row: int, token: int) -> str | None:
        st = self.rows[row]
        st.current.append(token)
        st.generated += 1
        if not self._ends_thought(st.current):
            return None
        text = self.tokenizer.decode(st.partial + st.current, skip_special_tokens=True)
        st.ends.append(st.generated)
        st.partial, st.current = [], []
        st.thought += 1
        if self.cfg.final_marker and self.cfg.final_marker in text:
            return "stop"
        return "length" if st.thought >= self.cfg.max_thoughts else None

    def _ends_thought(self, current: list[int]) -> bool:
        if len(current) >= self.cfg.max_thought_tokens or current[-1] in self.stop_ids:
            return True
        if not self.stop_texts:
            return False
        last = current[-window(self.stop_texts) :]
        full, before = self.tokenizer.batch_decode([last, last[:-1]], **_RAW)
        return completes(full, before, self.stop_texts)

    def segment_ids(self, row: int, first: int, generated: int) -> list[int]:
        """(generated,) the thought index of each of the ``generated`` tokens of ``row`` (an EOS
        that ended it included), its first thought being ``first``."""
        out, start = [], 0
        for j, end in enumerate([*self.rows[row].ends, generated]):
            out.extend([first + j] * (end - start))
            start = end
        return out
