"""Per-problem evaluation (issue 15 item 3): the crossed t-test over seeds x problems, budget
matching (``--at-equal``: exactly equal budgets, read between evaluations; ``matched_steps``, the
older rule ``sweeps/plot_horizon.py`` keeps), the per-problem records an evaluation gives, and
``creditlab compare`` on fabricated run directories with ``eval_problems.jsonl``."""

import json
import math

import numpy as np
import pytest
from creditlab.analysis.compare import CompareError, compare
from creditlab.analysis.problem_records import PROBLEMS_FILE, check_budget_key, matched_steps, read_records
from creditlab.analysis.report import problem_rows, to_json
from creditlab.analysis.rundirs import load_run
from creditlab.analysis.significance import crossed_test, mean_squares
from creditlab.cli import main
from creditlab.step import evaluation
from creditlab.step.distributed import shard
from creditlab.step.evaluation import EvalConfig, ProblemOutcomes, evaluate_problems, gather_outcomes
from creditlab.types import Completion, Problem, Rewards, RolloutConfig
from scipy import stats as scipy_stats

from tests.unit.test_compare import EVALS, make_run

# -- the statistic --------------------------------------------------------------------------------


def test_crossed_test_by_hand():
    """d = [[0, 1, 2], [2, 3, 7]] (S = 2 seeds, P = 3 problems). Grand mean 2.5, seed means 1 and 4,
    problem means 1, 2, 4.5. MS_seed = 3 (1.5² + 1.5²) / 1 = 13.5; MS_problem = 2 (1.5² + 0.5² + 2²)
    / 2 = 6.5; residuals ±0.5, ±0.5, ∓1 in each row: MS_resid = 3 / 2 = 1.5. Components: seed
    (13.5 − 1.5) / 3 = 4, problem (6.5 − 1.5) / 2 = 2.5, residual 1.5; the mean's variance
    4/2 + 2.5/3 + 1.5/6 = 18.5/6 on S − 1 = 1 df (a seed component is estimated: Hsu's
    conservative choice; Satterthwaite's would be 18.5² / (13.5²/1 + 6.5²/2 + 1.5²/2) = 1.67)."""
    d = [[0, 1, 2], [2, 3, 7]]
    assert mean_squares(d) == pytest.approx((13.5, 6.5, 1.5))
    t = crossed_test(d)
    assert (t.diff, t.seeds, t.problems) == (2.5, 2, 3)
    assert (t.var_seed, t.var_problem, t.var_resid) == pytest.approx((4.0, 2.5, 1.5))
    assert t.se == pytest.approx(math.sqrt(18.5 / 6)) and t.df == 1.0
    half = 12.706204736174707 * math.sqrt(18.5 / 6)  # t_{0.975, 1}
    assert (t.low, t.high) == pytest.approx((2.5 - half, 2.5 + half))
    assert t.p_value == pytest.approx(2 * scipy_stats.t.sf(2.5 / math.sqrt(18.5 / 6), 1))


def test_a_negative_component_is_set_to_zero_and_leaves_the_sum():
    """d = [[1, 2, 3], [2, 1, 3]]: both seeds average 2 (MS_seed = 0), problem means 1.5, 1.5, 3
    (MS_problem = 2 (0.25 + 0.25 + 1) / 2 = 1.5), residuals ±0.5 (MS_resid = 1 / 2 = 0.5). The seed
    component (0 − 0.5) / 3 < 0 is set to 0; the problem one is (1.5 − 0.5) / 2 = 0.5, so the
    variance is 0.5/3 + 0.5/6 = MS_problem / (S P) = 0.25 on P − 1 = 2 df: t = 2 / 0.5 = 4, and
    with 2 df P(T > t) = 1/2 − t / (2 √(2 + t²)), so p = 1 − 4/√18 = 0.0572."""
    t = crossed_test([[1, 2, 3], [2, 1, 3]])
    assert (t.var_seed, t.var_problem, t.var_resid) == pytest.approx((0.0, 0.5, 0.5))
    assert (t.se, t.df) == pytest.approx((0.5, 2.0))
    assert t.p_value == pytest.approx(1 - 4 / math.sqrt(18))
    assert (t.low, t.high) == pytest.approx((2 - 4.302653 * 0.5, 2 + 4.302653 * 0.5), abs=1e-6)
    # both components negative: the residual mean square alone, on (S - 1)(P - 1) = 1 df (Cauchy:
    # P(|T| >= 1) = 0.5)
    both = crossed_test([[1, 0], [0, 1]])
    assert (both.var_seed, both.var_problem, both.se, both.df, both.p_value) == pytest.approx((0, 0, 0.5, 1, 0.5))


