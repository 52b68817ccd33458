"""Unit tests for the embedded ``arith`` task, its verifier and the ``arith_tiny`` model recipe."""

from __future__ import annotations

import os
import pickle

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from creditlab.types import Completion, Problem  # noqa: E402
from creditlab_arith.task import ArithTask, first_wrong_thought, split_thoughts  # noqa: E402
from creditlab_arith.tokenizer import BOXED, build_char_tokenizer  # noqa: E402
from creditlab_arith.verifier import ArithVerifier  # noqa: E402

DELIM = "</thought>"


def completion(text: str) -> Completion:
    return Completion(prompt_ids=(), response_ids=(), logprobs=(), finish_reason="eos", text=text)


# -- tokenizer ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "Start 7, +5, *3, -4. ",
        "7+5=12</thought>12*3=36</thought>36-4=\\boxed{32}</thought>",
        "Step 1: 0123456789\nStep 2:\t</thought></thought>\\boxed{}\\boxed {x}",
        " leading and trailing spaces  ",
        "",
    ],
)
def test_tokenizer_round_trip(text: str) -> None:
    tok = build_char_tokenizer(DELIM)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.decode(ids, skip_special_tokens=True) == text
    bare = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(bare) == text


def test_tokenizer_special_tokens() -> None:
    tok = build_char_tokenizer(DELIM)
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3
    delim_id = tok.convert_tokens_to_ids(DELIM)
    boxed_id = tok.convert_tokens_to_ids(BOXED)
    assert tok("a</thought>", add_special_tokens=False)["input_ids"][-1] == delim_id
    assert tok(BOXED, add_special_tokens=False)["input_ids"] == [boxed_id]
    digits = tok("0123456789", add_special_tokens=False)["input_ids"]
    assert len(digits) == 10 and len(set(digits)) == 10
    assert tok.decode([delim_id, boxed_id], skip_special_tokens=True) == DELIM + BOXED


# -- task --------------------------------------------------------------------------------------
def small_task(**kw: object) -> ArithTask:
    return ArithTask(ArithTask.Config(**{"num_train": 300, "num_test": 50, **kw}))


def test_task_deterministic_and_disjoint() -> None:
    a, b = small_task(), small_task()
    train, test = a.load("train"), a.load("test")
    assert len(train) == 300 and len(test) == 50
    assert [p.prompt for p in train] == [p.prompt for p in b.load("train")]
    solutions = [p.metadata["solution"] for p in test]
    assert solutions == [p.metadata["solution"] for p in b.load("test")]
    assert not {p.prompt for p in train} & {p.prompt for p in test}
    assert len({p.id for p in train + test}) == 350
    other = small_task(seed=1).load("train")
    assert [p.prompt for p in other] != [p.prompt for p in train]
    # test split does not depend on num_train
    assert [p.prompt for p in small_task(num_train=10).load("test")] == [p.prompt for p in test]


def test_task_problems_are_consistent() -> None:
    task = small_task(min_steps=2, max_steps=5, max_value=40)
    for p in task.load("train") + task.load("test"):
        steps = p.metadata["steps"]
        assert 2 <= len(steps) <= 5
        assert all(0 <= v <= 40 for v in p.metadata["values"])
        sol = p.metadata["solution"]
        assert sol.endswith(DELIM) and sol.count(DELIM) == len(steps)
        assert f"\\boxed{{{p.answer}}}" in split_thoughts(sol, DELIM)[-1]
        assert p.oracle(split_thoughts(sol, DELIM)) is None
        assert int(p.answer) == p.metadata["values"][-1]
    pickle.loads(pickle.dumps(task.load("test")[0]))  # oracle is picklable


def test_task_rejects_bad_config() -> None:
    with pytest.raises(ValueError, match="ops"):
        ArithTask(ArithTask.Config(ops="+/"))
    with pytest.raises(ValueError, match="split"):
        small_task().load("validation")


def test_split_thoughts() -> None:
    assert split_thoughts("a</thought>b</thought>", DELIM) == ["a", "b"]
    assert split_thoughts("a</thought>b", DELIM) == ["a", "b"]  # a capped last thought counts
    assert split_thoughts("a</thought>  ", DELIM) == ["a"]
    assert split_thoughts("", DELIM) == []


# -- oracle ------------------------------------------------------------------------------------
# 7 +5 *3 -4: 7+5=12, 12*3=36, 36-4=32
STEPS = (("+", 5, 12), ("*", 3, 36), ("-", 4, 32))


