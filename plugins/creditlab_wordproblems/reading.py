"""Reading the computations a model writes in one thought of a word-problem solution.

A *computation* is arithmetic, ``=``, then a number: ``48/2 = 24``, ``$0.2 x 50 = $10``, a chain
``12 * 2 = 24 - 4 = 20`` (one per ``=``), ``1/2 * 1/2 = 1/4`` (a fraction stated). Solutions write
units among the numbers (``60 students x 2/3 = 40 students``, ``72 cubic ft * 3/4 = 54``,
``$6/day``), so up to four words between numbers and operators are read as units and left out,
and a computation is *right* when some reading of its left side, the whole or a tail of it, is
the stated number: ``40 students x $6/day = $240`` reads ``40 x 6``. Only when no reading gives
the stated number is it *wrong*. Algebra (``100 = 5A``, ``2/3 * x = 12``) and lone numbers are
not computations. Money signs and thousands separators are ignored.

A percentage (``25%``, ``20 %``) is one number with two readings, a fraction (``4 * 25% = 1``,
``100% - 40% = 60%``) and the number written (``3/21 * 100% = 14.28``, ``5/20*100 = 25%``):
solutions use both, so a computation is right when either gives the stated number (a stated
percentage, too, may be the number or the fraction), and wrong only when neither does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from creditlab_wordproblems.arithmetic import NUM, evaluate, matches, to_number

#: Tokens with their positions: clock times (``6:00``, not arithmetic), mixed numbers (``1 1/2``),
#: numbers, words, operators, ``=``, any other character.
_TOKEN = re.compile(rf"(?P<other>\d{{1,2}}:\d\d)|(?P<mixed>\d+ \d+/\d+)(?![\d/])|(?P<num>(?:{NUM})(?:\s?%)?)|(?P<word>[A-Za-z]+(?:['’-][A-Za-z]+)*)|(?P<op>[-–−+*/×÷()])"
                    rf"|(?P<eq>=)|(?P<rest>\S)")
#: Words read as units when they sit between numbers and operators (at most this many in a row).
_MAX_UNIT_WORDS = 4
#: Most numbers and operators read before one ``=`` (longer runs are not solution arithmetic).
_MAX_ITEMS = 120
_PERCENT = re.compile(rf"({NUM})%")


def _number(token: str) -> Fraction | None:
    """A number token's value as written (``25%`` is 25)."""
    return to_number(token.rstrip("%"))


def _values(expr: str, ops: list[tuple[str, Fraction]] | None = None) -> list[Fraction]:
    """``expr``'s values: one, or two when it holds a percentage (as a fraction, then as the
    number written). Raises ValueError as :func:`evaluate`."""
    if "%" not in expr:
        return [evaluate(expr, ops)]
    out = [evaluate(_PERCENT.sub(r"(\1/100)", expr), ops)]
    try:
        out.append(evaluate(expr.replace("%", "")))
    except ValueError:
        pass
    return out


@dataclass(frozen=True)
class Computation:
    """One ``expression = number`` of a thought.

    Attributes:
        expr: The reading of the left side that was judged (units left out).
        stated: The number written after ``=`` (a fraction ``a/b`` too).
        value: ``stated`` as an exact number.
        operands: The numbers of ``expr``.
        right: Some reading of the left side gives ``stated`` (to its decimals).
        inner: The values of the operations inside ``expr`` and the parts of a stated fraction
            (``8 * 2 + 4 * 5 = 16 + 20 = 36`` may go on with 16 and 20).
        percents: The operands written as percentages (``25%`` is the operand 25 here), and the
            stated number when it is one: either reading of them is theirs.
    """

    expr: str
    stated: str
    value: Fraction
    operands: tuple[Fraction, ...]
    right: bool
    inner: frozenset[Fraction] = frozenset()
    percents: frozenset[Fraction] = frozenset()


