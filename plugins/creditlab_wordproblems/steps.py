"""Gold steps of real word problems, and the step oracle that judges a model's steps by them.

**Gold steps.** GSM8K's worked solutions carry calculator annotations, ``<<48/2=24>>``: each is one
gold step, an expression over the question's numbers and earlier gold values, and its value.
SVAMP stores one equation per problem, ``( ( 692.0 + 692.0 ) - 458.0 )``: each operation of it is
one gold step, innermost first. Both are read with :mod:`ast` (never evaluated as code) and
computed exactly with :class:`fractions.Fraction`.

**A model's steps.** The thoughts of a solution (its lines under the ``newline`` segmenter), and
the computations written in them (``expression = number``; :mod:`creditlab_wordproblems.reading`
says how units between the numbers are read). A thought with no computation (prose, a restated
number) is never wrong on its own.

**When a step is wrong** (the rule the oracle applies, thought by thought, in order):

1. *Arithmetic.* A computation no reading of which gives the number stated after ``=``, allowing
   the rounding or cutting of the stated number's decimals (``10/3 = 3.33`` is right,
   ``10/3 = 3.4`` is not); a percentage reads as the fraction or as the number written
   (``4 * 25% = 1`` and ``3/21 * 100% = 14.28`` are right, ``4 * 25% = 9`` is not).
2. *A wrong value.* A computation with an operand that is none of: a number of the question
   (digits, fractions, number words, ``half``/``twice``/``dozen``, a percentage also as the
   fraction, one minus it and one plus it), a number the gold steps use or produce, ``0``, ``1``
   or ``100``, or a value (or a part of one) that a right earlier computation produced; an
   operand written as a percentage is known when either its number or its fraction is.
3. *Off the path.* A thought with a computation whose value is neither a gold value nor the
   answer, unless a later right computation builds on that value and lands on a gold value or the
   answer (another order of the same solution: ``4 + 5 = 9`` then ``9 + 3 = 12`` where the gold
   steps are ``3 + 4 = 7``, ``7 + 5 = 12``). A percentage is on the path as the number or as
   the fraction (``100% - 20% = 80%`` where the gold steps use 0.8); a value that rounds or cuts
   to a whole answer (``3/21 * 100% = 14.28`` for 14) and a computation that states a
   percentage (``100% - 40% = 60%``: a rate, often used in words or algebra next) are not held
   to the path.
4. *The answer.* When no thought is wrong by 1-3 but the final answer (read as the ``gsm8k``
   verifier reads it: after ``####``, else the last ``\\boxed{}``, else the last number) is not
   the gold answer, the thought that states it is wrong (the last
   thought when the solution states none).

The oracle returns the first wrong thought's index, ``None`` when none is wrong. This is a
checkable reading, not a proof: it cannot see reasoning that is right in words and wrong in
intent, and a correct step of an unusual solution path that never meets a gold value counts as
off the path. ``docs/real-problems.md`` measures how often it agrees with a reading by hand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from creditlab_math.extract import after_last_hashes, first_number, last_boxed, last_number
from creditlab_math.extract import to_number as read_number

from creditlab_wordproblems.arithmetic import NUM, evaluate, fmt, matches, to_number
from creditlab_wordproblems.reading import computations

_ANNOTATION = re.compile(r"<<([^<>]*)>>")
_NUMBER = re.compile(rf"(?<![\w.])-?(?:{NUM})")
_FRACTION = re.compile(rf"(?<![\w.])({NUM})\s*/\s*({NUM})(?![\w.])")
_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
    "hundred": 100, "thousand": 1000, "dozen": 12, "half": 2, "halves": 2, "twice": 2,
    "double": 2, "doubled": 2, "triple": 3, "tripled": 3, "thrice": 3, "quarter": 4,
    "quarters": 4, "third": 3, "thirds": 3, "fourth": 4, "fifth": 5, "week": 7, "weeks": 7,
}
_PARTS = ("half", "halves", "quarter", "quarters", "third", "thirds", "fourth", "fifth")
#: Numbers every solution may use without the question naming them.
_ALWAYS = (Fraction(0), Fraction(1), Fraction(100))


@dataclass(frozen=True)
class GoldStep:
    """One gold step: ``expr`` over the question's numbers and earlier values, and its ``value``."""

    expr: str
    value: Fraction