def test_a_seed_component_set_to_zero_keeps_the_seed_means_test():
    """d = [[0, 1, 2, 3], [1, 2, 3, 1]]: seed means 1.5 and 1.75 (MS_seed = 4 (0.125² + 0.125²) = 0.125),
    problem means 0.5, 1.5, 2.5, 2 (MS_problem = 2 · 2.1875 / 3 = 1.4583), MS_resid = 1.125 > MS_seed:
    the seed component is set to 0. The crossed variance MS_problem / (S P) = 0.1823 on P − 1 = 3 df
    gives t = 1.625 / 0.4270 = 3.81, p = 0.032; the seed means' t-test, se √(0.125 / 8) = 0.125 on
    S − 1 = 1 df, t = 13, p = 1 − (2/π) atan 13 = 0.0489 (Cauchy). The larger p is the test's, with
    its interval: the clipped branch alone rejected at up to 2x the nominal rate at α/6 and 7x at 0.001."""
    t = crossed_test([[0, 1, 2, 3], [1, 2, 3, 1]])
    assert t.var_seed == 0 and t.diff == pytest.approx(1.625)
    assert 2 * scipy_stats.t.sf(1.625 / math.sqrt(1.4583333 / 8), 3) == pytest.approx(0.0319, abs=1e-4)  # not this
    assert t.p_value == pytest.approx(1 - 2 / math.pi * math.atan(13))
    assert (t.se, t.df) == pytest.approx((0.125, 1.0))
    assert (t.low, t.high) == pytest.approx((1.625 - 12.706204736174707 * 0.125, 1.625 + 12.706204736174707 * 0.125))
    assert t.p_value == pytest.approx(scipy_stats.ttest_1samp([1.5, 1.75], 0.0).pvalue)


def test_seed_effects_alone_give_the_t_test_of_the_seed_means():
    """d[s, p] = a_s: no problem or residual variance, so the variance is that of the seed means
    over S and df = S − 1: exactly the one-sample t-test of the seed means (the small-seed
    correction a bootstrap lacks)."""
    a = np.array([0.3, -0.1, 0.2, 0.0, 0.1])
    t = crossed_test(np.repeat(a[:, None], 40, axis=1))
    ref = scipy_stats.ttest_1samp(a, 0.0)
    assert t.df == pytest.approx(4) and t.p_value == pytest.approx(ref.pvalue)
    assert (t.low, t.high) == pytest.approx(tuple(ref.confidence_interval(0.95)))


def test_additive_seed_and_problem_effects_add_their_variances():
    """d[s, p] = a_s + b_p (no interaction): MS_resid = 0, so the variance of the mean is
    var(a)/S + var(b)/P (sample variances); a test over problems alone would see var(b)/P only,
    here a tenth of it."""
    a = np.array([0.3, -0.1, 0.2, 0.0, 0.1])
    b = np.tile([0.3, -0.3, 0.1, -0.1], 50)  # 200 problems, mean 0
    t = crossed_test(a[:, None] + b[None, :])
    assert t.diff == pytest.approx(0.1) and t.var_resid == pytest.approx(0, abs=1e-12)
    assert t.se == pytest.approx(math.sqrt(a.var(ddof=1) / 5 + b.var(ddof=1) / 200))
    assert t.se > 3 * math.sqrt(b.var(ddof=1) / 200)