def _tokens(text: str) -> list[tuple[str, str, int, int]]:
    """``(kind, text, start, end)``; ``x`` between a number (or ``)``/a unit) and a number or
    ``(`` is multiplication, otherwise a word."""
    raw = []
    for m in _TOKEN.finditer(text):
        if m.group(0) == "(" and raw and raw[-1][0] == "num" and raw[-1][3] == m.start():
            raw.append(("op", "*", m.start(), m.start()))  # 2(50+100) is 2 * (50+100)
        if m.lastgroup == "mixed":  # 1 1/2 -> ( 1 + 1 / 2 ), one number
            whole, fraction = m.group(0).split(" ")
            top, bottom = fraction.split("/")
            raw += [("op", "(", m.start(), m.start()), ("num", whole, m.start(), m.start()),
                    ("op", "+", m.start(), m.start()), ("num", top, m.start(), m.start()),
                    ("op", "/", m.start(), m.start()), ("num", bottom, m.start(), m.end()),
                    ("op", ")", m.end(), m.end())]
        else:
            raw.append((m.lastgroup, m.group(0).replace(" ", ""), m.start(), m.end()))
    out = []
    for i, (kind, tok, start, end) in enumerate(raw):
        if kind == "word" and tok in ("x", "X"):
            after = raw[i + 1] if i + 1 < len(raw) else None
            before = out[-1] if out else None
            opens = after is not None and (after[0] == "num" or after[1] == "(")
            closes = before is not None and (before[0] in ("num", "word") or before[1] == ")")
            if opens and closes:
                kind = "op"
        out.append((kind, tok, start, end))
    return out


def _stated(tokens, i: int, text: str) -> tuple[str, Fraction] | None:
    """The number after the ``=`` at ``tokens[i]`` (a glued fraction ``1/4`` too) as ``(text,
    value)``; ``None`` for algebra (``5A``: one letter glued to it), no number, or a number too
    long to be one."""
    if i + 1 >= len(tokens) or tokens[i + 1][0] != "num":
        return None
    _, tok, _, end = tokens[i + 1]
    glued = re.match(r"[A-Za-z]+", text[end:])
    if glued and len(glued.group(0)) == 1 and glued.group(0) not in "gmsh":
        return None  # algebra: 5A, 2p, 3x (a glued unit, 60g, 5m, is a value)
    value = _number(tok)
    if value is None:
        return None
    if tok.endswith("%"):
        return tok, value
    if (i + 3 < len(tokens) and tokens[i + 2][1] == "/" and tokens[i + 3][0] == "num"
            and tokens[i + 2][2] == end and tokens[i + 3][2] == tokens[i + 2][3]):
        denominator = to_number(tokens[i + 3][1])
        if denominator:
            return f"{tok}/{tokens[i + 3][1]}", value / denominator
    return tok, value


def _chained(tokens, i: int) -> tuple[str, Fraction] | None:
    """The right side of the ``=`` at ``tokens[i]`` when it is itself arithmetic that another
    ``=`` follows (``... = 46 - 4 = 42``, ``... = $80+$10 = $90``): ``(expression, value)``. The
    left side is right when it equals either the whole right side or the right side's first number
    (the running value of a chain written ``12 * 2 = 24 - 4 = 20``)."""
    items, j, words = [], i + 1, 0
    while j < len(tokens) and tokens[j][0] != "eq":
        kind, tok = tokens[j][0], tokens[j][1]
        if kind in ("num", "op"):
            items.append((kind, tok))
            words = 0
        elif kind == "word" and words < _MAX_UNIT_WORDS and items:
            words += 1
        else:
            return None
        j += 1
    nums = sum(k == "num" for k, _ in items)
    if j >= len(tokens) or nums < 2 or not any(k == "op" and t not in "()" for k, t in items):
        return None
    expr = " ".join(t for _, t in items)
    try:
        return expr, _values(expr)[0]
    except ValueError:
        return None


def _variable(tokens, j: int) -> bool:
    """``tokens[j]`` is one letter used as a variable: after a number or a closing parenthesis
    (``5A``, ``(3/2)x``, ``1 3/4 t``), beside an operator (``x + 600``, ``* p``) or just before the
    ``=`` (``b = (1/3)*180``); an article or a pronoun (``a``, ``I``) before the arithmetic is not."""
    _, tok, start, end = tokens[j]
    if len(tok) != 1 or tok in "gmshL":  # grams, metres, seconds, hours, litres: units
        return False
    before = tokens[j - 1] if j > 0 else None
    after = tokens[j + 1] if j + 1 < len(tokens) else None
    follows = before is not None and (before[0] == "num" or before[1] == ")")
    beside = any(t is not None and t[0] == "op" and t[1] not in "()" for t in (before, after))
    return follows or beside or (after is not None and after[0] == "eq")


