"""The ``arith`` answer format and the verifier's per-completion check.

Imports only the standard library: the ``arith`` verifier runs :func:`check` in worker processes
(``creditlab_math.verifiers.CheckPool``), which import this module at start and after every
timeout, so it must not pull in torch or the framework.

Both scans are linear in the text: the box pattern cannot backtrack past a brace, and
:func:`parse_int` accepts at most 12 digits, so no completion makes a check slow; the worker's
hard time limit is the backstop.
"""

from __future__ import annotations

import re
from typing import Any

#: Every outcome the ``arith`` verifier reports.
OUTCOMES = ("correct", "wrong", "no_answer", "timeout", "error")

_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
_INT_RE = re.compile(r"[+-]?\d{1,12}")
_LAST_INT_RE = re.compile(r"(?<![\d-])-?\d{1,12}(?!\d)")


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` in ``text`` (stripped), or ``None``."""
    last = None
    for last in _BOXED_RE.finditer(text):  # only the last match is kept
        pass
    return last.group(1).strip() if last is not None else None


def parse_int(text: str | None) -> int | None:
    """``text`` as an integer (surrounding spaces allowed, at most 12 digits), or ``None``."""
    if text is None:
        return None
    text = text.strip()
    if not _INT_RE.fullmatch(text):
        return None
    return int(text)


def last_int(text: str) -> int | None:
    """The last integer written in ``text`` (at most 12 digits; a longer digit run is not one),
    or ``None``."""
    last = None
    for last in _LAST_INT_RE.finditer(text):
        pass
    return int(last.group(0)) if last is not None else None


def check(gold: str, text: str) -> dict[str, Any]:
    """``{"parsed", "outcome", "lenient"}`` of one completion: ``correct`` when its last box
    holds the integer ``gold`` (the strict reading, the reward), ``no_answer`` without a complete
    box, else ``wrong``; ``lenient`` reads the box when it holds an integer and otherwise the last
    integer written (the answer given in the wrong format: "so the answer is 32", or an empty
    ``\\boxed{}`` after it)."""
    parsed = last_boxed(text)
    expected = parse_int(gold)
    boxed = parse_int(parsed)
    lenient = expected is not None and (boxed if boxed is not None else last_int(text)) == expected
    if parsed is None:
        return {"parsed": None, "outcome": "no_answer", "lenient": lenient}
    correct = expected is not None and boxed == expected
    return {"parsed": parsed, "outcome": "correct" if correct else "wrong", "lenient": lenient}
