"""Localization examples for the ``arith_tiny`` warm start: failed chains and the answers that
name their first wrong step, so that SRPO's self-localization (arXiv 2605.25507, METHODS.md §2) is
something the tiny model was taught [ours: the paper's models localize zero-shot].

Chains (``problem`` is an ``arith`` :class:`~creditlab.types.Problem`, ``k`` the 0-based step made
wrong; the task's step oracle names ``k`` for every one of them):

* :func:`corrupted_thoughts` — *consistent*: step ``k`` wrong, later steps computed correctly from
  it, as a real failure reads.
* :func:`scattered_thoughts` — step ``k`` wrong, each later step's result wrong at random,
  independently of it. Mixed into the ``resolve`` examples so that copying a shown result never
  pays: a re-solved result must be computed.

Answers (``model.recipe_args.localization_answer``):

* ``boxed`` — `` \\boxed{k+1}`` alone (the default recipe).
* ``worked`` — :func:`worked_localization`: each step re-done and marked ``ok`` up to the first
  that differs, marked ``no`` and boxed.
* ``resolve`` — :func:`resolved_localization`: the whole problem re-solved from its statement,
  each step's result followed by the chain's result and ``ok``/``no``, then the first ``no``
  boxed. The one of the three the 4-layer model learns (docs/methods/srpo.md): in ``worked``
  answers it copied the shown results instead of computing them.
"""

from __future__ import annotations

import random
from typing import Any

from creditlab_arith.task import apply_op, parse_step

#: Localization answer styles (``localization_answer``).
ANSWERS = ("boxed", "worked", "resolve")
_DELTAS = [d for d in range(-5, 6) if d]


def _shown(thoughts: list[str], i: int, delimiter: str) -> tuple[int, str, int, int] | None:
    """Thought ``i`` as ``(lhs, op, operand, result)`` (label and ``\\boxed{}`` ignored), or None
    if it is missing or not a step."""
    step = parse_step(thoughts[i].replace(delimiter, "").strip()) if i < len(thoughts) else None
    return step[1:] if step is not None else None


def _thought(i: int, n: int, value: int, op: str, b: int, result: int, numbered: bool) -> str:
    shown = f"\\boxed{{{result}}}" if i == n - 1 else str(result)
    return f"{i + 1}:" * numbered + f"{value}{op}{b}={shown}"


def corrupted_thoughts(
    problem: Any, k: int, rng: random.Random, max_operand: int, numbered: bool = False,
    operand_errors: bool = True,
) -> list[str]:
    """``problem``'s gold chain with step ``k`` (0-based) made wrong and later steps following it.

    Step k either states a wrong result (off by 1-5) or, when ``operand_errors``, with probability
    1/2 uses a wrong operand computed correctly; each later step applies its gold operation to the
    (now wrong) running value, the last one boxed.
    """
    value, out = problem.metadata["start"], []
    steps = problem.metadata["steps"]
    for i, (op, b, _) in enumerate(steps):
        result = apply_op(value, op, b)
        if i == k:
            if rng.random() < 0.5 or not operand_errors:
                result += rng.choice(_DELTAS)
            else:
                choices = [x for x in range(1, max_operand + 1) if apply_op(value, op, x) != result]
                if choices:
                    b = rng.choice(choices)
                    result = apply_op(value, op, b)
                else:
                    result += 1
        out.append(_thought(i, len(steps), value, op, b, result, numbered))
        value = result
    return out


def scattered_thoughts(problem: Any, k: int, rng: random.Random, numbered: bool = False) -> list[str]:
    """The gold chain with step ``k``'s result off by 1-5 and each later result likewise with
    probability 1/2 (every step's left-hand side stays the gold running value)."""
    value, out = problem.metadata["start"], []
    steps = problem.metadata["steps"]
    for i, (op, b, _) in enumerate(steps):
        result = apply_op(value, op, b)
        shown = result
        if i == k or (i > k and rng.random() < 0.5):
            shown = result + rng.choice(_DELTAS)
        out.append(_thought(i, len(steps), value, op, b, shown, numbered))
        value = result
    return out


def worked_localization(problem: Any, thoughts: list[str], delimiter: str = "</thought>") -> str:
    """`` 7*12=84 ok 84+9=93 no \\boxed{2}``: each step written out from the gold running value and
    compared with the chain's thought (numbering, delimiter and ``\\boxed{}`` ignored); the first
    that differs is marked ``no`` and boxed (1-based). Requires a wrong step among the operations.
    """
    value, out = problem.metadata["start"], []
    for i, (op, b, _) in enumerate(problem.metadata["steps"]):
        result = apply_op(value, op, b)
        gold = f"{value}{op}{b}={result}"
        if _shown(thoughts, i, delimiter) != (value, op, b, result):
            return " " + " ".join([*out, f"{gold} no \\boxed{{{i + 1}}}"])
        out.append(f"{gold} ok")
        value = result
    raise ValueError(f"no wrong step among the operations of {thoughts!r}")


def resolved_localization(problem: Any, thoughts: list[str], delimiter: str = "</thought>") -> str:
    """`` 1) 7*12=84 84 ok 2) 84+9=93 89 no 3) 93-10=83 79 no \\boxed{2}``: every step re-solved
    from the gold running value and the problem's operation, then the result the chain's thought
    ``i`` states (``?`` if it states none), then ``ok`` if the two agree, else ``no``; the first
    ``no`` is boxed (1-based; the last step if none, which the warm start's chains never need).

    Each part is there because the model failed without it (docs/methods/srpo.md): re-solving
    before the shown result is written keeps the model from copying it; the label ``i)`` and the
    copied result turn the verdict into a comparison of two adjacent numbers (without them the
    verdicts checked neighbouring lines).
    """
    value, out, first = problem.metadata["start"], [], None
    steps = problem.metadata["steps"]
    for i, (op, b, _) in enumerate(steps):
        result = apply_op(value, op, b)
        step = _shown(thoughts, i, delimiter)
        shown = str(step[3]) if step is not None else "?"
        same = step is not None and step[3] == result
        first = first if first is not None or same else i + 1
        out.append(f"{i + 1}) {value}{op}{b}={result} {shown} {'ok' if same else 'no'}")
        value = result
    return " " + " ".join(out) + f" \\boxed{{{first or len(steps)}}}"


def localization_example(
    problem: Any, rng: random.Random, answer: str, max_operand: int, numbered: bool = False,
    delimiter: str = "</thought>",
) -> tuple[list[str], str]:
    """A failed chain of ``problem`` and the ``answer``-style localization of it.

    ``boxed``/``worked``: a consistent corruption at a uniform step (either kind of error).
    ``resolve``: half consistent (wrong results only: the tiny model's own errors are ~95%
    arithmetic), half :func:`scattered_thoughts`.
    """
    if answer not in ANSWERS:
        raise ValueError(f"localization_answer must be one of {list(ANSWERS)}, got {answer!r}")
    k = rng.randrange(len(problem.metadata["steps"]))
    if answer != "resolve":
        thoughts = corrupted_thoughts(problem, k, rng, max_operand, numbered)
        text = f" \\boxed{{{k + 1}}}" if answer == "boxed" else worked_localization(problem, thoughts, delimiter)
    else:
        if rng.random() < 0.5:
            thoughts = corrupted_thoughts(problem, k, rng, max_operand, numbered, operand_errors=False)
        else:
            thoughts = scattered_thoughts(problem, k, rng, numbered)
        text = resolved_localization(problem, thoughts, delimiter)
    assert problem.oracle is None or problem.oracle(thoughts) == k, (problem.prompt, thoughts, k)
    return thoughts, text
