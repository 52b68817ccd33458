"""creditlab_wordproblems: exact arithmetic, reading a model's computations (units, chains,
fractions, algebra), gold steps from GSM8K annotations and SVAMP equations, the step oracle's rule
by hand, the shipped data (counts, licences, no overlap between splits) and the task's errors."""

from __future__ import annotations

import json
from collections import defaultdict
from fractions import Fraction

import pytest
from creditlab import ConfigError
from creditlab_math.tasks import TaskDataError
from creditlab_wordproblems.arithmetic import evaluate, fmt, matches, to_number
from creditlab_wordproblems.build import NEAR, NearIndex, deduplicate, normalise
from creditlab_wordproblems.reading import computations
from creditlab_wordproblems.steps import (
    GoldStep, equation_steps, final_answer, first_wrong_step, gsm8k_steps, judge, question_numbers,
    solution_steps, strip_annotations,
)
from creditlab_wordproblems.task import DATA, WordProblemsTask

NATALIA = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
           "May. How many clips did Natalia sell altogether in April and May?")
NATALIA_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
                    "clips altogether in April and May.\n#### 72")


def test_arithmetic_is_exact_and_bounded():
    assert evaluate("0.2 x 50") == 10 and evaluate("1,200 + 300") == 1500
    assert evaluate("(3 + 4) * 2") == 14 and evaluate("10 / 4") == Fraction(5, 2)
    assert evaluate("240 – 224") == 16  # an en dash
    ops: list = []
    assert evaluate("( ( 692.0 + 692.0 ) - 458.0 )", ops) == 926 and ops == [("692+692", 1384), ("1384-458", 926)]
    for bad in ("2 ** 10", "__import__('os')", "1 / 0", "x + 1", "9" * 500):
        with pytest.raises(ValueError):
            evaluate(bad)
    assert to_number("1,234.50") == Fraction(2469, 2) and to_number("12a") is None
    assert fmt(Fraction(1, 3)) == "1/3" and fmt(Fraction(1234567, 100)) == "12345.67" and fmt(Fraction(5)) == "5"
    assert matches(Fraction(10, 3), "3.33", Fraction(333, 100)) and not matches(Fraction(10, 3), "3.4", Fraction(34, 10))
    assert matches(Fraction(1, 4), "1/4", Fraction(1, 4)) and not matches(Fraction(10, 3), "3", Fraction(3))


def _read(text):
    return [(c.expr, c.stated, c.right) for c in computations(text)]


def test_reading_a_models_computations():
    assert _read("Natalia sold 48/2 = 24 clips in May.") == [("48 / 2", "24", True)]
    assert _read("Weng earns 12/60 = $0.2 per minute.") == [("12 / 60", "0.2", True)]
    # a chain: the running value (12 * 2 is 24) or the whole right side may follow an "="
    assert _read("so 12 * 2 = 24 - 4 = 20") == [("12 * 2", "24 - 4", True), ("24 - 4", "20", True)]
    assert _read("2 * 23 - 4 = 46 - 4 = 42") == [("2 * 23 - 4", "46 - 4", True), ("46 - 4", "42", True)]
    assert _read("so 12 * 2 = 25 - 4 = 21")[0][2] is False
    # units between the numbers are left out; a per-unit slash with them
    assert _read("There are 60 students x 2/3 = 40 students")[0][2]
    assert _read("60 minutes/day + 20 minutes/day = 80 minutes/day")[0][2]
    assert _read("40 students x $6/day = $240")[0][2]
    # a chain whose middle is arithmetic; fractions stated; mixed numbers; 2(...)
    assert all(c[2] for c in _read("8 * 2 + 4 * 5 + 12 * 4 = 16 + 20 + 48 = 84 tires"))
    assert _read("1/2 * 1/2 = 1/4") == [("1 / 2 * 1 / 2", "1/4", True)]
    assert _read("8 x 1 1/2 = 12 rolls")[0][2]
    assert _read("Day 4: 2(50+100+120)=540")[0][2]
    # wrong arithmetic is wrong, however it is read
    assert _read("She sold 48/2 = 25 clips") == [("48 / 2", "25", False)]
    # not computations: algebra, a lone number, a clock time
    assert _read("100 = 5A") == [] and _read("2/3 * x = 12") == [] and _read("4 * x + 600 = 10000") == []
    assert _read("She has 5 = five apples") == [] and _read("at 6:00+18 hours = 00:00") == []
    # an article or a pronoun before the arithmetic is not a variable
    assert _read("I have 3 + 4 = 8 apples") == [("3 + 4", "8", False)]
    assert _read("She buys a 3 + 4 = 7 pack") == [("3 + 4", "7", True)]


