"""Math verifiers: ``math_verify`` (symbolic) and ``gsm8k`` (numeric), both in worker processes.

Both report one of :data:`~creditlab_math.extract.OUTCOMES` per completion in ``Rewards.info``
(``{"parsed", "outcome", "error"?}``) and count them for :meth:`metrics`: a response without a
parsable answer is ``no_answer``, an exception is ``error`` with its message, an overrun of the
hard per-completion limit ``timeout_s`` is ``timeout``. None of them is ever a silent 0.

Every completion is checked in a worker process (:class:`CheckPool`), because only a process can
be stopped: model output is adversarial, and one pathological answer must cost at most
``timeout_s`` seconds, never a hung trainer. :class:`CheckPool` is also how another verifier (the
``arith`` one, or a plug-in's) gets the same hard limit.
"""

from __future__ import annotations

import math
import re
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from creditlab import Completion, ConfigError, Mean, Problem, Rewards, Sum, Verifier

from creditlab_math.extract import OUTCOMES, gsm8k_check
from creditlab_math.mathverify_worker import setup
from creditlab_math.pool import PIPELINE_DEPTH, ProcessWorkerPool

EXTRACTION_MODES = ("boxed_or_any", "boxed", "any", "regex")


def _pair_check(problems: Sequence[Problem], completions: Sequence[Completion], who: str) -> None:
    if len(problems) != len(completions):
        raise ValueError(
            f"{who}.score got {len(problems)} problems and {len(completions)} completions; "
            f"they must pair up one to one"
        )