def gsm8k_steps(solution: str) -> tuple[GoldStep, ...]:
    """The gold steps of a GSM8K worked solution, one per calculator annotation ``<<expr=value>>``.

    Raises:
        ValueError: An annotation that is not ``arithmetic=number`` or whose expression does not
            give its value (a few of GSM8K's; the data build counts and skips them).
    """
    steps = []
    for body in _ANNOTATION.findall(solution):
        expr, sep, stated = body.rpartition("=")
        value = to_number(stated)
        if not sep or value is None:
            raise ValueError(f"annotation <<{body}>> is not expression=number")
        if not matches(evaluate(expr), stated.strip(), value):
            raise ValueError(f"annotation <<{body}>>: {expr} is {fmt(evaluate(expr))}, not {stated}")
        steps.append(GoldStep(expr.strip(), value))
    return tuple(steps)


def solution_steps(solution: str) -> tuple[GoldStep, ...]:
    """The gold steps of a worked solution: its calculator annotations (:func:`gsm8k_steps`),
    then every other right computation its text writes and the operations inside it (GSM8K
    annotates most steps, not all: ``1/2 * 1/2 = 1/4``; ``5 x 3 = <<15=15>>15``)."""
    steps = list(gsm8k_steps(solution))
    seen = {(s.expr, s.value) for s in steps}
    for line in strip_annotations(solution).splitlines():
        for comp in computations(line):
            if not comp.right or "%" in comp.expr:  # a percentage operand: two readings, no one gold value
                continue
            ops: list[tuple[str, Fraction]] = []
            evaluate(comp.expr, ops)
            for text, value in [*ops[:-1], (comp.expr.replace(" ", ""), comp.value)]:
                if (text, value) not in seen:
                    steps.append(GoldStep(text, value))
                    seen.add((text, value))
    return tuple(steps)


def strip_annotations(solution: str) -> str:
    """A GSM8K solution without its calculator annotations (what a model is taught to write)."""
    return _ANNOTATION.sub("", solution)


def equation_steps(equation: str) -> tuple[GoldStep, ...]:
    """The gold steps of one SVAMP-style equation, ``( ( 692.0 + 692.0 ) - 458.0 )``: each
    operation, innermost first, with its exact value."""
    ops: list[tuple[str, Fraction]] = []
    evaluate(equation, ops)
    return tuple(GoldStep(text, value) for text, value in ops)


def question_numbers(question: str) -> set[Fraction]:
    """Numbers a question gives: in digits, as fractions ``a/b``, in words (``three``, ``half``:
    2 and 1/2, ``dozen``), a percentage ``p`` also as ``p/100``, ``1 - p/100`` and ``1 + p/100``."""
    found: set[Fraction] = set()
    for match in _NUMBER.finditer(question):
        value = to_number(match.group(0).lstrip("-"))
        if value is None:
            continue
        found.add(value)
        after = question[match.end(): match.end() + 9].lstrip()
        if after.startswith(("%", "percent")):  # p% of, p% less, p% more
            found |= {value / 100, 1 - value / 100, 1 + value / 100}
    for match in _FRACTION.finditer(question):
        numerator, denominator = to_number(match.group(1)), to_number(match.group(2))
        if numerator is not None and denominator:
            found.add(numerator / denominator)
    for word in re.findall(r"[a-z]+", question.lower()):
        if word in _WORDS:
            found.add(Fraction(_WORDS[word]))
            if word in _PARTS:
                found.add(1 / Fraction(_WORDS[word]))
    return found


@dataclass(frozen=True)
class Verdict:
    """The oracle's reading of one thought: ``wrong`` with ``why`` (``arithmetic``, ``value``,
    ``off_path``, ``answer``) and a ``detail``, or right (``why`` empty)."""

    wrong: bool
    why: str = ""
    detail: str = ""


