"""The ``arith`` task told as word problems (``task.render=words``) and its prose step oracle."""

from __future__ import annotations

import pytest

from creditlab.types import Completion
from creditlab_arith.task import ArithTask, first_wrong_thought, parse_step, split_thoughts
from creditlab_arith.verifier import ArithVerifier
from creditlab_arith.words import render

STEPS = [("+", 5, 12), ("*", 3, 36), ("-", 4, 32)]


def words_oracle(thoughts: list[str]) -> int | None:
    return first_wrong_thought(thoughts, start=7, steps=STEPS, prose=True)


def test_render_by_hand() -> None:
    prompt, thoughts = render(7, STEPS)
    name = prompt.split()[0]
    assert prompt.startswith(f"{name} has 7 ")
    assert prompt.count(f"Then {name} ") == 3
    assert prompt.endswith("put the final answer in \\boxed{}.")
    assert [t.split(", so ")[1] for t in thoughts] == [
        "7 + 5 = 12.", "12 * 3 = 36.", "36 - 4 = 32. The answer is \\boxed{32}.",
    ]
    assert render(7, STEPS) == (prompt, thoughts)  # deterministic
    assert words_oracle(thoughts) is None


@pytest.mark.parametrize(
    ("thoughts", "expected"),
    [
        (["She finds 5 more, so 7 + 5 = 12.", "Times 3: 12 * 3 = 36.", "36 - 4 = 32, \\boxed{32}"], None),
        (["7 + 5 = 12", "12 × 3 = 36", "36-4=\\boxed{32}"], None),  # × and a boxed result
        (["7 + 5 = 12", "12 x 3 = 36", "36 - 4 = 32", "So \\boxed{32}."], None),  # the answer after
        (["First 7 + 5 = 13, no: 7 + 5 = 12.", "12 * 3 = 36", "36 - 4 = \\boxed{32}"], None),  # last equation
        (["7 + 5 = 12, then 12 + 1 = 13", "12 * 3 = 36", "36 - 4 = \\boxed{32}"], 0),
        (["She finds 5 more, so she has 12.", "12 * 3 = 36", "36 - 4 = \\boxed{32}"], 0),  # no equation
        (["7 + 5 = 12", "12 * 3 = 35", "35 - 4 = \\boxed{31}"], 1),
        (["7 + 5 = 12", "12 * 3 = 36", "36 - 4 = 32"], 3),  # no answer boxed
        (["7 + 5 = 12", "12 * 3 = 36", "36 - 4 = 32", "The answer is \\boxed{30}."], 3),
    ],
)
def test_prose_oracle(thoughts: list[str], expected: int | None) -> None:
    assert words_oracle(thoughts) == expected


def test_prose_reading_is_off_for_the_symbolic_task() -> None:
    assert parse_step("She has 7 + 5 = 12.") is None
    assert parse_step("She has 7 + 5 = 12.", prose=True) == (None, 7, "+", 5, 12)
    assert parse_step("no equation here", prose=True) is None


def test_words_task_is_the_symbolic_task_told_in_words() -> None:
    symbolic = ArithTask(ArithTask.Config(num_train=50, num_test=30))
    words = ArithTask(ArithTask.Config(num_train=50, num_test=30, render="words"))
    verifier = ArithVerifier()
    for split in ("train", "test"):
        for s, w in zip(symbolic.load(split), words.load(split), strict=True):
            assert (w.id, w.answer, w.metadata["steps"]) == (s.id, s.answer, s.metadata["steps"])
            assert "\\boxed{}" in w.prompt and "Start" not in w.prompt
            chain = split_thoughts(w.metadata["solution"])
            assert w.oracle(chain) is None
            assert w.oracle(chain[:-1]) == len(chain) - 1  # the last step (and its answer) missing
            solution = Completion((), (), (), "eos", text=w.metadata["solution"])
            assert verifier.score([w], [solution]).values == (1.0,)


def test_words_task_test_split_does_not_depend_on_num_train() -> None:
    a = ArithTask(ArithTask.Config(num_train=10, num_test=20, render="words")).load("test")
    b = ArithTask(ArithTask.Config(num_train=40, num_test=20, render="words")).load("test")
    assert [p.prompt for p in a] == [p.prompt for p in b]


def test_bad_render_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="task.render must be one of"):
        ArithTask(ArithTask.Config(render="prose"))
    with pytest.raises(ValueError, match="task.numbered"):
        ArithTask(ArithTask.Config(render="words", numbered=True))