def test_all_equal_differences_give_that_value_and_a_zero_width_interval():
    t = crossed_test(np.full((3, 4), 0.25))
    assert (t.diff, t.low, t.high, t.se, t.p_value) == (0.25, 0.25, 0.25, 0.0, 0.0)
    zero = crossed_test(np.zeros((3, 4)))
    assert (zero.diff, zero.low, zero.high, zero.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_crossed_test_needs_two_seeds_and_two_problems():
    with pytest.raises(ValueError, match=r"\(seeds, problems\) array with both >= 2, got shape \(4,\)"):
        crossed_test([0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match=r"got shape \(1, 3\)"):
        crossed_test([[0.1, 0.2, 0.3]])


# -- budget matching -----------------------------------------------------------------------------


def test_budget_matching_by_hand(tmp_path):
    """``matched_steps`` (``sweeps/plot_horizon.py``; compare reads at exactly equal budgets, see
    test_at_equal_reads_both_runs_at_exactly_equal_budgets). A: 100 trained tokens per step, B:
    150; both evaluate at steps 0, 2, 4. Budget = min(400, 600) = 400: A at its last evaluation
    (step 4, 400 tokens), B at step 2 (300 <= 400 < 600)."""
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
    each seed, so the mean difference is 5/40 = 0.125, every seed's mean is 0.125 (MS_seed = 0: no
    seed component) and problems 20-28 are solved by 1, 2, 3, 4, 5, 4, 3, 2, 1 more seeds. By hand:
    problem means c_p = 0.2, 0.4, ..., 0.2 and 31 zeros, sum of (c_p - 0.125)^2 = 85/25 - 40/64 =
    2.775, MS_problem = 5 * 2.775 / 39; the variance of the mean is MS_problem / (5 * 40) on 39 df."""
    for seed in range(5):
        base = make_run(tmp_path, f"grpo-{seed}", "grpo", seed, evals={0: 0.5, 2: 0.5, 4: 0.5})
        meth = make_run(tmp_path, f"oracle-{seed}", "oracle", seed, evals={0: 0.5, 2: 0.55, 4: 0.625})
        write_problems(base, {s: (_greedy(range(20)), [2] * 40) for s in EVALS})
        write_problems(meth, {s: (_greedy(set(range(20)) | {20 + (seed + j) % 20 for j in range(5)}), [3] * 40)
                              for s in EVALS})
    out = tmp_path / "report"
    main(["compare", str(tmp_path), "--out", str(out), "--bootstrap", "999"])
    md = (out / "report.md").read_text()
    assert "## Exploratory: Per problem against the baseline 'grpo' (secondary; seeds x problems, eval/pass@1, at the last evaluations)" in md
    row = next(line for line in md.splitlines() if line.startswith("| oracle | +0.125 |"))
    se = math.sqrt(5 * 2.775 / 39 / 200)
    p = 2 * scipy_stats.t.sf(0.125 / se, 39)  # 0.00516
    # one test in the table: Holm leaves it as it is
    assert f"| [+0.040, +0.210] | {p:.3g} | {p:.3g} | 39 | 5 x 40 | last evaluation (step 4) | paired on seeds 0, 1, 2, 3, 4 x 40 problems" in row
    test = json.loads((out / "compare.json").read_text())["problem_tests"][0]
    assert test["diff"] == pytest.approx(0.125) and (test["seeds"], test["problems"]) == (5, 40)
    assert (test["p_value"], test["p_holm"], test["se"], test["df"]) == pytest.approx((p, p, se, 39))
    assert test["t_ci95"] == pytest.approx([0.125 - scipy_stats.t.ppf(0.975, 39) * se, 0.125 + scipy_stats.t.ppf(0.975, 39) * se])
    assert test["variance_components"]["seed"] == 0 and test["test"] == "crossed random-effects t (seeds x problems)"
    assert test["steps"][0] == {"seed": 0, "step": 4, "baseline_step": 4, "budget": None}


def test_per_problem_test_uses_sample_accuracy_at_equal_budget(tmp_path):
    """The method trains 200 tokens per step, the baseline 100: at exactly equal trained tokens
    (budget 400) the method is read at its step 2 (400 tokens, no interpolation needed) and the
    baseline at step 4. Sample accuracy: 3/4 vs 1/4 correct at those steps (other steps hold
    decoys), so d = 0.5 everywhere."""
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
    assert t.at == "exactly equal tokens/trained = 400 (interpolated between evaluations)"
    assert "outcome correct / samples" in t.note and "3 seeds: no p" in t.note
    row = problem_rows(c)[1][0]  # no per-problem p below 5 seeds (coverage under 95% there)
    assert row[3] == "— (needs 5 seeds)" and to_json(c)["problem_tests"][0]["p_value"] is None
    # the seed-level test at equal budget: sample accuracy at step 2 (0.6 + 0.01 s) vs at step 4 (0.8)
    budget = next(x for x in c.tests if x.quantity == "at equal tokens/trained")
    assert budget.result.diff == pytest.approx(-0.19) and budget.result.n == "3 pairs"
    assert "; exactly equal tokens/trained = 400 (interpolated between evaluations);" in budget.note
    assert [x.quantity for x in c.tests] == ["final", "auc", "at equal tokens/trained"]
    with pytest.raises(CompareError, match="--at-equal tokens/train: not a cumulative counter. Did you mean 'tokens/trained'"):
        compare([tmp_path], at_equal="tokens/train")


def test_at_equal_reads_both_runs_at_exactly_equal_budgets(tmp_path):
    """Two seeds; both groups evaluate at steps 0, 2, 4. The method trains 100 tokens per step
    (totals 0, 200, 400 at its evaluations); the baseline 90 on seed 0 (0, 180, 360) and 95 on
    seed 1 (0, 190, 380). Budgets: min(400, 360) = 360 and min(400, 380) = 380, the baseline's
    last evaluations, where the baseline is read. The method is read between its steps 2 (200)
    and 4 (400) with weight w = (360 - 200) / 200 = 0.8 on step 4 for seed 0 and (380 - 200) / 200
    = 0.9 for seed 1 (positions 2 + 2 w = 3.6 and 3.8).

    Seed level (pass@1: method 0.6 at step 2, 0.8 at step 4; baseline 0.7 at step 4): seed 0
    0.6 + 0.8 x 0.2 - 0.7 = +0.06, seed 1 0.6 + 0.9 x 0.2 - 0.7 = +0.08, mean +0.07. The old rule
    (the last evaluation within the budget: the method's step 2 on both seeds) gave 0.6 - 0.7 = -0.10.

    Per problem (4 problems, greedy 0/1 read as a probability): the method solves q0 at step 2
    and q0-q2 at step 4, the baseline q0, q1 at step 4. Seed 0: (1, 0.8, 0.8, 0) - (1, 1, 0, 0) =
    (0, -0.2, +0.8, 0); seed 1: (1, 0.9, 0.9, 0) - (1, 1, 0, 0) = (0, -0.1, +0.9, 0); mean over
    the 8 cells (0.6 + 0.8) / 8 = +0.175. The old rule: (1, 0, 0, 0) - (1, 1, 0, 0) on both
    seeds, -0.25. The pre-registered section, declared on tokens/trained, gives the same numbers."""
    declared = {"name": "exact", "metric": "eval/pass@1", "budgets": ["tokens/trained"], "baseline": "grpo",
                "contrasts": [{"group": "m", "expect": "greater"}], "alpha": 0.05, "min_seeds": 2}
    cfg = {"preregistration": declared}
    for seed, rate in ((0, 90.0), (1, 95.0)):
        base = make_run(tmp_path, f"grpo-{seed}", "grpo", seed, evals={0: 0.5, 2: 0.6, 4: 0.7}, tokens=rate, cfg=cfg)
        meth = make_run(tmp_path, f"m-{seed}", "m", seed, evals={0: 0.5, 2: 0.6, 4: 0.8}, tokens=100.0, cfg=cfg)
        write_problems(base, {0: ([0, 0, 0, 0], []), 2: ([1, 0, 0, 0], []), 4: ([1, 1, 0, 0], [])})
        write_problems(meth, {0: ([0, 0, 0, 0], []), 2: ([1, 0, 0, 0], []), 4: ([1, 1, 1, 0], [])})
    c = compare([tmp_path], resamples=100, at_equal="tokens/trained")
    (t,) = c.problem_tests
    assert t.at == "exactly equal tokens/trained = 360–380 (interpolated between evaluations)"
    assert [(s, a, b, x) for s, a, b, x in t.steps] == [(0, pytest.approx(3.6), 4, 360.0), (1, pytest.approx(3.8), 4, 380.0)]
    by_hand = crossed_test([[0, -0.2, 0.8, 0], [0, -0.1, 0.9, 0]])
    assert t.result.diff == pytest.approx(0.175) == pytest.approx(by_hand.diff)
    assert (t.result.low, t.result.high) == pytest.approx((by_hand.low, by_hand.high))
    budget = next(x for x in c.tests if x.quantity == "at equal tokens/trained")
    assert budget.result.diff == pytest.approx(0.07) and budget.result.n == "2 pairs"
    assert "exactly equal tokens/trained = 360–380 (interpolated between evaluations)" in budget.note
    (declared_test,) = c.prereg.tests  # the pre-registered reading agrees with --at-equal's
    assert declared_test.budgets == [360.0, 380.0]
    assert declared_test.result.diff == pytest.approx(budget.result.diff)
    assert declared_test.problem.diff == pytest.approx(t.result.diff)
    assert to_json(c)["problem_tests"][0]["steps"][1] == {"seed": 1, "step": pytest.approx(3.8), "baseline_step": 4,
                                                          "budget": 380.0}


def test_at_equal_says_which_record_a_budget_needs(tmp_path):
    """The method of seed 1 has no record at step 4, one of the two evaluations it is read
    between at the budget 300 (its totals 0, 200, 400; the baseline's 0, 150, 300)."""
    for seed in (0, 1):
        write_problems(make_run(tmp_path, f"grpo-{seed}", "grpo", seed, tokens=75.0), {s: ([1, 0], []) for s in EVALS})
        meth = make_run(tmp_path, f"m-{seed}", "m", seed, tokens=100.0)
        write_problems(meth, {s: ([1, 1], []) for s in EVALS if seed == 0 or s < 4})
    (t,) = compare([tmp_path], resamples=100, at_equal="tokens/trained").problem_tests
    assert t.result is None and t.note == "no per-problem test: run m-1 has no eval_problems.jsonl line for step 4"
    # at the last evaluations it needs step 4 as well; at the budget of generated tokens (150 per
    # step for both: 600, their last evaluations) too
    for key in (None, "tokens/generated"):
        (t,) = compare([tmp_path], resamples=100, at_equal=key).problem_tests
        assert t.note.endswith("run m-1 has no eval_problems.jsonl line for step 4")


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
