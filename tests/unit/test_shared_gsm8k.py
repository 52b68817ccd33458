"""Optional check on the real GSM8K test split (``../shared/data/gsm8k/test.jsonl`` next to the
repository root; skipped when it is absent, as in a user's clone): the loader reads every row,
every gold answer parses as a number, and both verifiers accept each row's own gold answer
written as a model would write it (``#### <answer>`` for ``gsm8k``, ``\\boxed{<answer>}`` for
``math_verify``). All 1,319 rows go through ``math_verify`` (worker processes): ~5 s here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from creditlab.types import Completion
from creditlab_math.extract import after_last_hashes, to_number
from creditlab_math.tasks import GSM8KTask
from creditlab_math.verifiers import GSM8KVerifier, MathVerifyVerifier

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k" / "test.jsonl"

pytestmark = pytest.mark.skipif(not SHARED.is_file(), reason=f"{SHARED} not present")


@pytest.fixture(scope="module")
def problems():
    return GSM8KTask(GSM8KTask.Config(path=str(SHARED))).load("test")


def completions(texts):
    return [Completion((), (), (), "eos", t) for t in texts]


def test_loader_reads_every_row_and_every_gold_answer_parses(problems):
    rows = [json.loads(line) for line in SHARED.read_text().splitlines() if line.strip()]
    assert len(problems) == len(rows) == 1319
    assert len({p.id for p in problems}) == len(problems)
    for problem, row in zip(problems, rows, strict=True):
        assert to_number(problem.answer) is not None, (problem.id, problem.answer)
        assert to_number(problem.answer) == to_number(after_last_hashes(row["answer"])), problem.id
        assert row["question"] in problem.prompt


def test_gsm8k_verifier_accepts_every_gold_answer(problems):
    verifier = GSM8KVerifier()
    rewards = verifier.score(problems, completions(f"The answer is\n#### {p.answer}" for p in problems))
    assert rewards.values == (1.0,) * len(problems), [
        (p.id, i) for p, v, i in zip(problems, rewards.values, rewards.info, strict=True) if v != 1.0
    ][:5]
    worked = verifier.score(problems, completions(p.metadata["solution"] for p in problems))
    assert worked.values == (1.0,) * len(problems), "the dataset's own worked answers score 1"


def test_math_verify_accepts_every_gold_answer_boxed(problems):
    verifier = MathVerifyVerifier()
    try:
        rewards = verifier.score(problems, completions(f"So the answer is \\boxed{{{p.answer}}}." for p in problems))
        counts = verifier.metrics()
    finally:
        verifier.close()
    rejected = [
        (p.id, p.answer, i) for p, v, i in zip(problems, rewards.values, rewards.info, strict=True) if v != 1.0
    ]
    assert not rejected, rejected[:5]
    assert counts["correct_count"] == len(problems) and counts["timeout_count"] == 0
