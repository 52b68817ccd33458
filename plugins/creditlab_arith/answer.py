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


def check(gold: str, text: str) -> dict[str, Any]:
    """``{"parsed", "outcome"}`` of one completion: ``correct`` when its last box holds the
    integer ``gold``, ``no_answer`` without a complete box, else ``wrong``."""
    parsed = last_boxed(text)
    if parsed is None:
        return {"parsed": None, "outcome": "no_answer"}
    expected = parse_int(gold)
    correct = expected is not None and parse_int(parsed) == expected
    return {"parsed": parsed, "outcome": "correct" if correct else "wrong"}
