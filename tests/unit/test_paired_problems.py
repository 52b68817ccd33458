"""Per-problem evaluation (issue 15 item 3): the crossed bootstrap over seeds x problems, budget
matching (``--at-equal``), the per-problem records an evaluation gives, and ``creditlab compare``
on fabricated run directories with ``eval_problems.jsonl``."""

import json
import math

import numpy as np
import pytest
from creditlab import evaluation
from creditlab.cli import main
from creditlab.compare import CompareError, compare
from creditlab.distributed import shard
from creditlab.evaluation import EvalConfig, ProblemOutcomes, evaluate_problems, gather_outcomes
from creditlab.problem_records import PROBLEMS_FILE, check_budget_key, matched_steps, read_records
from creditlab.report import problem_rows, to_json
from creditlab.rundirs import load_run
from creditlab.significance import crossed_bootstrap
from creditlab.types import Completion, Problem, Rewards, RolloutConfig

from tests.unit.test_compare import EVALS, make_run

# -- the statistic --------------------------------------------------------------------------------


def test_all_equal_differences_give_that_value_and_a_zero_width_interval():
    t = crossed_bootstrap(np.full((3, 4), 0.25), resamples=999)
    assert (t.diff, t.low, t.high) == (0.25, 0.25, 0.25)
    assert (t.seeds, t.problems, t.resamples) == (3, 4, 999)
    # no draw is <= 0: the smallest p a bootstrap of 999 draws gives, 2 / (999 + 1)
    assert t.p_value == t.p_min == pytest.approx(0.002)
    zero = crossed_bootstrap(np.zeros((3, 4)), resamples=999)
    assert (zero.diff, zero.low, zero.high, zero.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_a_symmetric_array_has_p_near_one():
    """Columns come in pairs (c, -c): every draw has a mirror draw as likely, so the draws are
    symmetric about 0 and the two-sided p is about 1."""
    rng = np.random.default_rng(0)
    half = rng.choice([-1.0, 0.0, 1.0], size=(5, 30))
    t = crossed_bootstrap(np.concatenate([half, -half], axis=1), resamples=4000)
    assert t.diff == 0.0 and t.p_value > 0.9 and t.low < 0 < t.high


def test_a_strong_effect_has_the_smallest_p():
    """Five seeds x 100 problems, the method solves 30% more problems (0/1 differences, no
    negative ones): no draw reaches 0."""
    d = np.zeros((5, 100))
    d[:, :30] = 1.0
    t = crossed_bootstrap(d, resamples=2000)
    assert t.diff == pytest.approx(0.3) and t.p_value == t.p_min == pytest.approx(2 / 2001)
    assert 0.2 < t.low < 0.3 < t.high < 0.4


def test_seed_variance_widens_the_interval_over_a_problem_only_bootstrap():
    """d[s, p] = a_s + b_p (seed offsets and problem effects, no interaction). A crossed draw is
    mean(a*) + mean(b*) with independent draws, so its variance is var(a)/S + var(b)/P (population
    variances). A problem-only bootstrap (seeds fixed) sees var(b)/P alone: far too narrow here."""
    a = np.array([0.3, -0.1, 0.2, 0.0, 0.1])
    b = np.tile([0.3, -0.3, 0.1, -0.1], 50)  # 200 problems, mean 0
    d = a[:, None] + b[None, :]
    t = crossed_bootstrap(d, resamples=20000, seed=1)
    assert t.diff == pytest.approx(0.1)
    sd = math.sqrt(a.var() / 5 + b.var() / 200)  # sqrt(0.02/5 + 0.05/200) = 0.065: mostly the seeds
    assert t.high - t.low == pytest.approx(2 * 1.96 * sd, rel=0.1)
    rng = np.random.default_rng(1)
    draws = d[:, rng.integers(0, 200, size=(20000, 200))].mean(axis=(0, 2))  # problems only
    low, high = np.percentile(draws, [2.5, 97.5])
    assert high - low == pytest.approx(2 * 1.96 * math.sqrt(b.var() / 200), rel=0.1)
    assert t.high - t.low > 3 * (high - low)


def test_crossed_bootstrap_needs_a_two_dimensional_array():
    with pytest.raises(ValueError, match=r"\(seeds, problems\) array with both >= 1, got shape \(4,\)"):
        crossed_bootstrap([0.1, 0.2, 0.3, 0.4])


# -- budget matching -----------------------------------------------------------------------------


def test_budget_matching_by_hand(tmp_path):
    """A: 100 trained tokens per step, B: 150; both evaluate at steps 0, 2, 4. Budget = min(400,
    600) = 400: A at its last evaluation (step 4, 400 tokens), B at step 2 (300 <= 400 < 600)."""
    a = load_run(make_run(tmp_path, "a", tokens=100.0))
    b = load_run(make_run(tmp_path, "b", tokens=150.0))
    assert matched_steps(a, b, "eval/pass@1", "tokens/trained") == (4, 2, 400.0)
    assert matched_steps(b, a, "eval/pass@1", "tokens/trained") == (2, 4, 400.0)
    # generated tokens are 150 per step for both: equal budgets, both at their last evaluation
    assert matched_steps(a, b, "eval/pass@1", "tokens/generated") == (4, 4, 600.0)
    steps = matched_steps(a, b, "eval/pass@1", None)
    assert steps[:2] == (4, 4) and math.isnan(steps[2])
    c = load_run(make_run(tmp_path, "c", tokens=250.0))  # 250/step: at 2 -> 500 > 400, only step 0 fits
    assert matched_steps(a, c, "eval/pass@1", "tokens/trained") == (4, 0, 400.0)
    assert matched_steps(c, load_run(make_run(tmp_path, "d", tokens=40.0)), "eval/pass@1", "tokens/trained") == (0, 4, 160.0)


def test_a_budget_key_that_is_not_a_logged_cumulative_counter_is_one_line(tmp_path):
    run = load_run(make_run(tmp_path, "a"))
    with pytest.raises(CompareError, match=r"^--at-equal train/tokens_trained: not a cumulative counter\. "
                       r"Did you mean 'tokens/trained'\? Cumulative keys: tokens/trained, tokens/generated, "
                       r"time/train_s\.$"):
        check_budget_key([run], "train/tokens_trained")
    run.rows = [{k: v for k, v in r.items() if k != "time/train_s"} for r in run.rows]
    with pytest.raises(CompareError, match=r"time/train_s: no run logs it\. Cumulative keys logged: "
                       r"tokens/trained, tokens/generated\.$"):
        check_budget_key([run], "time/train_s")
    check_budget_key([run], "tokens/trained")


# -- what an evaluation records ------------------------------------------------------------------


class _Ctx:
    def encode(self, text):
        return [1, 2]


class _Backend:
    def generate(self, requests, sampling):
        return [Completion((5,), (1,), (0.0,), "eos", "2") for _ in requests]


class _Verifier:
    """Problem i is solved greedily when i is even; sampled answers alternate right and wrong."""

    def __init__(self):
        self.calls = 0

    def reset_metrics(self):
        pass

    def metrics(self):
        return {}

    def score(self, problems, completions):
        self.calls += 1
        if self.calls == 1:  # the greedy pass
            values = [float(int(p.id[1:]) % 2 == 0) for p in problems]
        else:
            values = [float(i % 2) for i in range(len(problems))]
        return Rewards(tuple(values), tuple({} for _ in problems))


def test_evaluate_problems_gives_every_problem_its_outcome():
    problems = [Problem(f"p{i}", f"q{i}", "a") for i in range(5)]
    metrics, out = evaluate_problems(_Backend(), _Verifier(), _Ctx(), problems, EvalConfig(problems=5, samples=2, k=2),
                                     RolloutConfig(), 0)
    assert out.ids == ["p0", "p1", "p2", "p3", "p4"] and out.greedy == [1, 0, 1, 0, 1]
    assert out.correct == [1, 1, 1, 1, 1]  # each problem's 2 samples: one wrong, one right
    assert metrics["eval/pass@1"] == pytest.approx(sum(out.greedy) / 5)
    assert metrics["eval/sample_accuracy"] == pytest.approx(sum(out.correct) / 10)
    assert out.record(7, 2) == {"step": 7, "samples": 2, "ids": out.ids, "greedy": out.greedy, "correct": out.correct}


def test_gathered_outcomes_keep_the_test_rows_order(monkeypatch):
    """Three ranks score contiguous shares; the gathered record lists them in the global order."""
    ids = [f"t{i}" for i in range(7)]
    parts = [ProblemOutcomes(s, [int(i[1:]) % 2 for i in s], [int(i[1:]) for i in s]) for s in (shard(ids, r, 3) for r in range(3))]
    monkeypatch.setattr(evaluation, "rank_and_world", lambda: (1, 3))
    monkeypatch.setattr(evaluation.dist, "all_gather_object", lambda out, obj: out.__setitem__(slice(None), parts))
    got = gather_outcomes(parts[1])
    assert got.ids == ids and got.greedy == [0, 1, 0, 1, 0, 1, 0] and got.correct == list(range(7))
    monkeypatch.setattr(evaluation, "rank_and_world", lambda: (0, 1))
    assert gather_outcomes(parts[0]) is parts[0]


def test_read_records_skips_cut_lines_and_keeps_the_last_of_a_step(tmp_path):
    lines = [{"step": 0, "samples": 0, "ids": ["a"], "greedy": [0], "correct": []},
             {"step": 2, "samples": 0, "ids": ["a"], "greedy": [0], "correct": []},
             {"step": 2, "samples": 0, "ids": ["a"], "greedy": [1], "correct": []}]
    (tmp_path / PROBLEMS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "ids": ["a"')
    records = read_records(tmp_path)
    assert sorted(records) == [0, 2] and records[2]["greedy"] == [1]
    assert read_records(tmp_path / "missing") == {}


# -- compare on fabricated runs ------------------------------------------------------------------


def write_problems(run_dir, outcomes_by_step, samples=4):
    """``eval_problems.jsonl`` with ``{step: (greedy list, correct list)}`` over problems q0, q1, ..."""
    lines = []
    for step, (greedy, correct) in sorted(outcomes_by_step.items()):
        ids = [f"q{i}" for i in range(len(greedy))]
        lines.append({"step": step, "samples": samples, "ids": ids, "greedy": greedy, "correct": correct})
    (run_dir / PROBLEMS_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))


def _greedy(solved, n=40):
    return [1 if i in solved else 0 for i in range(n)]


def test_compare_reports_the_per_problem_test(tmp_path):
    """Five seeds x 40 problems. The baseline solves problems 0-19 at its last evaluation; the
    method solves 0-19 plus 5 more per seed (20-24 shifted by the seed): d = +1 on 5 problems of
    each seed, so the mean difference is 5/40 = 0.125 and no draw is <= 0."""
    for seed in range(5):
        base = make_run(tmp_path, f"grpo-{seed}", "grpo", seed, evals={0: 0.5, 2: 0.5, 4: 0.5})
        meth = make_run(tmp_path, f"oracle-{seed}", "oracle", seed, evals={0: 0.5, 2: 0.55, 4: 0.625})
        write_problems(base, {s: (_greedy(range(20)), [2] * 40) for s in EVALS})
        write_problems(meth, {s: (_greedy(set(range(20)) | {20 + (seed + j) % 20 for j in range(5)}), [3] * 40)
                              for s in EVALS})
    out = tmp_path / "report"
    main(["compare", str(tmp_path), "--out", str(out), "--bootstrap", "999"])
    md = (out / "report.md").read_text()
    assert "## Per problem against the baseline 'grpo' (seeds x problems, eval/pass@1, at the last evaluations)" in md
    row = next(line for line in md.splitlines() if line.startswith("| oracle | +0.125 |"))
    assert "| 0.002 (smallest possible 0.002) | 5 x 40 | last evaluation (step 4) | paired on seeds 0, 1, 2, 3, 4 x 40 problems" in row
    test = json.loads((out / "compare.json").read_text())["problem_tests"][0]
    assert test["diff"] == pytest.approx(0.125) and (test["seeds"], test["problems"]) == (5, 40)
    assert test["p_value"] == pytest.approx(0.002) and 0.05 <= test["bootstrap_ci95"][0] < 0.125 < test["bootstrap_ci95"][1]
    assert test["steps"][0] == {"seed": 0, "step": 4, "baseline_step": 4, "budget": None}


def test_per_problem_test_uses_sample_accuracy_and_budget_matched_steps(tmp_path):
    """The method trains 200 tokens per step, the baseline 100: at equal trained tokens (budget
    400) the method is compared at step 2 and the baseline at step 4. Sample accuracy: 3/4 vs 1/4
    correct at those steps (other steps hold decoys), so d = 0.5 everywhere."""
    for seed in range(3):
        base = make_run(tmp_path, f"grpo-{seed}", "grpo", seed, tokens=100.0)
        meth = make_run(tmp_path, f"m-{seed}", "m", seed, tokens=200.0)
        for d in (base, meth):  # sample accuracy rows beside pass@1
            rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            for r in rows:
                if "eval/pass@1" in r:
                    r["eval/sample_accuracy"] = r["eval/pass@1"] + (0.01 * seed if d is meth else 0.0)
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        write_problems(base, {0: ([0] * 8, [0] * 8), 2: ([0] * 8, [0] * 8), 4: ([0] * 8, [1] * 8)})
        write_problems(meth, {0: ([0] * 8, [0] * 8), 2: ([1] * 8, [3] * 8), 4: ([1] * 8, [4] * 8)})
    c = compare([tmp_path], metric="eval/sample_accuracy", resamples=500, at_equal="tokens/trained")
    (t,) = c.problem_tests
    assert t.result.diff == pytest.approx(0.5) and (t.result.low, t.result.high) == (0.5, 0.5)
    assert [s[1:] for s in t.steps] == [(2, 4, 400.0)] * 3
    assert t.at == "equal tokens/trained <= 400 (steps 2; baseline 4)"
    assert "outcome correct / samples" in t.note and "3 seeds: no p" in t.note
    row = problem_rows(c)[1][0]  # DESIGN.md section 9: no bootstrap p over fewer than 5 seeds
    assert row[3] == "— (needs 5 seeds)" and to_json(c)["problem_tests"][0]["p_value"] is None
    # the seed-level test at equal budget: sample accuracy at step 2 (0.6 + 0.01 s) vs at step 4 (0.8)
    budget = next(x for x in c.tests if x.quantity == "at equal tokens/trained")
    assert budget.result.diff == pytest.approx(-0.19) and budget.result.n == "3 pairs"
    assert [x.quantity for x in c.tests] == ["final", "auc", "at equal tokens/trained"]
    with pytest.raises(CompareError, match="--at-equal tokens/train: not a cumulative counter. Did you mean 'tokens/trained'"):
        compare([tmp_path], at_equal="tokens/train")


def test_runs_without_records_or_pairing_say_why(tmp_path, capsys):
    for seed in (0, 1):
        make_run(tmp_path / "old", f"grpo-{seed}", "grpo", seed)
        make_run(tmp_path / "old", f"m-{seed}", "m", seed)
    (t,) = compare([tmp_path / "old"], resamples=100).problem_tests
    assert t.result is None and t.note.startswith("no per-problem test: run ") and "has no eval_problems.jsonl" in t.note
    for seed in (0, 1):
        write_problems(make_run(tmp_path / "unpaired", f"grpo-{seed}", "grpo", seed), {s: ([1], [1]) for s in EVALS})
        write_problems(make_run(tmp_path / "unpaired", f"m-{seed}", "m", seed + 5), {s: ([1], [1]) for s in EVALS})
    (t,) = compare([tmp_path / "unpaired"], resamples=100).problem_tests
    assert t.result is None and "UNPAIRED: seeds do not match" in t.note
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path / "old"), "--at-equal", "train/tokens_generated"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not a cumulative counter" in err and len(err.strip().splitlines()) <= 2