def oracle(text_or_thoughts: str | list[str]) -> int | None:
    thoughts = (
        split_thoughts(text_or_thoughts, DELIM)
        if isinstance(text_or_thoughts, str)
        else text_or_thoughts
    )
    return first_wrong_thought(thoughts, start=7, steps=STEPS, delimiter=DELIM)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7+5=12</thought>12*3=36</thought>36-4=\\boxed{32}</thought>", None),
        ("7+5=12</thought>12*3=36</thought>36-4=32</thought>\\boxed{32}</thought>", None),
        (" 7 + 5 = 12 </thought>12*3=36</thought>36-4=\\boxed{ 32 }", None),
        ("7+5=12</thought>12+3=15</thought>15-4=\\boxed{11}</thought>", 1),  # wrong op at step 2
        ("7+5=12</thought>12*4=48</thought>48-4=\\boxed{44}</thought>", 1),  # wrong operand
        ("7+5=13</thought>13*3=39</thought>39-4=\\boxed{35}</thought>", 0),  # arithmetic slip
        ("7+5=12</thought>12*3=36</thought>36-4=\\boxed{31}</thought>", 2),  # slip in last step
        ("7+5=12</thought>12*3=36</thought>36-4=\\boxed{32</thought>", 2),  # malformed answer
        ("7+5=12</thought>hello</thought>36-4=\\boxed{32}</thought>", 1),  # malformed thought
        ("7+5=12</thought>", 1),  # truncated chain
        ("", 0),
        ("7+5=12</thought>12*3=36</thought>36-4=32</thought>", 3),  # missing final answer
        ("7+5=12</thought>12*3=36</thought>36-4=\\boxed{32}</thought>\\boxed{5}</thought>", 3),
        ("7+5=12</thought>12*3=36</thought>36-4=\\boxed{32}</thought>ok</thought>", None),
    ],
)
def test_oracle_on_chains(text: str, expected: int | None) -> None:
    assert oracle(text) == expected


def test_oracle_accepts_thoughts_with_delimiters() -> None:
    thoughts = ["7+5=12</thought>", "12*3=36</thought>", "36-4=\\boxed{32}</thought>"]
    assert oracle(thoughts) is None
    assert oracle(["7+5=12</thought>", "12*3=35</thought>"]) == 1


def test_problem_oracle_matches_verifier() -> None:
    """A chain the oracle calls correct always gets reward 1 from the verifier."""
    verifier = ArithVerifier()
    for p in small_task().load("test")[:20]:
        good = p.metadata["solution"]
        bad = good.replace(f"{{{p.answer}}}", f"{{{int(p.answer) + 1}}}")
        for text, ok in ((good, True), (bad, False)):
            assert (p.oracle(split_thoughts(text, DELIM)) is None) is ok
            assert verifier.score([p], [completion(text)]).values == (float(ok),)


# -- verifier ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "reward", "parsed", "outcome", "lenient"),
    [
        ("7+5=\\boxed{12}</thought>", 1.0, "12", "correct", True),
        ("\\boxed{ +12 }", 1.0, "+12", "correct", True),
        ("\\boxed{13}", 0.0, "13", "wrong", False),
        ("the answer is 12", 0.0, None, "no_answer", True),  # lenient: the last integer
        ("the answer is 12.", 0.0, None, "no_answer", True),
        ("12 apples, or 13", 0.0, None, "no_answer", False),
        ("7+5=12. The answer is \\boxed{}.", 0.0, "", "wrong", True),  # an empty box: the last integer
        ("\\boxed{13} then 12", 0.0, "13", "wrong", False),  # a boxed integer is the answer
        ("\\boxed{13} then \\boxed{12}", 1.0, "12", "correct", True),  # last boxed wins
        ("\\boxed{12} then \\boxed{13}", 0.0, "13", "wrong", False),
        ("\\boxed{12.5}", 0.0, "12.5", "wrong", False),
        ("\\boxed{12", 0.0, None, "no_answer", True),
        ("9012", 0.0, None, "no_answer", False),  # digits of a longer number are not 12
        ("1234567890123", 0.0, None, "no_answer", False),  # over 12 digits: not an integer
        ("}{\\boxed{{\x00\ufffd</thought>" * 3, 0.0, None, "no_answer", False),  # garbage
        ("\\boxed{}", 0.0, "", "wrong", False),
    ],
)
def test_verifier_table(text: str, reward: float, parsed: str | None, outcome: str, lenient: bool) -> None:
    problem = Problem(id="p", prompt="Start 7, +5. ", answer="12")
    rewards = ArithVerifier().score([problem], [completion(text)])
    assert rewards.values == (reward,)
    assert rewards.info[0] == {"parsed": parsed, "outcome": outcome, "lenient": lenient}


