"""Exact-integer verifier for the ``arith`` task."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import Completion, Mean, Problem, Rewards, Sum, Verifier
from creditlab_math.verifiers import CheckPool, check_limits

from creditlab_arith.answer import OUTCOMES


class ArithVerifier(Verifier):
    """Reward 1.0 when the last ``\\boxed{...}`` of the response equals the answer as an integer.

    ``info[i]`` is ``{"parsed": <boxed content or None>, "outcome": "correct"|"wrong"|
    "no_answer"|"timeout"|"error"}`` (plus ``"error"``, a message, for the last two):
    ``no_answer`` when the response has no complete ``\\boxed{...}``; ``wrong`` when it has one
    that is not the answer (including non-integer content). Never raises on garbage text.

    The check (:func:`creditlab_arith.answer.check`) is linear in the text and reads at most 12
    digits; it runs in a worker process with the hard limit ``timeout_s`` per completion
    (``creditlab_math.verifiers.CheckPool``) as the backstop: an overrun is ``timeout``.
    """

    @dataclass
    class Config:
        """Options of the ``arith`` verifier.

        Attributes:
            timeout_s: Hard wall-clock limit per completion, in seconds (outcome ``timeout``).
            workers: Worker processes.
        """

        timeout_s: float = 5.0
        workers: int = 1

        def __post_init__(self) -> None:
            """Checked when the config is built, before the model loads."""
            check_limits(self.timeout_s, self.workers)

    def __init__(
        self,
        config: Any | None = None,
        *,
        worker_initializer: Callable | None = None,
        worker_initargs: tuple = (),
    ) -> None:
        """Keyword Args: ``worker_initializer``: optional callable (importable by name) run once
        in every worker, e.g. :func:`creditlab_math.testing.inject_faults` with
        ``target="creditlab_arith.answer:check"`` in tests; ``worker_initargs``: its arguments."""
        super().__init__(config)
        self._checks = CheckPool(
            "creditlab_arith.answer:check", self.config.timeout_s, self.config.workers,
            initializer=worker_initializer, initargs=worker_initargs,
        )
        self._counts: Counter[str] = Counter()

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair; blocks until every item is done.

        Raises:
            ValueError: If the two sequences differ in length.
            RuntimeError: If the workers cannot start, or after :meth:`close`.
        """
        if len(problems) != len(completions):
            raise ValueError(
                f"ArithVerifier.score got {len(problems)} problems and {len(completions)} "
                f"completions; they must pair up one to one"
            )
        items = [
            (str(p.answer), c.text if isinstance(c.text, str) else "")
            for p, c in zip(problems, completions)
        ]
        values, info = [], []
        for entry in self._checks.run(items):
            self._counts[entry["outcome"]] += 1
            values.append(1.0 if entry["outcome"] == "correct" else 0.0)
            info.append(entry)
        return Rewards(values=tuple(values), info=tuple(info))

    def metrics(self) -> dict[str, float]:
        """``scored``, and ``<outcome>_rate`` for every outcome and ``worker_restarts`` (workers
        killed or found dead) when something was scored, since the last call; resets."""
        total = sum(self._counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        restarts = self._checks.new_restarts()
        if total:
            out.update({f"{k}_rate": Mean(self._counts[k] / total) for k in OUTCOMES})
            out["worker_restarts"] = Sum(restarts)
        self._counts.clear()
        return out

    def close(self) -> None:
        """Stop the worker processes (also done on garbage collection and at exit)."""
        self._checks.close()