def test_hostile_text_is_read_quickly_and_never_crashes():
    """Model output is adversarial: huge numbers, long runs, deep parentheses, long lines."""
    import time

    texts = ["9" * 5000 + " + 1 = 2", "1+" * 5000 + "1 = 5", "(" * 500 + "1" + ")" * 500 + " + 1 = 2",
             "2 = " * 2000, "x" * 100_000, "1/" * 3000 + "1 = 1", "#### " + "9" * 10_000]
    start = time.monotonic()
    for text in texts:
        computations(text)
        judge(NATALIA, solution_steps(NATALIA_SOLUTION), Fraction(72), [text, text])
    assert time.monotonic() - start < 10


def test_gold_steps_from_annotations_and_equations():
    assert gsm8k_steps(NATALIA_SOLUTION) == (GoldStep("48/2", Fraction(24)), GoldStep("48+24", Fraction(72)))
    assert strip_annotations(NATALIA_SOLUTION).splitlines()[0] == "Natalia sold 48/2 = 24 clips in May."
    with pytest.raises(ValueError, match="not 3"):
        gsm8k_steps("so <<2+2=3>>3")
    # the text's unannotated computations count too, and the parts of a chain
    steps = solution_steps("It is 5 x 3 = <<15=15>>15 minutes.\nThen 1/2 * 1/2 = 1/4.\n#### 15")
    assert {s.value for s in steps} >= {Fraction(15), Fraction(1, 4), Fraction(1, 2)}
    assert [s.value for s in equation_steps("( 6.0 - ( 3.0 + 2.0 ) )")] == [5, 1]


def test_question_numbers():
    found = question_numbers("She sold half of three dozen eggs, 25% of 1,200 apples and 1/3 of a cake.")
    assert found >= {Fraction(2), Fraction(1, 2), Fraction(3), Fraction(12), Fraction(25), Fraction(1, 4),
                     Fraction(3, 4), Fraction(5, 4), Fraction(1200), Fraction(1, 3)}


def _verdicts(thoughts, question=NATALIA, solution=NATALIA_SOLUTION, answer=72):
    return [(v.wrong, v.why) for v in judge(question, solution_steps(solution), Fraction(answer), thoughts)]


def test_the_oracle_rule_by_hand():
    ok = (False, "")
    assert _verdicts(["Natalia sold 48/2 = 24 clips in May.", "48+24 = 72 in all.", "#### 72"]) == [ok] * 3
    # 1. arithmetic, then the wrong value it produced is used (the first wrong step is the first)
    assert _verdicts(["She sold 48/2 = 25 in May.", "48+25 = 73", "#### 73"]) == [
        (True, "arithmetic"), (True, "value"), ok]
    # 2. a value the question does not give
    assert _verdicts(["She sold 48/3 = 16 in May.", "#### 16"])[0] == (True, "value")
    # 3. off the path: right arithmetic on given numbers that never reaches a gold value
    assert _verdicts(["She sold 48*2 = 96 in May.", "48+96 = 144", "#### 144"])[:2] == [
        (True, "off_path"), (True, "off_path")]
    # ... unless it reconnects: another order of the same solution
    three = "Tom has 3 red, 4 blue and 5 green pens. How many pens does he have?"
    gold = "3+4 = <<3+4=7>>7\n7+5 = <<7+5=12>>12\n#### 12"
    assert _verdicts(["4 + 5 = 9 pens", "9 + 3 = 12 pens", "#### 12"], three, gold, 12) == [ok] * 3
    # 4. every step right, the answer not: the line stating it
    assert _verdicts(["She sold 48 + 24 = 72.", "#### 70"]) == [ok, (True, "answer")]
    assert _verdicts(["I do not know."]) == [(True, "answer")]
    # prose is never wrong on its own
    assert _verdicts(["First, read the problem.", "48/2 = 24", "48 + 24 = 72", "#### 72"]) == [ok] * 4
    assert first_wrong_step(NATALIA, solution_steps(NATALIA_SOLUTION), Fraction(72),
                            ["ok", "48/2 = 25", "#### 73"]) == 1
    # the answer as the gsm8k verifier reads it: ####, then \\boxed{}, then the last number, signed
    assert final_answer("so 5\n#### 1,234") == 1234 and final_answer("the answer is 12.") == 12
    assert final_answer("The answer is -72") == -72 and final_answer("it is \\boxed{7} ok, 9") == 7