def test_verifier_metrics_reset() -> None:
    problem = Problem(id="p", prompt="", answer="3")
    verifier = ArithVerifier()
    verifier.score([problem] * 4, [completion(t) for t in ("\\boxed{3}", "\\boxed{4}", "so 3", "x")])
    assert verifier.metrics() == {
        "scored": 4.0,
        "correct_rate": 0.25,
        "wrong_rate": 0.25,
        "no_answer_rate": 0.5,
        "timeout_rate": 0.0,
        "error_rate": 0.0,
        "lenient_rate": 0.5,
        "worker_restarts": 0.0,
    }
    assert verifier.metrics() == {"scored": 0.0}
    with pytest.raises(ValueError):
        verifier.score([problem], [])


def test_free_words_are_uniform_free_choices_the_oracle_ignores():
    """task.free_words (issue 29): every gold thought opens with that many words of FREE_WORDS,
    drawn per problem and about uniformly; any of them (or none) leaves a right step right, a wrong
    step stays wrong, and the default task is unchanged (no words, words not accepted)."""
    from collections import Counter

    from creditlab_arith.task import FREE_WORDS, parse_step

    task = ArithTask(ArithTask.Config(free_words=2, num_train=400, num_test=50))
    counts: Counter = Counter()
    for p in task.load("train"):
        thoughts = p.metadata["thoughts"]
        for t in thoughts:
            first, second, _ = t.split(" ", 2)
            counts.update([first, second])
        assert p.oracle(thoughts) is None
        plain = [t.split(" ", 2)[2] for t in thoughts]
        assert p.oracle(plain) is None and p.oracle(["well " + t for t in plain]) is None
        wrong = plain[0].rsplit("=", 1)[0] + "=999"
        assert p.oracle(["so ok " + wrong, *plain[1:]]) == 0
    assert set(counts) == set(FREE_WORDS)
    share = [n / sum(counts.values()) for n in counts.values()]
    assert max(share) - min(share) < 0.03, counts  # 1/8 each, ~3,000 draws
    assert task.load("test") == ArithTask(ArithTask.Config(free_words=2, num_train=400, num_test=50)).load("test")
    assert parse_step("so 7+5=12") is None and parse_step("so 7+5=12", free=True) == (None, 7, "+", 5, 12)
    assert parse_step("2:then 7+5=12", free=True) == (2, 7, "+", 5, 12)
    with pytest.raises(ValueError, match="free_words"):
        ArithTask(ArithTask.Config(free_words=1, render="words"))


def test_trap_puts_one_exact_division_late_in_the_share_of_problems_asked():
    """task.trap (issue 29's second lever): that share of problems carries one exact integer
    division "/b" (b in [2, max_operand], nonzero running value) in the second half of the chain;
    the gold chain passes the oracle, a wrong quotient is caught there, and trap = 0 is the
    default task exactly (its cached warm starts keep their keys)."""
    from creditlab_arith import model as recipe

    task = ArithTask(ArithTask.Config(min_steps=8, max_steps=8, numbered=True, trap=1.0, num_train=300, num_test=50))
    for p in task.load("train") + task.load("test"):
        steps, values = p.metadata["steps"], p.metadata["values"]
        traps = [i for i, (op, _, _) in enumerate(steps) if op == "/"]
        assert len(traps) == 1 and 4 <= traps[0] <= 7, steps
        t = traps[0]
        _, b, result = steps[t]
        assert 2 <= b <= 12 and values[t] > 0 and values[t] == b * result
        assert f"{t + 1}:/{b}" in p.prompt and p.oracle(p.metadata["thoughts"]) is None
        wrong = list(p.metadata["thoughts"])
        wrong[t] = f"{t + 1}:{values[t]}/{b}={result + 1}"
        assert p.oracle(wrong) == t
    mixed = ArithTask(ArithTask.Config(trap=0.1, num_train=1000, num_test=0)).load("train")
    share = sum(any(op == "/" for op, *_ in p.metadata["steps"]) for p in mixed) / len(mixed)
    assert 0.06 < share < 0.14, share
    plain = ArithTask(ArithTask.Config(num_train=200, num_test=50))
    zero = ArithTask(ArithTask.Config(trap=0.0, num_train=200, num_test=50))
    assert [p.prompt for p in plain.load("train")] == [p.prompt for p in zero.load("train")]
    assert recipe.checkpoint_dir({}) == recipe.checkpoint_dir({"task": {"trap": 0.0}})
    assert recipe.checkpoint_dir({}) != recipe.checkpoint_dir({"task": {"trap": 0.05}})
    for bad in ({"trap": 1.5}, {"trap": -0.1}, {"trap": 0.5, "render": "words"}):
        with pytest.raises(ValueError, match=r"task.trap is a share in \[0, 1\]"):
            ArithTask(ArithTask.Config(**bad))


