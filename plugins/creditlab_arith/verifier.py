"""Exact-integer verifier for the ``arith`` task."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from creditlab import Completion, Mean, Problem, Rewards, Sum
from creditlab_math.verifiers import PooledVerifier, check_limits

from creditlab_arith.answer import OUTCOMES


class ArithVerifier(PooledVerifier):
    """Reward 1.0 when the last ``\\boxed{...}`` of the response equals the answer as an integer.

    ``info[i]`` is ``{"parsed": <boxed content or None>, "outcome": "correct"|"wrong"|
    "no_answer"|"timeout"|"error"}`` (plus ``"error"``, a message, for the last two):
    ``no_answer`` when the response has no complete ``\\boxed{...}``; ``wrong`` when it has one
    that is not the answer (including non-integer content). Never raises on garbage text.
    ``info[i]["lenient"]`` is the lenient reading (the boxed integer, else the last integer
    written: :func:`creditlab_arith.answer.check`); it is reported as ``lenient_rate`` beside the strict ``correct_rate``
    and never changes the reward.

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
    INFO_DEFAULTS = {"lenient": False}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lenient = 0

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """:meth:`PooledVerifier.score`, counting lenient answers too."""
        rewards = super().score(problems, completions)
        self._lenient += sum(bool(i["lenient"]) for i in rewards.info)
        return rewards

    def _reward(self, correct: bool) -> float:
        return 1.0 if correct else 0.0

    def metrics(self) -> dict[str, float]:
        """``scored``, and ``<outcome>_rate`` for every outcome, ``lenient_rate`` and
        ``worker_restarts`` (workers killed or found dead) when something was scored, since the
        last call; resets."""
        counts, lenient, self._lenient = self._counter.pop(), self._lenient, 0
        total = sum(counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        restarts = self._checks.new_restarts()
        if total:
            out.update({f"{k}_rate": Mean(counts[k] / total) for k in OUTCOMES})
            out["lenient_rate"] = Mean(lenient / total)
            out["worker_restarts"] = Sum(restarts)
        return out
