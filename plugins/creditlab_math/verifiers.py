"""Math verifiers: ``math_verify`` (symbolic, in worker processes) and ``gsm8k`` (numeric).

Both report one of :data:`~creditlab_math.extract.OUTCOMES` per completion in ``Rewards.info``
(``{"parsed", "outcome", "error"?}``) and count them for :meth:`metrics`: a response without a
parsable answer is ``no_answer``, an exception is ``error`` with its message, an overrun is
``timeout``. None of them is ever a silent 0.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import Completion, ConfigError, Mean, Problem, Rewards, Sum, Verifier

from creditlab_math.extract import (
    OUTCOMES,
    after_last_hashes,
    first_number,
    format_number,
    last_boxed,
    numbers_in,
    to_number,
)
from creditlab_math.mathverify_worker import setup
from creditlab_math.pool import ProcessWorkerPool

EXTRACTION_MODES = ("boxed_or_any", "boxed", "any", "regex")


def _pair_check(problems: Sequence[Problem], completions: Sequence[Completion], who: str) -> None:
    if len(problems) != len(completions):
        raise ValueError(
            f"{who}.score got {len(problems)} problems and {len(completions)} completions; "
            f"they must pair up one to one"
        )



class OutcomeCounter:
    """Counts verifier outcomes between two ``metrics()`` calls."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, outcome: str) -> None:
        self._counts[outcome] += 1

    def pop_metrics(self) -> dict[str, float]:
        """``scored``, ``<outcome>_count`` and ``<outcome>_rate`` for every outcome; resets."""
        total = sum(self._counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        for outcome in OUTCOMES:
            count = self._counts[outcome]
            out[f"{outcome}_count"] = Sum(count)
            out[f"{outcome}_rate"] = Mean(count / total if total else 0.0)
        self._counts.clear()
        return out


class MathVerifyVerifier(Verifier):
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

    def __init__(
        self,
        config: Any | None = None,
        *,
        worker_initializer: Callable | None = None,
        worker_initargs: tuple = (),
    ) -> None:
        super().__init__(config)
        cfg = self.config
        if cfg.extraction not in EXTRACTION_MODES:
            raise ConfigError(
                f"verifier.extraction must be one of {', '.join(EXTRACTION_MODES)}; "
                f"got {cfg.extraction!r}"
            )
        if cfg.extraction == "regex":
            if not cfg.answer_regex:
                raise ConfigError("verifier.extraction 'regex' needs verifier.answer_regex")
            try:
                re.compile(cfg.answer_regex)
            except re.error as exc:
                raise ConfigError(f"verifier.answer_regex does not compile: {exc}") from exc
        try:
            self._pool = ProcessWorkerPool(
                target="creditlab_math.mathverify_worker:check_completion",
                workers=cfg.workers,
                timeout_s=cfg.timeout_s,
                initializer=setup,
                initargs=(worker_initializer, tuple(worker_initargs)),
            )
        except ValueError as exc:
            raise ConfigError(f"verifier: {exc}") from exc
        self._options = {
            "extraction": cfg.extraction,
            "answer_regex": cfg.answer_regex,
            "float_rounding": cfg.float_rounding,
            "numeric_precision": cfg.numeric_precision,
            "strict": cfg.strict,
        }
        self._counter = OutcomeCounter()
        self._restarts_seen = 0
        self._finalizer = weakref.finalize(self, self._pool.close)

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair; blocks until every item is done.

        Raises:
            ValueError: If the two sequences differ in length.
            RuntimeError: If the workers cannot start (e.g. math-verify missing) or after close.
        """
        _pair_check(problems, completions, type(self).__name__)
        items = [
            (str(p.answer), c.text if isinstance(c.text, str) else "", self._options)
            for p, c in zip(problems, completions)
        ]
        values, info = [], []
        for result in self._pool.map(items):
            if result.status == "ok":
                entry = dict(result.value)
            else:
                entry = {"outcome": result.status, "parsed": None, "error": result.error}
            correct = entry["outcome"] == "correct"
            values.append(self.config.reward_correct if correct else self.config.reward_wrong)
            self._counter.add(entry["outcome"])
            info.append(entry)
        return Rewards(values=tuple(values), info=tuple(info))

    def metrics(self) -> dict[str, float]:
        """``scored``, ``<outcome>_count``/``_rate`` and ``worker_restarts`` since the last call."""
        out = self._counter.pop_metrics()
        out["worker_restarts"] = Sum(self._pool.restarts - self._restarts_seen)
        self._restarts_seen = self._pool.restarts
        return out

    def close(self) -> None:
        """Stop the worker processes (also done on garbage collection and at exit)."""
        self._finalizer()


class GSM8KVerifier(Verifier):
    """GSM8K-style numeric answer checking, in process.

    Gold: the text after the last ``####`` of ``problem.answer`` (or all of it when there is no
    marker), with commas, ``$`` and spaces removed. Prediction, first that exists: the number
    after the last ``####`` of the completion; the number in the last ``\\boxed{}``; the last
    number in the text (``fallback_last_number``). Compared as numbers: ``1,000 == 1000``,
    ``18.0 == 18``, ``\\frac{7}{2} == 3.5``. ``info[i]`` is ``{"parsed", "outcome", "source",
    "error"?}`` where ``source`` is ``"####"``, ``"boxed"`` or ``"last_number"``.
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
        """

        fallback_last_number: bool = True
        tolerance: float = 1e-6
        reward_correct: float = 1.0
        reward_wrong: float = 0.0

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        self._counter = OutcomeCounter()

    def _predict(self, text: str) -> tuple[Any, str | None]:
        after = after_last_hashes(text)
        if after is not None:
            value = first_number(after)
            if value is not None:
                return value, "####"
        boxed = last_boxed(text)
        if boxed is not None:
            value = first_number(boxed)
            if value is not None:
                return value, "boxed"
        if self.config.fallback_last_number:
            found = numbers_in(text)
            if found:
                return to_number(found[-1]), "last_number"
        return None, None

    def check(self, gold_text: str, text: str) -> dict[str, Any]:
        """Score one completion: ``{"parsed", "outcome", "source", "error"?}``."""
        gold_part = after_last_hashes(gold_text)
        gold = to_number(gold_part if gold_part is not None else gold_text)
        if gold is None:
            return {"outcome": "error", "parsed": None, "source": None,
                    "error": f"the reference answer {gold_text!r} is not a number"}
        pred, source = self._predict(text)
        if pred is None:
            return {"outcome": "no_answer", "parsed": None, "source": None}
        close = abs(pred - gold) <= self.config.tolerance * max(1, abs(gold))
        outcome = "correct" if close else "wrong"
        return {"outcome": outcome, "parsed": format_number(pred), "source": source}

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair.

        Raises:
            ValueError: If the two sequences differ in length.
        """
        _pair_check(problems, completions, type(self).__name__)
        values, info = [], []
        for problem, completion in zip(problems, completions):
            text = completion.text if isinstance(completion.text, str) else ""
            try:
                entry = self.check(str(problem.answer), text)
            except Exception as exc:  # noqa: BLE001 - counted, never a silent 0
                entry = {"outcome": "error", "parsed": None, "source": None,
                         "error": f"{type(exc).__name__}: {exc}"}
            self._counter.add(entry["outcome"])
            correct = entry["outcome"] == "correct"
            values.append(self.config.reward_correct if correct else self.config.reward_wrong)
            info.append(entry)
        return Rewards(values=tuple(values), info=tuple(info))

    def metrics(self) -> dict[str, float]:
        """``scored`` and ``<outcome>_count``/``_rate`` since the last call; resets."""
        return self._counter.pop_metrics()
