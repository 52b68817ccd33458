"""The ``arith`` task told as a word problem (``task.render=words``): the natural-language
rendering of the same problems, for real language models (docs/real-model.md).

The operations, answers and step oracle are the symbolic task's; only the text changes::

    prompt:   "Mia has 7 shells. Then Mia finds 5 more. Then Mia ends up with 3 times as many.
               Then Mia gives away 4. How many shells does Mia have now? Solve it step by step
               and put the final answer in \\boxed{}."
    solution: "Mia finds 5 more, so 7 + 5 = 12.</thought>Mia ends up with 3 times as many, so
               12 * 3 = 36.</thought>Mia gives away 4, so 36 - 4 = 32. The answer is
               \\boxed{32}.</thought>"

Each thought is a sentence ending with the step's equation; the step oracle reads the *last*
equation of a thought (``creditlab_arith.task.parse_step(..., prose=True)``), so prose around
it is free, and ``×`` or ``x`` may stand for ``*``. Names, objects and phrasings are drawn from
the problem's own numbers, so a problem's text does not depend on the split sizes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

NAMES = ("Mia", "Noah", "Ava", "Liam", "Emma", "Omar", "Zoe", "Ravi", "Lena", "Sam", "Yuki", "Ben")
ITEMS = ("marbles", "stickers", "apples", "coins", "books", "cards", "shells", "pencils")
#: What a step does, per operator (``{b}`` is its operand).
PHRASES = {
    "+": ("finds {b} more", "is given {b} more", "buys {b} more"),
    "-": ("gives away {b}", "loses {b}", "sells {b}"),
    "*": ("ends up with {b} times as many", "trades each one for {b}"),
}
QUESTION = "How many {item} does {name} have now? Solve it step by step and put the final answer in \\boxed{{}}."


def render(start: int, steps: Sequence[tuple[str, int, int]]) -> tuple[str, list[str]]:
    """The word problem and its gold thoughts (without delimiters) for a start value and gold
    ``(op, operand, result)`` steps; deterministic in its arguments."""
    rng = random.Random(f"creditlab-arith-words-{start}-{list(steps)}")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    phrases = [rng.choice(PHRASES[op]).format(b=b) for op, b, _ in steps]
    prompt = f"{name} has {start} {item}. " + "".join(f"Then {name} {p}. " for p in phrases)
    prompt += QUESTION.format(item=item, name=name)
    thoughts, value = [], start
    for i, ((op, b, result), phrase) in enumerate(zip(steps, phrases)):
        thought = f"{name} {phrase}, so {value} {op} {b} = {result}."
        if i == len(steps) - 1:
            thought += f" The answer is \\boxed{{{result}}}."
        thoughts.append(thought)
        value = result
    return prompt, thoughts
