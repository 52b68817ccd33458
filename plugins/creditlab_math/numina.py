"""The NuminaMath olympiad selection of the SRPO paper (arXiv 2605.25507), as pure functions.

The SRPO authors' preparation script (github.com/Ankur-Samanta/SRPO,
``training/scripts/prepare_datasets.py``, dataset ``numinamath_olympiads``) reads
``AI-MO/NuminaMath-CoT`` (split ``train``, in stream order), keeps the rows whose ``source`` is
``olympiads``, takes the content of the *last* ``\\boxed{`` of the solution as the gold answer,
repairs a missing backslash in front of ``frac``/``sqrt``/``log``/``ln``, drops answers that are
not reliably verifiable (the rules of :func:`unverifiable_reason`), shuffles the kept rows with
seed 42 (pandas ``DataFrame.sample(frac=1, random_state=42)``, i.e. the permutation of NumPy's
``RandomState(42)``) and takes the first 400 as train and the next 100 as test.

This module reimplements that selection rule for rule, so the same dataset revision gives the same
400/100 problems. Where it differs (all reported in the preparation's ``prepare.json``):

* rows are validated (a row without ``source``, or an olympiad row whose ``problem``/``solution``
  is not a string, is an error naming the row), and olympiad rows with an empty problem are
  dropped (``empty_problem``; the official script would keep them);
* each drop is counted by reason, not only "no boxed" / "not verifiable";
* too few kept rows for the requested split is an error (the official script shrinks the train
  split instead).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from creditlab import InputError

HUB_DATASET = "AI-MO/NuminaMath-CoT"
SOURCE = "olympiads"
MAX_ANSWER_CHARS = 60

_BOX = "\\boxed{"
_BARE_AT_START = re.compile(r"^(frac|sqrt|log|ln)\{")
_BARE_AFTER_SPACE = re.compile(r"(?<=\s)(frac|sqrt)\{")
_LATEX_COMMAND = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[a-zA-Z]{3,}")
_CHOICE = re.compile(r"[A-E]")
_MARKUP = re.compile(r"\\text|\\mathrm")  # \textbf starts with \text
_LEADING_JUNK = re.compile(r"[};.,:~\-*]")
_PERCENT_TILDE_OR = re.compile(r"%|~|\*\*|\bor\b")
_UNITS = re.compile(r"\b(?:sq|cm|yd|km|kg|lb|oz|ft|mi)\b|cm[²³]|m[²³]")


class PrepareError(InputError):
    """Input that cannot be prepared; the message says what was wrong and what would be right."""


def last_boxed_answer(solution: str) -> str:
    """The content of the last ``\\boxed{`` of ``solution`` up to its matching brace.

    Braces are counted plainly (no escapes). When the last box never closes, or there is no box,
    the result is ``""`` (an earlier box is *not* used), as in the official script.
    """
    start = solution.rfind(_BOX)
    if start < 0:
        return ""
    begin, depth = start + len(_BOX), 1
    for pos in range(begin, len(solution)):
        char = solution[pos]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return solution[begin:pos]
    return ""


def repair_answer(answer: str) -> str:
    """``frac{`` / ``sqrt{`` / ``log{`` / ``ln{`` at the start, and ``frac{`` / ``sqrt{`` after
    whitespace, get their missing backslash."""
    answer = _BARE_AT_START.sub(r"\\\1{", answer)
    return _BARE_AFTER_SPACE.sub(r"\\\1{", answer)


def unverifiable_reason(answer: str) -> str | None:
    """Why ``answer`` is not a reliably verifiable final answer, or ``None`` when it is.

    Rules (the official whitelist, checked in its order): at most 60 characters; balanced ``{}``
    and ``()``; a single letter A-E is accepted as a multiple-choice answer; otherwise no English
    word of three or more letters once LaTeX commands are removed (prose, proofs), at least one
    digit, no ``\\text``/``\\mathrm`` markup, no leading punctuation, no ``%``, ``~``, ``**`` or
    ``or``, and no units (sq, cm, yd, km, kg, lb, oz, ft, mi, cm²/m² ...).

    Returns:
        ``None``, or one of ``empty``, ``too_long``, ``unbalanced``, ``words``, ``no_digit``,
        ``markup``, ``leading_punctuation``, ``percent_tilde_or``, ``units``.
    """
    if not answer:
        return "empty"
    if len(answer) > MAX_ANSWER_CHARS:
        return "too_long"
    if answer.count("{") != answer.count("}") or answer.count("(") != answer.count(")"):
        return "unbalanced"
    if _CHOICE.fullmatch(answer):
        return None
    checks = (
        ("words", _WORD.search(_LATEX_COMMAND.sub("", answer))),
        ("no_digit", not re.search(r"\d", answer)),
        ("markup", _MARKUP.search(answer)),
        ("leading_punctuation", _LEADING_JUNK.match(answer)),
        ("percent_tilde_or", _PERCENT_TILDE_OR.search(answer)),
        ("units", _UNITS.search(answer)),
    )
    return next((reason for reason, failed in checks if failed), None)


@dataclass
class Selection:
    """The kept rows of one pass over the dataset, and what happened to the others.

    Attributes:
        rows: Kept rows in dataset order: ``{"id", "problem", "answer", "solution",
            "source_index"}`` (``source_index``: 0-based position in the dataset).
        total: Rows read.
        matched: Rows whose ``source`` matched.
        dropped: Matched rows dropped, by reason (``no_boxed``, ``empty_problem`` and the
            reasons of :func:`unverifiable_reason`).
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0
    matched: int = 0
    dropped: Counter = field(default_factory=Counter)


def _field(row: Mapping[str, Any], key: str, index: int, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        present = ", ".join(sorted(str(k) for k, v in row.items() if v is not None)) or "(none)"
        got = "missing" if value is None else f"{type(value).__name__}, not a string"
        raise PrepareError(
            f"{where}, row {index + 1}: field '{key}' is {got} (the row has: {present}). "
            f"Expected NuminaMath-CoT rows with string fields source, problem and solution."
        )
    return value


def select(rows: Iterable[Mapping[str, Any]], where: str, source: str = SOURCE) -> Selection:
    """Keep the rows of ``source`` whose solution boxes a verifiable answer (see the module
    docstring), in the order read.

    Args:
        rows: NuminaMath-format rows (``source``, ``problem``, ``solution``; others ignored).
        where: Where the rows come from, for error messages.
        source: The ``source`` value to keep.

    Raises:
        PrepareError: A row that is not a mapping, has no string ``source``, or (when it matches)
            no string ``problem``/``solution``.
    """
    out = Selection()
    for index, row in enumerate(rows):
        out.total += 1
        if not isinstance(row, Mapping):
            raise PrepareError(f"{where}, row {index + 1}: a {type(row).__name__}, not an object")
        if _field(row, "source", index, where) != source:
            continue
        out.matched += 1
        problem = _field(row, "problem", index, where)
        solution = _field(row, "solution", index, where)
        answer = last_boxed_answer(solution)
        if not answer:
            out.dropped["no_boxed"] += 1
            continue
        answer = repair_answer(answer)
        reason = unverifiable_reason(answer)
        if reason is None and not problem.strip():
            reason = "empty_problem"
        if reason is not None:
            out.dropped[reason] += 1
            continue
        out.rows.append({
            "id": f"numina-{source}-{len(out.rows)}", "problem": problem, "answer": answer,
            "solution": solution, "source_index": index,
        })
    return out


def seeded_split(
    rows: Sequence[dict[str, Any]], n_train: int, n_test: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shuffle ``rows`` with NumPy's ``RandomState(seed).permutation`` (what pandas'
    ``sample(frac=1, random_state=seed)`` draws) and cut the first ``n_train`` and the next
    ``n_test`` rows.

    Raises:
        PrepareError: Fewer rows than ``n_train + n_test``, or a negative size.
    """
    import numpy as np

    if n_train < 0 or n_test < 0:
        raise PrepareError(f"split sizes must be >= 0, got train={n_train}, test={n_test}")
    if n_train + n_test > len(rows):
        raise PrepareError(
            f"only {len(rows)} rows were kept, fewer than the {n_train} train + {n_test} test "
            f"requested: lower --n-train/--n-test, or check that the input is the whole dataset."
        )
    order = np.random.RandomState(seed).permutation(len(rows))
    shuffled = [rows[int(i)] for i in order]
    return shuffled[:n_train], shuffled[n_train : n_train + n_test]