def test_trap_at_puts_the_trap_on_the_step_asked():
    """task.trap_at = k puts every trap on step k (here the last of 8); 0 (the default) keeps the
    problems of the second-half draw exactly, and the cached warm starts' keys; a step past
    min_steps is refused, naming the valid range."""
    from creditlab_arith import model as recipe

    last = ArithTask(ArithTask.Config(min_steps=8, max_steps=8, numbered=True, trap=1.0, trap_at=8, num_train=200, num_test=50))
    for p in last.load("train") + last.load("test"):
        assert [op == "/" for op, *_ in p.metadata["steps"]] == [False] * 7 + [True], p.metadata["steps"]
        assert p.oracle(p.metadata["thoughts"]) is None
    late = dict(min_steps=8, max_steps=8, numbered=True, trap=1.0, num_train=200, num_test=50)
    assert ([p.prompt for p in ArithTask(ArithTask.Config(**late)).load("train")]
            == [p.prompt for p in ArithTask(ArithTask.Config(**late, trap_at=0)).load("train")])
    assert recipe.checkpoint_dir({"task": {"trap": 0.15}}) == recipe.checkpoint_dir({"task": {"trap": 0.15, "trap_at": 0}})
    with pytest.raises(ValueError, match=r"task.trap_at is the trap's step, 1 to min_steps \(8\)"):
        ArithTask(ArithTask.Config(min_steps=8, max_steps=8, trap=1.0, trap_at=9))


def test_traps_puts_several_exact_divisions_at_distinct_steps():
    """task.traps = 3 (issue 38's regime): every trap problem carries three exact divisions at
    distinct steps drawn over the whole chain, each checked by the oracle; traps = 1 keeps the
    single-trap problems exactly, and the cached warm starts' keys; bad values are refused."""
    from creditlab_arith import model as recipe

    base = dict(min_steps=8, max_steps=8, numbered=True, trap=1.0, num_train=300, num_test=50)
    task = ArithTask(ArithTask.Config(**base, traps=3))
    positions = set()
    for p in task.load("train") + task.load("test"):
        steps, values = p.metadata["steps"], p.metadata["values"]
        traps = [i for i, (op, _, _) in enumerate(steps) if op == "/"]
        assert len(traps) == 3, steps
        positions.update(traps)
        assert p.oracle(p.metadata["thoughts"]) is None
        for t in traps:
            _, b, result = steps[t]
            assert 2 <= b <= 12 and values[t] > 0 and values[t] == b * result
            wrong = list(p.metadata["thoughts"])
            wrong[t] = f"{t + 1}:{values[t]}/{b}={result + 1}"
            assert p.oracle(wrong) == t
    assert positions == set(range(8))  # over the whole chain
    assert ([p.prompt for p in ArithTask(ArithTask.Config(**base)).load("train")]
            == [p.prompt for p in ArithTask(ArithTask.Config(**base, traps=1)).load("train")])
    assert recipe.checkpoint_dir({"task": {"trap": 0.15}}) == recipe.checkpoint_dir({"task": {"trap": 0.15, "traps": 1}})
    assert recipe.checkpoint_dir({"task": {"trap": 0.15}}) != recipe.checkpoint_dir({"task": {"trap": 0.15, "traps": 2}})
    for bad in ({"traps": 0}, {"traps": 9}, {"traps": 2, "trap_at": 3}):
        with pytest.raises(ValueError, match="task.traps is the number of trap steps"):
            ArithTask(ArithTask.Config(**{**base, **bad}))
