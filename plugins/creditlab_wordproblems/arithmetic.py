"""Exact arithmetic on the numbers of word problems: parsing numbers, evaluating ``+ - * /``
expressions with :class:`fractions.Fraction` through :mod:`ast` (read, never executed as code),
and deciding whether a written number is an exact value rounded to its own decimals."""

from __future__ import annotations

import ast
import re
from fractions import Fraction

#: A number as solutions write it: ``1,234.5`` (thousands in groups of three), ``12``, ``.25``.
NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
#: Longest expression evaluated (a hostile completion gets a bounded parse).
_MAX_CHARS = 400


#: Longest number read (a hostile completion's 10,000-digit "number" is not one).
MAX_DIGITS = 60


def to_number(text: str) -> Fraction | None:
    """``"1,234.50"`` -> ``Fraction(2469, 2)``; ``None`` when ``text`` is not a plain number or
    has more than :data:`MAX_DIGITS` characters."""
    text = text.replace(",", "").strip()
    if len(text) > MAX_DIGITS or not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", text):
        return None
    return Fraction(text)


def fmt(x: Fraction) -> str:
    """``72``; ``0.125`` for a decimal fraction (exactly, in integers); ``1/3`` for any other."""
    if x.denominator == 1:
        return str(x.numerator)
    places = next((k for k in range(1, 61) if 10**k % x.denominator == 0), None)
    if places is None:
        return f"{x.numerator}/{x.denominator}"
    digits = str(abs(x.numerator) * (10**places // x.denominator)).rjust(places + 1, "0")
    return f"{'-' if x < 0 else ''}{digits[:-places]}.{digits[-places:]}".rstrip("0")


def _value(node: ast.AST, ops: list[tuple[str, Fraction]] | None) -> Fraction:
    if isinstance(node, ast.Expression):
        return _value(node.body, ops)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand, ops)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOLS:
        left, right = _value(node.left, ops), _value(node.right, ops)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            value = left * right
        elif right == 0:
            raise ValueError("division by zero")
        else:
            value = left / right
        if ops is not None:
            ops.append((f"{fmt(left)}{_SYMBOLS[type(node.op)]}{fmt(right)}", value))
        return value
    raise ValueError(f"not plain arithmetic: {type(node).__name__}")


def evaluate(expr: str, ops: list[tuple[str, Fraction]] | None = None) -> Fraction:
    """The exact value of ``expr``: numbers, ``+ - * /``, parentheses (``x``, ``×``, ``÷``, the
    dashes ``–`` and ``−`` too).

    Args:
        expr: The expression, at most 400 characters.
        ops: When given, each operation is appended as ``(text, value)``, innermost first.

    Raises:
        ValueError: Anything else, a division by zero, or a longer text.
    """
    if len(expr) > _MAX_CHARS:
        raise ValueError(f"expression longer than {_MAX_CHARS} characters")
    text = expr.replace(",", "").replace("$", "").replace("×", "*").replace("÷", "/")
    text = text.replace("–", "-").replace("−", "-")  # a number with leading zeros (0900) stays unread
    text = re.sub(r"(?<=[\d)\s])[xX](?=[\s\d(.])", "*", text)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise ValueError(f"not an arithmetic expression: {expr!r}") from exc
    return _value(tree, ops)


def matches(exact: Fraction, stated: str, value: Fraction) -> bool:
    """``stated`` (whose value is ``value``) writes ``exact``: equal, or ``exact`` rounded or cut
    to the decimals ``stated`` shows (``10/3`` as ``3.33``, ``100/7`` as ``14.28`` or ``14.29``);
    a fraction ``a/b`` must be equal."""
    if "/" in stated:
        return exact == value
    decimals = len(stated.replace(",", "").partition(".")[2])
    if not decimals:
        return exact == value
    scale = 10**decimals
    cut = Fraction(int(exact * scale), scale)  # int() cuts toward zero
    return abs(exact - value) <= Fraction(1, 2 * scale) or cut == value
