"""Exact-integer verifier for the ``arith`` task."""

from __future__ import annotations

from dataclasses import dataclass

from creditlab import Mean, Sum
from creditlab_math.verifiers import PooledVerifier, check_limits

from creditlab_arith.answer import OUTCOMES


class ArithVerifier(PooledVerifier):
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

    CHECK = "creditlab_arith.answer:check"

    def _reward(self, correct: bool) -> float:
        return 1.0 if correct else 0.0

    def metrics(self) -> dict[str, float]:
        """``scored``, and ``<outcome>_rate`` for every outcome and ``worker_restarts`` (workers
        killed or found dead) when something was scored, since the last call; resets."""
        counts = self._counter.pop()
        total = sum(counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        restarts = self._checks.new_restarts()
        if total:
            out.update({f"{k}_rate": Mean(counts[k] / total) for k in OUTCOMES})
            out["worker_restarts"] = Sum(restarts)
        return out
