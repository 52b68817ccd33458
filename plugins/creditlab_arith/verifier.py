"""Exact-integer verifier for the ``arith`` task."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from creditlab import Completion, Mean, Problem, Rewards, Sum, Verifier

from creditlab_arith.task import last_boxed, parse_int

OUTCOMES = ("correct", "wrong", "no_answer")


class ArithVerifier(Verifier):
    """Reward 1.0 when the last ``\\boxed{...}`` of the response equals the answer as an integer.

    ``info[i]`` is ``{"parsed": <boxed content or None>, "outcome": "correct"|"wrong"|
    "no_answer"}``: ``no_answer`` when the response has no complete ``\\boxed{...}``; ``wrong``
    when it has one that is not the answer (including non-integer content). Never raises on
    garbage text.
    """

    def __init__(self, config: object | None = None) -> None:
        super().__init__(config)
        self._counts: Counter[str] = Counter()

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair.

        Raises:
            ValueError: If the two sequences differ in length.
        """
        if len(problems) != len(completions):
            raise ValueError(
                f"ArithVerifier.score got {len(problems)} problems and {len(completions)} "
                f"completions; they must pair up one to one"
            )
        values, info = [], []
        for problem, completion in zip(problems, completions):
            text = completion.text if isinstance(completion.text, str) else ""
            parsed = last_boxed(text)
            gold = parse_int(str(problem.answer))
            if parsed is None:
                outcome = "no_answer"
            elif gold is not None and parse_int(parsed) == gold:
                outcome = "correct"
            else:
                outcome = "wrong"
            self._counts[outcome] += 1
            values.append(1.0 if outcome == "correct" else 0.0)
            info.append({"parsed": parsed, "outcome": outcome})
        return Rewards(values=tuple(values), info=tuple(info))

    def metrics(self) -> dict[str, float]:
        """Outcome rates (``<outcome>_rate``) and ``scored`` count since the last call; resets."""
        total = sum(self._counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        if total:
            out.update({f"{k}_rate": Mean(self._counts[k] / total) for k in OUTCOMES})
        self._counts.clear()
        return out