def check_limits(timeout_s: Any, workers: Any) -> None:
    """Raise a :class:`ConfigError` naming ``verifier.timeout_s`` / ``verifier.workers`` unless
    the limit is a finite number of seconds > 0 and there is at least one worker."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (
        math.isfinite(timeout_s) and timeout_s > 0
    ):
        raise ConfigError(
            f"verifier.timeout_s must be > 0 (the hard limit per completion, in seconds); "
            f"got {timeout_s!r}"
        )
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"verifier.workers must be >= 1 (worker processes); got {workers!r}")


class CheckPool:
    """A verifier's per-completion check, run in worker processes with a hard time limit each.

    ``target`` (``"module:function"``) is called as ``function(*item)`` in a persistent worker
    process and returns the completion's info dict (``{"outcome", "parsed", ...}``). An item that
    runs past ``timeout_s`` gets ``{"outcome": "timeout", "parsed": None, "error": ...}`` (its
    worker is killed and replaced); one that raises, or kills its worker, gets outcome
    ``error``. With ``pipeline`` (the default, for cheap checks) items are queued on busy
    workers (:mod:`creditlab_math.pool`), so a batch costs about one round trip; expensive checks
    should pass ``pipeline=0`` so that an idle worker takes the next item. The target's module must import fast and must not import torch or
    ``creditlab`` (a worker imports it at start and after every timeout): put the check in a
    module of its own that imports only the standard library.

    Args:
        target: The check, ``"module:function"``.
        timeout_s: Hard wall-clock limit per item, in seconds (> 0).
        workers: Worker processes (>= 1).
        initializer: Optional callable run once in every worker; ``initargs`` its arguments.
        pipeline: Items queued on a busy worker (0: one at a time).

    Raises:
        ConfigError: If ``timeout_s`` or ``workers`` is out of range.
    """

    def __init__(
        self,
        target: str,
        timeout_s: float,
        workers: int,
        initializer: Callable | None = None,
        initargs: tuple = (),
        pipeline: int = PIPELINE_DEPTH,
    ) -> None:
        check_limits(timeout_s, workers)
        self.pool = ProcessWorkerPool(
            target=target, workers=workers, timeout_s=timeout_s,
            initializer=initializer, initargs=tuple(initargs), pipeline=pipeline,
        )
        self._restarts_seen = 0
        self._finalizer = weakref.finalize(self, self.pool.close)

    def run(self, items: Sequence[tuple]) -> list[dict[str, Any]]:
        """The info dict of every item, in order; blocks until each is done or timed out."""
        out = []
        for result in self.pool.map(items):
            if result.status == "ok":
                out.append(dict(result.value))
            else:
                out.append({"outcome": result.status, "parsed": None, "error": result.error})
        return out

    def new_restarts(self) -> int:
        """Workers killed (timeouts) or found dead since the last call."""
        new, self._restarts_seen = self.pool.restarts - self._restarts_seen, self.pool.restarts
        return new

    def close(self) -> None:
        """Stop the worker processes (also done on garbage collection and at exit)."""
        self._finalizer()


class OutcomeCounter:
    """Counts verifier outcomes between two ``metrics()`` calls."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, outcome: str) -> None:
        self._counts[outcome] += 1

    def pop(self) -> Counter[str]:
        """The counts since the last call; resets."""
        counts, self._counts = self._counts, Counter()
        return counts

    def pop_metrics(self) -> dict[str, float]:
        """``scored``, ``<outcome>_count`` and ``<outcome>_rate`` for every outcome; resets."""
        counts = self.pop()
        total = sum(counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        for outcome in OUTCOMES:
            count = counts[outcome]
            out[f"{outcome}_count"] = Sum(count)
            out[f"{outcome}_rate"] = Mean(count / total if total else 0.0)
        return out


class PooledVerifier(Verifier):
    """A verifier whose per-completion check runs in :class:`CheckPool` workers under the hard
    limit ``config.timeout_s`` (the config also has ``workers``): ``score``, ``metrics`` and
    ``close`` shared by the math and arith verifiers and open to a plug-in's.

    A subclass names its check, ``CHECK = "module:function"``, called in a worker as
    ``function(gold, text, *self._extra())`` and returning the completion's info dict
    (``{"outcome", "parsed", ...}``); ``INFO_DEFAULTS`` fills keys an info dict made by the pool
    (``timeout``/``error``) lacks; :meth:`_reward` maps correctness to a reward (default
    ``config.reward_correct`` / ``config.reward_wrong``).

    Keyword Args:
        worker_initializer: Optional callable, importable by name, run once in every worker
            (e.g. :func:`creditlab_math.testing.inject_faults` in tests).
        worker_initargs: Arguments for ``worker_initializer``.
    """

    CHECK: ClassVar[str]
    INFO_DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        config: Any | None = None,
        *,
        worker_initializer: Callable | None = None,
        worker_initargs: tuple = (),
    ) -> None:
        super().__init__(config)
        self._checks = CheckPool(
            self.CHECK, self.config.timeout_s, self.config.workers,
            **self._pool_options(worker_initializer, tuple(worker_initargs)),
        )
        self._counter = OutcomeCounter()

    def _pool_options(self, initializer: Callable | None, initargs: tuple) -> dict[str, Any]:
        """Keyword arguments of the :class:`CheckPool`."""
        return {"initializer": initializer, "initargs": initargs}

    def _extra(self) -> tuple:
        """Arguments the check gets after ``(gold, text)``."""
        return ()

    def _reward(self, correct: bool) -> float:
        return self.config.reward_correct if correct else self.config.reward_wrong

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair; blocks until every item is done.

        Raises:
            ValueError: If the two sequences differ in length.
            RuntimeError: If the workers cannot start (e.g. a missing dependency), or after
                :meth:`close`.
        """
        _pair_check(problems, completions, type(self).__name__)
        extra = self._extra()
        items = [
            (str(p.answer), c.text if isinstance(c.text, str) else "", *extra)
            for p, c in zip(problems, completions)
        ]
        values, info = [], []
        for entry in self._checks.run(items):
            for key, value in self.INFO_DEFAULTS.items():
                entry.setdefault(key, value)
            self._counter.add(entry["outcome"])
            values.append(self._reward(entry["outcome"] == "correct"))
            info.append(entry)
        return Rewards(values=tuple(values), info=tuple(info))

    def metrics(self) -> dict[str, float]:
        """``scored``, ``<outcome>_count``/``_rate`` and ``worker_restarts`` since the last call."""
        out = self._counter.pop_metrics()
        out["worker_restarts"] = Sum(self._checks.new_restarts())
        return out

    def close(self) -> None:
        """Stop the worker processes (also done on garbage collection and at exit)."""
        self._checks.close()


class MathVerifyVerifier(PooledVerifier):
    """Symbolic answer checking with HuggingFace ``math-verify``, in worker processes.

    math-verify's own timeouts use ``SIGALRM`` (they raise outside the main thread, and their
    ``signal.alarm(0)`` cancels any outer alarm). Here they are disabled and every item runs in
    a small persistent pool of worker processes (:class:`~creditlab_math.pool.ProcessWorkerPool`)
    with a hard wall-clock limit enforced by the parent: a hung worker is killed and replaced, and
    its item is scored ``reward_wrong`` with outcome ``"timeout"``. ``score`` therefore works
    from any thread.

    The reference (``problem.answer``) is parsed as ``\\boxed{answer}``; the prediction is taken
    from the completion per ``extraction``. ``verify(gold, pred)`` is called gold first (it is
    asymmetric). ``info[i]`` is ``{"parsed", "outcome", "error"?}``.

    Keyword Args:
        worker_initializer: Optional callable, importable by name, run once in every worker
            (before math-verify is imported), e.g. to set up logging or, in tests, to patch
            :func:`creditlab_math.mathverify_worker.check_completion`, which workers look up
            on every call (see :mod:`creditlab_math.testing`).
        worker_initargs: Arguments for ``worker_initializer``.
    """

    @dataclass
    class Config:
        """Options of the ``math_verify`` verifier.

        Attributes:
            timeout_s: Hard wall-clock limit per completion (parse + verify), in seconds.
            workers: Worker processes.
            extraction: ``"boxed_or_any"``: the last ``\\boxed{}``, else math-verify's own
                extraction from the whole text; ``"boxed"``: the last ``\\boxed{}`` only (none
                is ``no_answer``); ``"any"``: math-verify's extraction from the whole text;
                ``"regex"``: the last match of ``answer_regex`` (its group 1 if it has groups).
            answer_regex: Pattern for ``extraction: regex``.
            reward_correct: Reward of a correct answer.
            reward_wrong: Reward of every other outcome.
            float_rounding: math-verify ``float_rounding``.
            numeric_precision: math-verify ``numeric_precision``.
            strict: math-verify ``strict``.
        """

        timeout_s: float = 5.0
        workers: int = 2
        extraction: str = "boxed_or_any"
        answer_regex: str | None = None
        reward_correct: float = 1.0
        reward_wrong: float = 0.0
        float_rounding: int = 6
        numeric_precision: int = 15
        strict: bool = True

        def __post_init__(self) -> None:
            """Checked when the config is built, before the model loads."""
            check_limits(self.timeout_s, self.workers)
            if self.extraction not in EXTRACTION_MODES:
                raise ConfigError(
                    f"verifier.extraction must be one of {', '.join(EXTRACTION_MODES)}; "
                    f"got {self.extraction!r}"
                )
            if self.extraction == "regex":
                if not self.answer_regex:
                    raise ConfigError("verifier.extraction 'regex' needs verifier.answer_regex")
                try:
                    re.compile(self.answer_regex)
                except re.error as exc:
                    raise ConfigError(f"verifier.answer_regex does not compile: {exc}") from exc

    CHECK = "creditlab_math.mathverify_worker:check_completion"

    def __init__(self, config: Any | None = None, **workers: Any) -> None:
        super().__init__(config, **workers)
        self._pool = self._checks.pool
        cfg = self.config
        self._options = {
            "extraction": cfg.extraction,
            "answer_regex": cfg.answer_regex,
            "float_rounding": cfg.float_rounding,
            "numeric_precision": cfg.numeric_precision,
            "strict": cfg.strict,
        }

    def _pool_options(self, initializer: Callable | None, initargs: tuple) -> dict[str, Any]:
        # math-verify is set up in each worker first (its SIGALRM timeouts off); seconds-long
        # items: an idle worker should take the next one
        return {"initializer": setup, "initargs": (initializer, initargs), "pipeline": 0}

    def _extra(self) -> tuple:
        return (self._options,)


class GSM8KVerifier(PooledVerifier):
    """GSM8K-style numeric answer checking (:func:`creditlab_math.extract.gsm8k_check`).

    Gold: the text after the last ``####`` of ``problem.answer`` (or all of it when there is no
    marker), with commas, ``$`` and spaces removed. Prediction, first that exists: the number
    after the last ``####`` of the completion; the number in the last ``\\boxed{}``; the last
    number in the text (``fallback_last_number``). Compared as numbers: ``1,000 == 1000``,
    ``18.0 == 18``, ``\\frac{7}{2} == 3.5``. ``info[i]`` is ``{"parsed", "outcome", "source",
    "error"?}`` where ``source`` is ``"####"``, ``"boxed"`` or ``"last_number"``.

    Extraction is linear in the text and numbers are bounded (``MAX_NUMBER_CHARS``,
    ``MAX_EXPONENT`` in :mod:`creditlab_math.extract`), so a check takes microseconds for a
    normal answer and well under a second per megabyte for any text; each one still runs in a
    worker process with the hard limit ``timeout_s`` (:class:`CheckPool`) as the backstop.
    """

    @dataclass
    class Config:
        """Options of the ``gsm8k`` verifier.

        Attributes:
            fallback_last_number: Use the last number of the text when there is neither a
                ``####`` answer nor a ``\\boxed{}``.
            tolerance: Numbers match when ``|pred - gold| <= tolerance * max(1, |gold|)``.
            reward_correct: Reward of a correct answer.
            reward_wrong: Reward of every other outcome.
            timeout_s: Hard wall-clock limit per completion, in seconds (outcome ``timeout``).
            workers: Worker processes.
        """

        fallback_last_number: bool = True
        tolerance: float = 1e-6
        reward_correct: float = 1.0
        reward_wrong: float = 0.0
        timeout_s: float = 5.0
        workers: int = 1

        def __post_init__(self) -> None:
            """Checked when the config is built, before the model loads."""
            check_limits(self.timeout_s, self.workers)
            if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
                raise ConfigError(
                    f"verifier.tolerance must be a number >= 0; got {self.tolerance!r}"
                )

    CHECK = "creditlab_math.extract:gsm8k_check"
    INFO_DEFAULTS: ClassVar[dict[str, Any]] = {"source": None}

    def __init__(self, config: Any | None = None, **workers: Any) -> None:
        """Keyword Args: ``worker_initializer``, ``worker_initargs``: as for
        :class:`PooledVerifier` (e.g. :func:`creditlab_math.testing.inject_faults` with
        ``target="creditlab_math.extract:gsm8k_check"``)."""
        super().__init__(config, **workers)
        self._options = {
            "fallback_last_number": self.config.fallback_last_number,
            "tolerance": self.config.tolerance,
        }

    def check(self, gold_text: str, text: str) -> dict[str, Any]:
        """Score one completion in this process (no time limit; :meth:`score` has one):
        ``{"parsed", "outcome", "source", "error"?}``."""
        return gsm8k_check(gold_text, text, self._options)

    def _extra(self) -> tuple:
        return (self._options,)
