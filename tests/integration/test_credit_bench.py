"""`creditlab credit-bench` end to end on the small warm start: the truth, every score and the
report on real groups, determinism for a seed, and bad input named before the model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from creditlab.creditbench import Bench, BenchError, BenchSettings, write_report
from creditlab.interfaces import Verifier
from creditlab.registry import REGISTRIES
from creditlab.types import Rewards

from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

SETTINGS = {"prompts": 3, "k": 4, "min_reliability": 0.01, "bootstrap": 100,
            "estimators": ("grpo", "dr_grpo", "mc_value"), "selectors": ("random", "oracle")}


def _strip_time(result) -> dict:
    """The scores and counts of a result (wall-clock costs aside)."""
    return {
        "counts": result.counts,
        "noise": result.noise,
        "estimators": [(e.name, {k: (v.value, v.low, v.high) for k, v in e.scores.items()},
                        e.cost.get("generated_tokens")) for e in result.estimators],
        "selectors": [(s.name, {k: (v.value, v.low, v.high) for k, v in s.scores.items()}) for s in result.selectors],
    }


class HasSevenVerifier(Verifier):
    """Reward 1 when the response so far contains a "7": the small warm start (which rarely
    solves arith) writes one in about half its chains, and once written it stays, so values
    rise along a chain at the thought that writes it. Its config takes (and ignores) the keys of
    the arith and gsm8k verifiers' configs, so ``verifier.name=has_seven`` is the only override."""

    @dataclass
    class Config:
        timeout_s: float = 5.0
        workers: int = 1
        fallback_last_number: bool = True

    def score(self, problems, completions):
        values = tuple(float("7" in c.text) for c in completions)
        return Rewards(values, tuple({} for _ in values))


HAS_SEVEN = ["verifier.name=has_seven"]


@pytest.fixture(scope="module")
def has_seven():
    REGISTRIES["verifier"].register("has_seven")(HasSevenVerifier)
    yield
    REGISTRIES["verifier"].unregister("has_seven")


@pytest.fixture(scope="module")
def results(has_seven):
    overrides = ["threads=1", *SMALL, *HAS_SEVEN]
    return [Bench(overrides, BenchSettings(**SETTINGS)).run() for _ in range(2)]


def test_a_task_without_step_oracle(has_seven, tmp_path):
    """GSM8K-style files: the truth needs no oracle; no instrument check, no oracle selector."""
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"What is {i} + {i + 7}?", "answer": f"#### {2 * i + 7}"} for i in range(8)]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = ["threads=1", *(o for o in SMALL if not o.startswith("task.")), "task=gsm8k",
                 f"task.path={data}", *HAS_SEVEN]
    settings = {**SETTINGS, "estimators": ("grpo",), "selectors": None}
    r = Bench(overrides, BenchSettings(**settings)).run()
    assert r.settings["task"] == "gsm8k" and r.instrument is None
    assert "oracle" not in {s.name for s in r.selectors} and {"random", "self_localize"} <= {s.name for s in r.selectors}
    assert r.estimators[0].error is None and "error/mean" in r.estimators[0].scores


def test_a_truth_without_signal_is_refused():
    """The small warm start never solves arith: every value is 0, there is nothing to score."""
    with pytest.raises(BenchError) as err:
        Bench(["threads=1", *SMALL], BenchSettings(**SETTINGS)).run()
    assert "too noisy to score against" in str(err.value) and "no step effects" in str(err.value)


def test_same_seed_same_scores(results):
    a, b = (_strip_time(r) for r in results)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_truth_and_scores_on_real_groups(results, tmp_path):
    r = results[0]
    assert r.counts["chains"] == 3 * 4  # prompts x rollout.group_size of SMALL
    assert r.counts["continuations"] == 4 * r.counts["states"]
    assert r.counts["states"] <= r.counts["thoughts"]  # shared prefixes valued once
    names = [e.name for e in r.estimators]
    assert sorted(names) == ["dr_grpo", "grpo", "mc_value"] and all(e.error is None for e in r.estimators)
    by = {e.name: e for e in r.estimators}
    # A sequence-level advantage is constant over a chain's thoughts: it ranks nothing inside one.
    assert by["grpo"].scores["spearman_within/mean"].value == 0.0
    assert by["mc_value"].cost["generated_tokens"] > 0 and by["grpo"].cost["generated_tokens"] == 0
    # The ranking follows the ranking score, and each neighbour pair has its paired difference.
    values = [e.scores["error/mean"].value for e in r.estimators]  # the default ranking: lowest first
    assert values == sorted(values)
    assert [(s.better, s.worse) for s in r.separations] == list(pairwise(names))
    sel = {s.name: s for s in r.selectors}
    if r.counts["failed_chains"]:
        # The oracle selector resets at the oracle's first wrong step: its agreement with the MC
        # truth is the instrument check itself.
        assert sel["oracle"].scores["oracle_exact"].value == 1.0
        assert sel["oracle"].scores["exact"].value == pytest.approx(r.instrument["most_negative_is_first_wrong"].value)
        for s in r.selectors:
            total = sum(s.scores[k].value for k in ("exact", "early", "late"))
            assert total == pytest.approx(1.0)
            assert 0.0 <= s.scores["first_thought"].value <= 1.0
        # The reference resets every failed chain at thought 0: never after the worst step.
        ref = r.first_thought
        assert ref["first_thought"].value == 1.0 and ref["late"].value == 0.0
        assert ref["exact"].value + ref["early"].value == pytest.approx(1.0)
    paths = write_report(r, tmp_path / "report")
    assert all(Path(p).exists() for p in paths.values())
    if r.counts["failed_chains"]:
        assert "(reference: always thought 0)" in Path(paths["md"]).read_text()
        assert "first_thought" in json.loads(Path(paths["json"]).read_text())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "creditlab.cli", "credit-bench", *args],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("args, words", [
    (["--k", "1"], "--k must be at least 2"),
    (["--estimators", "grpo,nope"], "nope"),
    (["--prompts", "100000"], "has 16 problems"),
    (["--bogus"], "unknown option --bogus"),
    (["rollout.group_sise=4"], "group_sise"),
])
def test_bad_input_is_named_before_the_model_loads(args, words):
    out = _cli(*args, *SMALL)
    assert out.returncode == 2, out.stderr[-2000:]
    assert words in out.stderr and "Traceback" not in out.stderr
    assert "Loading weights" not in out.stderr + out.stdout
