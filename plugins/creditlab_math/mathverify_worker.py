"""The ``math_verify`` verifier's worker-side code: runs inside its worker processes.

Imports only the standard library, :mod:`creditlab_math.extract` and ``math_verify`` (never
torch or the framework core), so a worker starts in about a second. math-verify's own SIGALRM
timeouts are disabled here: the parent process enforces a hard wall-clock limit per item
(:mod:`creditlab_math.pool`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from creditlab_math.extract import last_boxed

_GOLD_CACHE: dict[str, list] = {}
_GOLD_CACHE_SIZE = 4096
#: An extracted answer (a box's content, a regex match) longer than this is scored ``wrong``
#: without parsing: parsing a long expression costs math-verify far more than linear time, and no
#: real final answer is that long (the NuminaMath preparation keeps golds of at most 60
#: characters; MATH answers are short expressions). Whole-text extraction (``"any"``) is bounded
#: by the hard time limit only.
MAX_ANSWER_CHARS = 1000


def setup(initializer: Callable | None = None, initargs: tuple = ()) -> None:
    """Worker initializer: run the user's ``initializer`` (first, so a broken one fails fast),
    then import math-verify and silence its "timeout is disabled" warning (its SIGALRM timeouts
    are disabled on purpose)."""
    if initializer is not None:
        initializer(*initargs)
    import math_verify.grader
    import math_verify.parser

    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parse(latex: str) -> list:
    from math_verify import parse

    return parse(latex, parsing_timeout=None, raise_on_error=True)


def parse_gold(answer: str) -> list:
    """math-verify parse of a reference answer: ``\\boxed{answer}`` (cached), else the raw text."""
    gold = _GOLD_CACHE.get(answer)
    if gold is None:
        wrapped = answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"
        gold = _parse(wrapped) or _parse(answer)
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[answer] = gold
    return gold


def extract(text: str, extraction: str, answer_regex: str | None) -> tuple[str | None, bool]:
    """The text to hand to ``math_verify.parse`` and whether it is an isolated answer.

    Args:
        text: The completion.
        extraction: ``"boxed_or_any"``, ``"boxed"``, ``"any"`` or ``"regex"`` (see the
            verifier's ``Config``).
        answer_regex: Pattern for ``"regex"``; its group 1 (if any) is the answer.

    Returns:
        ``(answer, isolated)``: ``answer`` is ``None`` when there is nothing to parse;
        ``isolated`` is False when the whole text goes to math-verify's own extraction.
    """
    if extraction == "regex":
        matches = list(re.finditer(answer_regex or "", text))
        if not matches:
            return None, True
        last = matches[-1]
        return (last.group(1) if last.groups() else last.group(0)).strip(), True
    if extraction in ("boxed", "boxed_or_any"):
        boxed = last_boxed(text)
        if boxed is not None or extraction == "boxed":
            return boxed, True
    return text, False


def check_completion(gold: str, text: str, options: dict[str, Any]) -> dict[str, Any]:
    """Score one completion with math-verify. Workers look this name up on every call.

    Args:
        gold: The reference answer (bare LaTeX such as ``\\frac{1}{2}``, or text with a box).
        text: The completion text.
        options: ``extraction``, ``answer_regex``, ``float_rounding``, ``numeric_precision``,
            ``strict``.

    Returns:
        ``{"outcome", "parsed"}`` plus ``"error"`` for the ``error`` outcome. ``parsed`` is the
        extracted answer text (math-verify's matched string for whole-text extraction).
    """
    from math_verify import verify

    gold_parsed = parse_gold(gold)
    if not gold_parsed:
        return {"outcome": "error", "parsed": None,
                "error": f"math-verify could not parse the reference answer {gold!r}"}
    answer, isolated = extract(text, options["extraction"], options["answer_regex"])
    if answer is None or not answer.strip():
        return {"outcome": "no_answer", "parsed": None}
    if isolated and len(answer) > MAX_ANSWER_CHARS:
        return {"outcome": "wrong", "parsed": answer[:100] + "..."}
    pred = _parse(f"\\boxed{{{answer}}}") if isolated else _parse(answer)
    if not pred:
        return {"outcome": "no_answer", "parsed": None}
    if isolated:
        parsed = answer
    else:
        parsed = next((p for p in reversed(pred) if isinstance(p, str)), None) or str(pred[0])
    errors = []
    for g in gold_parsed:  # pair by pair (gold first), so one raising pair hides no other
        for p in pred:
            try:
                same = verify(
                    g,
                    p,
                    float_rounding=options["float_rounding"],
                    numeric_precision=options["numeric_precision"],
                    strict=options["strict"],
                    timeout_seconds=None,
                    raise_on_error=True,
                )
            except Exception as exc:  # noqa: BLE001 - reported when no pair matched
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            if same:
                return {"outcome": "correct", "parsed": parsed}
    if errors and len(errors) == len(gold_parsed) * len(pred):
        return {"outcome": "error", "parsed": parsed, "error": errors[0]}
    return {"outcome": "wrong", "parsed": parsed}