def final_answer(text: str) -> Fraction | None:
    """The answer as the ``gsm8k`` verifier reads it: the number after the last ``####``, else in
    the last ``\\boxed{}``, else the last number written; ``None`` without one."""
    after = after_last_hashes(text)
    if after is not None and (found := first_number(after)) is not None:
        return found
    boxed = last_boxed(text)
    if boxed is not None and (found := first_number(boxed)) is not None:
        return found
    last = last_number(text)
    return None if last is None else read_number(last)


def judge(question: str, gold: Sequence[GoldStep], answer: Fraction,
          thoughts: Sequence[str]) -> list[Verdict]:
    """Every thought's verdict by the rule of this module's docstring (one per thought)."""
    on_path = {s.value for s in gold} | {answer}
    known = question_numbers(question) | on_path | set(_ALWAYS)
    for step in gold:
        known |= {v for v in (to_number(n) for n in _NUMBER.findall(step.expr)) if v is not None}
    verdicts: list[Verdict] = []
    # off-path value -> (the thought that produced it, its operands): a detour until it reconnects
    detours: dict[Fraction, tuple[int, tuple[Fraction, ...]]] = {}
    for index, thought in enumerate(thoughts):
        verdict = Verdict(False)
        for comp in computations(thought):
            if not comp.right:
                verdict = Verdict(True, "arithmetic", f"{comp.expr} = {comp.stated}")
                break
            unknown = [o for o in comp.operands if not _either(o, comp.percents) & known]
            if unknown:
                verdict = Verdict(True, "value", f"{comp.expr}: {fmt(unknown[0])} is not a known value")
                break
            known |= comp.inner | {comp.value}
            if _either(comp.value, comp.percents) & on_path or _rounds_to(comp.value, answer) \
                    or comp.stated.endswith("%"):  # a stated rate is not held to the path
                _reconnect(detours, comp.operands, comp.percents)
            else:
                for value in _either(comp.value, comp.percents):  # a detour that either reading ends
                    detours.setdefault(value, (index, comp.operands))
        verdicts.append(verdict)
    for value, (index, _) in detours.items():
        if not verdicts[index].wrong:
            verdicts[index] = Verdict(True, "off_path", f"{fmt(value)} is not on the gold path")
    if thoughts and not any(v.wrong for v in verdicts):
        stated = final_answer("\n".join(thoughts))
        if stated != answer:
            where = next((i for i in range(len(thoughts) - 1, -1, -1) if "####" in thoughts[i]),
                         len(thoughts) - 1)
            shown = "none" if stated is None else fmt(stated)
            verdicts[where] = Verdict(True, "answer", f"answer {shown} is not {fmt(answer)}")
    return verdicts


def _rounds_to(value: Fraction, answer: Fraction) -> bool:
    """``value`` is a whole ``answer`` left unrounded (``14.28`` for 14, rounded or cut)."""
    return answer.denominator == 1 and value.denominator != 1 and answer in (round(value), int(value))


def _either(value: Fraction, percents: frozenset[Fraction]) -> set[Fraction]:
    """``value``'s readings: itself, and as a fraction when it was written as a percentage."""
    return {value, value / 100} if value in percents else {value}


def _reconnect(detours: dict[Fraction, tuple[int, tuple[Fraction, ...]]], operands,
               percents: frozenset[Fraction] = frozenset()) -> None:
    """Drop the detours that ``operands`` build on (and the detours those build on), and the other
    reading of a percentage's detour with it."""
    stack = [r for o in operands for r in _either(o, percents) if r in detours]
    while stack:
        value = stack.pop()
        if value in detours:
            index, built_on = detours.pop(value)
            stack += [v for v in (value * 100, value / 100) if v in detours and detours[v][0] == index]
            stack += [o for o in built_on if o in detours]


def first_wrong_step(question: str, gold: Sequence[GoldStep], answer: Fraction,
                     thoughts: Sequence[str]) -> int | None:
    """The step oracle (``creditlab.types.StepOracle`` once the first three are bound): the index
    of the first wrong thought, or ``None``."""
    return next((i for i, v in enumerate(judge(question, gold, answer, thoughts)) if v.wrong), None)
