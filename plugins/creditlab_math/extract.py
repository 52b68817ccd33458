"""Answer extraction and number normalization shared by the math tasks and verifiers.

Pure Python, no dependencies: safe to import in the parent process and in verifier workers.
"""

from __future__ import annotations

import re
from fractions import Fraction

#: Every outcome a math verifier reports, in reporting order.
OUTCOMES = ("correct", "wrong", "no_answer", "timeout", "error")

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number: "1,234,567" (comma groups of three only), "1234", "12.5", ".5", optional minus sign
# that is not a binary minus ("5-3" gives 5 and 3, "x = -3" gives -3).
_NUMBER_RE = re.compile(
    r"(?<![\d.])(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?![\d,])|\d+)(?:\.\d+)?(?!\d)"
    r"|(?<![\d.])(?:(?<![\w)\]}])-)?\.\d+"
)
_FRAC_RE = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$|^(-?\d+)/(-?\d+)$")


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``.

    Braces are matched, so nested groups such as ``\\boxed{\\frac{1}{2}}`` are returned whole.
    A truncated last box (no closing brace) is skipped in favour of the previous complete one.

    Args:
        text: Any text.

    Returns:
        The content between the braces, stripped, or ``None`` when there is no complete box.
    """
    for match in reversed(list(_BOXED_RE.finditer(text))):
        depth, start = 1, match.end()
        for pos in range(start, len(text)):
            char = text[pos]
            if char == "{" and text[pos - 1] != "\\":
                depth += 1
            elif char == "}" and text[pos - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[start:pos].strip()
    return None


def after_last_hashes(text: str) -> str | None:
    """Text after the last ``####`` marker (GSM8K's answer delimiter), stripped, or ``None``."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip()


def numbers_in(text: str) -> list[str]:
    """Every number written in ``text``, in order, commas removed (``"1,000"`` -> ``"1000"``)."""
    return [m.group(0).replace(",", "") for m in _NUMBER_RE.finditer(text)]


def to_number(text: str) -> Fraction | None:
    """Parse a normalized numeric string exactly (ints, decimals, ``a/b``, ``\\frac{a}{b}``).

    ``$``, commas, spaces, a trailing period and ``\\!``/``\\,`` LaTeX spacing are ignored, so
    ``"$1,000."`` parses as 1000 and ``"18.0"`` as 18.

    Args:
        text: A string expected to hold a single number.

    Returns:
        The value as an exact ``Fraction``, or ``None`` when ``text`` is not one number.
    """
    cleaned = text.strip()
    for junk in ("\\$", "$", ",", "\\!", "\\,", "\\ ", " ", "\n", "\t"):
        cleaned = cleaned.replace(junk, "")
    cleaned = cleaned.rstrip(".")
    if not cleaned:
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
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def first_number(text: str) -> Fraction | None:
    """The whole of ``text`` as a number if it is one, else the first number written in it."""
    whole = to_number(text)
    if whole is not None:
        return whole
    found = numbers_in(text)
    return to_number(found[0]) if found else None


def format_number(value: Fraction) -> str:
    """``Fraction`` -> a short string: ``18``, ``17.5``, or ``7/3`` when not a finite decimal."""
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    if Fraction(repr(as_float)) == value:
        return repr(as_float)
    return f"{value.numerator}/{value.denominator}"