def test_percentages_by_hand():
    """A percentage reads as the fraction or as the number written (two readings); slips the hand
    reading of SmolLM2's solutions found (``4*25% = 9``, ``100*30% = $300``) are arithmetic."""
    def one(text):
        (comp,) = computations(text)
        return comp.right, comp.value

    assert one("Mike scored 4*25% = 9 points.") == (False, 9)
    assert one("The groomer will pay 100*30% = $300") == (False, 300)
    assert one("he pays 80 * 25% = 20 dollars") == (True, 20)           # the fraction
    assert one("3 bobby pins / 21 decorations * 100% = 14.28") == (True, Fraction(1428, 100))  # the number, cut
    assert one("100% - 20 % = 80% of the price") == (True, 80)          # a stated percentage: either
    assert one("1 - 20% = 80%")[0] and not one("1 - 20% = 70%")[0]
    assert one("24 degrees / 3 degrees/5% increase = 8") == (True, 8)   # "per 5% increase" is a unit
    assert one("If 45% were for Biff + 8% were undecided = 53% were not") == (True, 53)  # words as units
    # on the path either way; a stated rate is not held to it; a whole answer left unrounded
    ok = (False, "")
    shoes = "Lyra paid $480 for shoes at a 20% discount. What was the original price?"
    gold = "480/.8 = <<480/.8=600>>600\n#### 600"
    assert _verdicts(["100% - 20% = 80% of the price.", "480 / 0.8 = 600", "#### 600"], shoes, gold, 600) == [ok] * 3
    assert _verdicts(["100% - 20% = 80% of the price.", "480 / 0.8 = 500", "#### 500"], shoes, gold, 600)[1] == \
        (True, "arithmetic")
    pins = "She has 6 barrettes, 12 scrunchies and 3 bobby pins. What percent are bobby pins, rounded down?"
    assert _verdicts(["3 / 21 * 100% = 14.28", "#### 14"], pins, "6+12+3 = <<6+12+3=21>>21\n#### 14", 14) == [ok] * 2
    # an operand written as a percentage is known as its number or its fraction
    half = "Half of the 40 candies had nuts. How many did they eat if they ate half of those?"
    assert _verdicts(["50% x 40 = 20", "20 / 2 = 10", "#### 10"], half,
                     "40/2 = <<40/2=20>>20\n20/2 = <<20/2=10>>10\n#### 10", 10) == [ok] * 3