def _left(tokens, i: int) -> list[tuple[str, str]]:
    """The numbers and operators before the ``=`` at ``tokens[i]``, units left out, as
    ``(kind, text)`` (at most :data:`_MAX_ITEMS`, the nearest); empty for algebra."""
    items: list[tuple[str, str]] = []
    j, words = i - 1, 0
    while j >= 0 and len(items) < _MAX_ITEMS:
        kind, tok = tokens[j][0], tokens[j][1]
        if kind == "num" and tok.endswith("%") and j > 1 and tokens[j - 1][1] == "/" \
                and tokens[j - 2][0] == "word" and words < _MAX_UNIT_WORDS:
            words += 1  # "3 degrees/5% increase": a unit, per 5% increase
            j -= 1
        elif kind in ("num", "op"):
            items.append((kind, tok))
            words = 0
        elif kind == "word" and _variable(tokens, j):
            return []  # algebra, not a computation
        elif kind == "word" and words < _MAX_UNIT_WORDS and j > 0 and tokens[j - 1][0] in ("num", "op", "word"):
            words += 1  # a unit: left out; "/day" (per day) with its slash
            if tokens[j - 1][1] == "/" and j > 1 and tokens[j - 2][0] in ("num", "word"):
                j -= 1
        else:
            break
        j -= 1
    items.reverse()
    return items


def _readings(items: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The whole left side and its tails, each trimmed of operators it cannot start or end with,
    longest first; only those with a number on each side of an operator."""
    out = []
    for start in range(len(items)):
        part = items[start:]
        while part and part[0][0] == "op" and part[0][1] != "(":
            part = part[1:]
        while part and part[-1][0] == "op" and part[-1][1] != ")":
            part = part[:-1]
        nums = sum(k == "num" for k, _ in part)
        if nums >= 2 and any(k == "op" and t not in "()" for k, t in part) and part not in out:
            out.append(part)
    return out


def _agrees(value: Fraction, stated: tuple[str, Fraction], chained: bool) -> bool:
    """A left side's ``value`` is what the right side states: to its decimals; for a chain, the
    whole right side or its first number (the running value: ``12 * 2 = 24 - 4 = 20``)."""
    text, right = stated
    if not chained and text.endswith("%"):  # 5/20*100 = 25% and 1 - 20% = 80% are both right
        return matches(value, text[:-1], right) or matches(value * 100, text[:-1], right)
    if not chained:
        return matches(value, text, right)
    return value == right or value == _number(text.split()[0].strip("()") or "x")


def _parts(expr: str) -> set[Fraction]:
    """The values of the operations inside ``expr`` (its last one aside) and its numbers."""
    ops: list[tuple[str, Fraction]] = []
    _values(expr, ops)
    numbers = {_number(t) for t in re.split(r"[\s()+*/-]+", expr) if t}
    return {v for _, v in ops[:-1]} | {n for n in numbers if n is not None}


def computations(thought: str) -> list[Computation]:
    """The computations of one thought, in order (chains give one per ``=``)."""
    text = thought.replace("$", " ").replace("€", " ").replace("£", " ")
    tokens = _tokens(text)
    found = []
    for i, (kind, *_rest) in enumerate(tokens):
        if kind != "eq":
            continue
        chained = _chained(tokens, i)
        stated = chained if chained is not None else _stated(tokens, i, text)
        if stated is None:
            continue
        valid = []  # (expression, value, its (kind, text) items), longest reading first
        for part in _readings(_left(tokens, i)):
            expr = " ".join(t for _, t in part)
            try:
                valid.append((expr, _values(expr), part))
            except ValueError:
                continue
        if not valid:
            continue
        hit = next((v for v in valid if any(_agrees(x, stated, chained is not None) for x in v[1])), None)
        expr, _, part = hit or valid[0]
        operands = tuple(_number(t) for k, t in part if k == "num")
        inner = _parts(expr) | (_parts(stated[0]) if chained else set())
        if not chained and "/" in stated[0]:  # a stated fraction's numerator and denominator
            inner |= {to_number(t) for t in stated[0].split("/")}
        percents = {_number(t) for k, t in part if k == "num" and t.endswith("%")}
        if not chained and stated[0].endswith("%"):  # = 80% may go on as 0.8
            inner |= {stated[1] / 100}
            percents.add(stated[1])
        found.append(Computation(expr, stated[0], stated[1], operands, hit is not None, frozenset(inner),
                                 frozenset(percents)))
    return found
