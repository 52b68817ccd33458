"""Answer extraction and number normalization shared by the math tasks and verifiers.

Pure Python, no dependencies: safe to import in the parent process and in verifier workers.

Everything here is adversarial-input safe by construction: every scan is linear in the text
(one regex pass, or one pass over brace tokens), and numbers are bounded before they are built
(:data:`MAX_NUMBER_CHARS`, :data:`MAX_EXPONENT`), so no completion can make a check take more
than a few seconds even at 10 MB. The verifiers still run these in worker processes with a hard
time limit (:mod:`creditlab_math.pool`) as a backstop.
"""

from __future__ import annotations

import collections
import re
from fractions import Fraction
from typing import Any

#: Every outcome a math verifier reports, in reporting order.
OUTCOMES = ("correct", "wrong", "no_answer", "timeout", "error")

#: Longest numeric literal :func:`to_number` parses (after removing ``$``, commas and spaces).
#: GSM8K's answers have at most 9 characters (``1,450,000``; the largest is 2,880,000), and the
#: ``gsm8k`` verifier's relative tolerance (1e-6) ignores every digit past about the 7th
#: significant one, so 100 characters only ever rejects garbage such as 10 MB of digits.
MAX_NUMBER_CHARS = 100
#: Largest decimal exponent :func:`to_number` accepts (``1e308``, ``2.5E-12``): the range of a
#: double. ``Fraction("1e99999999")`` builds a 100-million-digit integer (minutes of CPU); no
#: GSM8K answer has an exponent at all.
MAX_EXPONENT = 308

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# The tokens that matter inside a box: another box opening, or an unescaped brace.
_BRACE_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|(?<!\\)[{}]")
# A number: "1,234,567" (comma groups of three only), "1234", "12.5", ".5", optional minus sign
# that is not a binary minus ("5-3" gives 5 and 3, "x = -3" gives -3). The comma alternative
# never starts at a three-digit group that continues a comma chain (",234,|567"): from there it
# would end where the chain's first attempt ended and fail the same way, and retrying it at every
# group made "1,234,234,...,2345" quadratic. The matches are the same as without that guard.
_NUMBER_RE = re.compile(
    r"(?<![\d.])(?:(?<![\w)\]}])-)?"
    r"(?:(?!(?<=,\d{3},)\d{3}(?!\d))\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?!\d)"
    r"|(?<![\d.])(?:(?<![\w)\]}])-)?\.\d+"
)
# A character that no number contains (a safe place to cut a text before searching its tail).
_NOT_IN_NUMBER_RE = re.compile(r"[^\d,.\-]")
_DIGIT_RE = re.compile(r"\d")
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$|^(-?\d+)/(-?\d+)$")
_EXPONENT_RE = re.compile(r"[eE]([-+]?[\d_]+)$")


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched (``\\{`` and ``\\}`` do not count), so nested groups such as
    ``\\boxed{\\frac{1}{2}}`` are returned whole. A truncated last box (no closing brace) is
    skipped in favour of the previous complete one; of nested boxes the inner one is the last.
    One pass over the text: between boxes it jumps to the next ``\\boxed{``, inside one it
    follows the braces with a stack of the open ones.

    Args:
        text: Any text.

    Returns:
        The content between the braces, stripped, or ``None`` when there is no complete box.
    """
    best_start = best_end = -1
    pos = 0
    while (box := _BOXED_RE.search(text, pos)) is not None:
        opens = [box.end()]  # per open brace: the content start of a box, or -1
        for token in _BRACE_RE.finditer(text, box.end()):
            char = text[token.start()]
            if char != "}":
                opens.append(token.end() if char == "\\" else -1)
                continue
            start = opens.pop()
            if start > best_start:
                best_start, best_end = start, token.start()
            if not opens:
                pos = token.end()
                break
        else:  # the text ended inside a box: no later box can close either
            break
    return text[best_start:best_end].strip() if best_start >= 0 else None


def after_last_hashes(text: str) -> str | None:
    """Text after the last ``####`` marker (GSM8K's answer delimiter), stripped, or ``None``."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip()


def numbers_in(text: str) -> list[str]:
    """Every number written in ``text``, in order, commas removed (``"1,000"`` -> ``"1000"``)."""
    return [m.group(0).replace(",", "") for m in _NUMBER_RE.finditer(text)]


def last_number(text: str) -> str | None:
    """The last number written in ``text`` (as :func:`numbers_in` would list it), or ``None``.

    Searches tails of growing length, each cut just after a character that no number contains,
    so that no number straddles the cut and the tail's last number is the text's: a long text
    with a number near its end costs only its tail.
    """
    size = 4096
    while True:
        cut = len(text) - size
        if cut > 0:
            boundary = _NOT_IN_NUMBER_RE.search(text, max(0, cut - size), cut)
            if boundary is None:  # no such character nearby: a longer tail
                size *= 8
                continue
            cut = boundary.end()
        else:
            cut = 0
        if _DIGIT_RE.search(text, cut) is not None:  # every number has a digit: a fast pre-check
            found = collections.deque(_NUMBER_RE.finditer(text, cut), maxlen=1)
            if found:
                return found[0].group(0).replace(",", "")
        if cut == 0:
            return None
        size *= 8


def to_number(text: str) -> Fraction | None:
    """Parse a normalized numeric string exactly (ints, decimals, ``a/b``, ``\\frac{a}{b}``).

    ``$``, commas, spaces, a trailing period and ``\\!``/``\\,`` LaTeX spacing are ignored, so
    ``"$1,000."`` parses as 1000 and ``"18.0"`` as 18. Literals longer than
    :data:`MAX_NUMBER_CHARS` or with an exponent beyond :data:`MAX_EXPONENT` are not numbers
    here (see those bounds for why no real answer is affected).

    Args:
        text: A string expected to hold a single number.

    Returns:
        The value as an exact ``Fraction``, or ``None`` when ``text`` is not one number.
    """
    cleaned = text.strip()
    if len(cleaned) > 10 * MAX_NUMBER_CHARS:  # too long even before removing spaces and commas
        return None
    for junk in ("\\$", "$", ",", "\\!", "\\,", "\\ ", " ", "\n", "\t"):
        cleaned = cleaned.replace(junk, "")
    cleaned = cleaned.rstrip(".")
    if not cleaned or len(cleaned) > MAX_NUMBER_CHARS:
        return None
    frac = _FRAC_RE.match(cleaned)
    if frac:
        sign, num, den = (frac.group(1), frac.group(2), frac.group(3))
        if num is None:
            sign, num, den = "", frac.group(4), frac.group(5)
        if int(den) == 0:
            return None
        value = Fraction(int(num), int(den))
        return -value if sign else value
    exponent = _EXPONENT_RE.search(cleaned)
    if exponent and abs(int(exponent.group(1).replace("_", "") or "0")) > MAX_EXPONENT:
        return None
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def first_number(text: str) -> Fraction | None:
    """The whole of ``text`` as a number if it is one, else the first number written in it."""
    whole = to_number(text)
    if whole is not None:
        return whole
    found = _NUMBER_RE.search(text)
    return to_number(found.group(0).replace(",", "")) if found else None


def format_number(value: Fraction) -> str:
    """``Fraction`` -> a short string: ``18``, ``17.5``, or ``7/3`` when not a finite decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if Fraction(repr(as_float)) == value:
        return repr(as_float)
    return f"{value.numerator}/{value.denominator}"


def gsm8k_check(gold_text: str, text: str, options: dict[str, Any]) -> dict[str, Any]:
    """The ``gsm8k`` verifier's check of one completion (run in its worker processes).

    Gold: the number after the last ``####`` of ``gold_text`` (or all of it). Prediction, first
    that exists: the number after the last ``####`` of ``text``; the number in the last
    ``\\boxed{}``; the last number of the text (when ``options["fallback_last_number"]``).
    They match when ``|pred - gold| <= options["tolerance"] * max(1, |gold|)`` (exactly).

    Returns:
        ``{"outcome", "parsed", "source"}`` plus ``"error"`` for the ``error`` outcome.
    """
    gold_part = after_last_hashes(gold_text)
    gold = to_number(gold_part if gold_part is not None else gold_text)
    if gold is None:
        return {"outcome": "error", "parsed": None, "source": None,
                "error": f"the reference answer {gold_text[:200]!r} is not a number"}
    pred, source = None, None
    after = after_last_hashes(text)
    if after is not None:
        pred, source = first_number(after), "####"
    if pred is None:
        boxed = last_boxed(text)
        if boxed is not None:
            pred, source = first_number(boxed), "boxed"
    if pred is None and options["fallback_last_number"]:
        found = last_number(text)
        if found is not None:
            pred, source = to_number(found), "last_number"
    if pred is None:
        return {"outcome": "no_answer", "parsed": None, "source": None}
    close = abs(pred - gold) <= Fraction(options["tolerance"]) * max(1, abs(gold))
    return {"outcome": "correct" if close else "wrong", "parsed": format_number(pred),
            "source": source}