def test_the_shipped_data():
    rows = {name: [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
            for name in ("train", "gsm8k_test", "svamp")}
    build = json.loads((DATA / "build.json").read_text())
    assert {k: len(v) for k, v in rows.items()} == {k: v["count"] for k, v in build["rows"].items()}
    assert len(rows["train"]) > 4000 and len(rows["gsm8k_test"]) > 700 and len(rows["svamp"]) > 990
    assert sum(p.stat().st_size for p in DATA.iterdir()) < 10 * 2**20
    assert (DATA / "LICENSE-GSM8K").read_text().startswith("MIT License")
    assert (DATA / "LICENSE-SVAMP").read_text().startswith("MIT License")
    for name, items in rows.items():
        assert all(1 <= r["ops"] <= 3 and r["steps"] and r["answer"].splitlines()[-1].startswith("#### ")
                   for r in items), name
        assert len({r["id"] for r in items}) == len(items), name
    held = [r["question"] for name in ("gsm8k_test", "svamp") for r in rows[name]]
    index = NearIndex()
    for q in held:
        index.add(q)
    exact = {normalise(q) for q in held}
    assert not [r for r in rows["train"] if normalise(r["question"]) in exact]
    assert max(index.overlap(r["question"]) for r in rows["train"][:600]) < NEAR  # a sample: speed
    # every shipped GSM8K solution is read as right by the oracle, line by line (its gold steps
    # include the solution's own computations: this checks the reading, not the solution)
    task = WordProblemsTask(WordProblemsTask.Config())
    for split in ("train", "gsm8k_test"):
        for p in task.load(split):
            assert p.oracle(p.metadata["solution"].splitlines()) is None, p.id


def test_deduplication_by_hand():
    held = [{"question": "A plane travels 1200 miles in 3 hours. At the same rate, how many additional hours "
                         "would it take to travel an additional 2000 miles?"}]
    train = [{"question": "A train travels 270 miles in 3 hours. At the same rate, how many additional hours "
                          "would it take to travel an additional 180 miles?"},
             {"question": "Mia has 3 apples. She buys 4 more. How many apples does Mia have now?"},
             {"question": "mia has 5 apples; she buys 9 more. How many apples does Mia have now?"},
             {"question": "Bo reads 20 pages a day for a week. How many pages does he read?"}]
    counts = defaultdict(int)
    kept = deduplicate(train, [held], counts)
    assert [r["question"][:6] for r in kept] == ["Mia ha", "Bo rea"]
    assert dict(counts) == {"train: near-duplicate of a held-out problem": 1,
                            "train: exact duplicate of another training problem": 1}


def test_the_task_splits_oracles_and_errors(tmp_path):
    task = WordProblemsTask(WordProblemsTask.Config(limit=5))
    train, test = task.load("train"), task.load("test")
    assert [p.id for p in test] == [p.id for p in task.load("gsm8k_test")]
    svamp = WordProblemsTask(WordProblemsTask.Config(test_set="svamp", limit=5)).load("test")
    assert svamp[0].id.startswith("svamp-") and svamp[0].oracle is not None
    p = train[0]
    assert p.answer == "72" and "Problem: " + NATALIA in p.prompt and p.metadata["problem"] == NATALIA
    assert p.oracle(["48/2 = 24", "48+24 = 72", "#### 72"]) is None and p.oracle(["48/2 = 20", "#### 68"]) == 0
    one_step = WordProblemsTask(WordProblemsTask.Config(max_ops=1)).load("train")
    assert len(one_step) == 373 and all(q.metadata["ops"] == 1 for q in one_step)
    for cfg, message in (({"test_set": "asdiv"}, "test_set must be one of gsm8k_test, svamp"),
                         ({"max_ops": 4}, "max_ops must be 1, 2 or 3")):
        with pytest.raises(ConfigError, match=message):
            WordProblemsTask(WordProblemsTask.Config(**cfg))
    with pytest.raises(TaskDataError, match="unknown split 'dev'"):
        task.load("dev")
    # a user's file: GSM8K rows, annotations give an oracle; a non-numeric answer is an error
    good = tmp_path / "mine.jsonl"
    good.write_text(json.dumps({"question": NATALIA, "answer": NATALIA_SOLUTION}) + "\n"
                    + json.dumps({"question": "What is 2+2?", "answer": "#### 4"}) + "\n")
    mine = WordProblemsTask(WordProblemsTask.Config(path=str(good), id_field=None)).load("test")
    assert [q.answer for q in mine] == ["72", "4"] and mine[0].oracle is not None and mine[1].oracle is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "How many?", "answer": "#### many"}) + "\n")
    with pytest.raises(TaskDataError, match=r"row 1: the answer after '####' must be a number.*'many'"):
        WordProblemsTask(WordProblemsTask.Config(path=str(bad), id_field=None)).load("test")
    empty = tmp_path / "empty_q.jsonl"
    empty.write_text(json.dumps({"question": " ", "answer": "#### 3"}) + "\n")
    with pytest.raises(TaskDataError, match="is empty"):
        WordProblemsTask(WordProblemsTask.Config(path=str(empty), id_field=None)).load("test")
    with pytest.raises(FileNotFoundError, match="no file for split 'train'"):
        WordProblemsTask(WordProblemsTask.Config(path=str(tmp_path / "none"))).load("train")
