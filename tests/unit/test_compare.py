"""``creditlab compare`` on synthetic run directories written here (no training): numbers computed
by hand, grouping, bad and unfinished runs reported, the CLI's messages."""

import json
import math
import os
import socket

import pytest
import yaml
from creditlab.analysis import significance, stats
from creditlab.analysis.compare import CompareError, aggregate_curve, compare
from creditlab.analysis.rundirs import find_runs, load_run
from creditlab.cli import main
from scipy import stats as scipy_stats

EVALS = {0: 0.5, 2: 0.6, 4: 0.8}


def make_run(root, name, method="grpo", seed=0, evals=EVALS, steps=4, max_steps=None, tokens=100.0,
             generated=150.0, step_s=0.5, status="finished", summary=True, cfg=None, credit=None):
    """A run directory as the runner writes it: eval rows at ``evals`` steps, train rows every
    step with linear counters (``tokens`` trained and ``generated`` per step)."""
    d = root / name
    d.mkdir(parents=True)
    config = {"method": method, "seed": seed, "run_dir": str(d), "trainer": {"max_steps": max_steps or steps},
              "advantage": {"name": method, "std": "sample"}, "eval": {"every": 2}}
    for key, value in (cfg or {}).items():  # dotted overrides
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    rows = []
    for s in range(steps + 1):
        if s:
            rows.append({"step": s, "wall": s, "train/reward/mean": 0.5 + 0.05 * s, "tokens/trained": s * tokens,
                         "tokens/generated": s * generated, "time/step_s": step_s, "time/train_s": s * step_s,
                         **(credit or {})})
        if s in evals:
            rows.append({"step": s, "wall": s + 0.5, "eval/pass@1": evals[s]})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (d / "summary.json").write_text(json.dumps({"steps": steps}))
    if status is not None:
        state = {"status": status, "pid": os.getpid(), "host": socket.gethostname(), "started": "t"}
        if status == "failed":
            state["error"] = {"type": "RuntimeError", "message": "CUDA out of memory"}
        (d / "status.json").write_text(json.dumps(state))
    return d


def shifted(shift):
    return {s: v + shift for s, v in EVALS.items()}


# -- statistics ----------------------------------------------------------------------------------

def test_t_interval_of_a_known_sample():
    ci = stats.mean_ci([1, 2, 3, 4, 5])
    # s = sqrt(2.5), se = s / sqrt(5) = sqrt(0.5); t_{0.975, 4} = 2.7764 (table value)
    assert ci.mean == 3 and ci.n == 5
    assert ci.half_width == pytest.approx(2.7764 * math.sqrt(0.5), abs=1e-4)
    assert stats.mean_ci([0.7]).n == 1 and math.isnan(stats.mean_ci([0.7]).half_width)
    assert stats.mean_ci([]).n == 0


def test_t_quantiles_match_the_table_and_the_normal_limit():
    assert stats.t_quantile(2) == pytest.approx(4.3027, abs=1e-4)
    assert stats.t_quantile(30) == pytest.approx(2.0423, abs=1e-4)
    assert 2.0211 < stats.t_quantile(35) < 2.0423
    assert stats.t_quantile(10**6) == pytest.approx(1.96, abs=1e-3)
    assert stats.t_quantile(4, level=0.90) == pytest.approx(2.1318, abs=1e-4)
    with pytest.raises(ValueError, match="degrees of freedom must be > 0, got 0"):
        stats.t_quantile(0)


def test_auc_of_known_curves():
    assert stats.normalized_auc([0, 2, 4], [0.5, 0.6, 0.8]) == pytest.approx((2 * 0.55 + 2 * 0.7) / 4)
    assert stats.normalized_auc([0, 10], [0, 1]) == pytest.approx(0.5)
    assert stats.normalized_auc([0, 1, 4], [0, 1, 1]) == pytest.approx(3.5 / 4)
    assert stats.normalized_auc([3], [0.4]) == 0.4


def test_first_crossing_and_median_with_misses():
    assert stats.first_crossing([0, 200, 400], [0.5, 0.6, 0.8], 0.6) == 200
    assert stats.first_crossing([0, 200], [0.5, 0.55], 0.6) is None
    assert stats.median_with_misses([200, 400, None]) == 400
    assert stats.median_with_misses([200, None, None]) is None
    assert stats.median_with_misses([100, 300]) == 200


def test_issue_example_exact_sign_flip_p_is_a_quarter():
    # .71, .72, .73 against .70 x 3: differences .01, .02, .03. Of the 2^3 = 8 sign patterns only
    # (+,+,+) reaches a mean >= .02 and only (-,-,-) one <= -.02: two-sided p = 2/8. (The old
    # paired bootstrap said p = 1e-4.)
    r = significance.paired_test([0.71, 0.72, 0.73], [0.70] * 3)
    assert r.p_value == 0.25 and r.p_min == 0.25
    assert (r.test, r.n, r.paired, r.exact, r.arrangements) == ("exact sign-flip", "3 pairs", True, True, 8)
    assert r.description == "exact sign-flip, 3 pairs (8 arrangements; smallest possible p 0.25)"
    # paired t-interval: .02 ± t_{0.975,2} * sd(.01,.02,.03) / sqrt(3) = .02 ± 4.302653 * .01 / sqrt(3)
    assert r.diff == pytest.approx(0.02)
    assert (r.t_low, r.t_high) == pytest.approx((0.02 - 0.0248414, 0.02 + 0.0248414), abs=1e-6)
    scipy_ci = scipy_stats.ttest_rel([0.71, 0.72, 0.73], [0.70] * 3).confidence_interval(0.95)
    assert (r.t_low, r.t_high) == pytest.approx((scipy_ci.low, scipy_ci.high), abs=1e-12)
    assert r.boot_low is None, "no bootstrap interval with 3 pairs"


def test_sign_flip_with_five_pairs():
    # differences .01 .02 .03 -.01 .05 (sum .10, |d| sum .12): a pattern's sum is .12 - 2 * (sum of
    # the flipped |d|), >= .10 when the flipped ones sum to <= .01: none, or either .01 -> 3 of 32.
    r = significance.paired_test([0.71, 0.72, 0.73, 0.69, 0.75], [0.70] * 5)
    assert r.p_value == pytest.approx(2 * 3 / 32) and r.p_min == pytest.approx(2 / 32)
    assert significance.paired_test([0.71, 0.72, 0.73, 0.74, 0.75], [0.70] * 5).p_value == pytest.approx(2 / 32)
    # and one-sided-looking data never go below the floor, however consistent
    assert significance.paired_test([1.0] * 5, [0.0] * 5).p_value == pytest.approx(0.0625)


def test_a_collapse_mode_with_mean_zero_reads_greater_whenever_no_seed_draws_it():
    """docs/comparing.md, 'What "greater" means': a seed's difference is +0.25 with probability 0.8
    and -1.0 (a collapse) with 0.2, mean 0. Over every number k of collapses among 8 seeds, the
    sign-flip test says "greater" at 0.05 only at k = 0 (p 2/256), so with probability 0.8^8."""
    rate = 0.0
    for k in range(9):
        r = significance.paired_test([0.25] * (8 - k) + [-1.0] * k, [0.0] * 8)
        if r.p_value < 0.05 and r.diff > 0:
            rate += math.comb(8, k) * 0.2**k * 0.8 ** (8 - k)
        if k == 1:  # 7 x .25 and one -1: sums >= .75 in 99 + 1 of 256 patterns
            assert r.p_value == pytest.approx(2 * 100 / 256)
    assert rate == pytest.approx(0.8**8) and 0.16 < rate < 0.17
    assert significance.paired_test([0.25] * 8, [0.0] * 8).t_low > 0  # the t-interval cannot see it either


def test_sign_flip_ties_and_zero_differences():
    # a zero difference flips to itself: 2 informative pairs, p = 2 * 1/4
    r = significance.paired_test([0.71, 0.70, 0.73], [0.70] * 3)
    assert r.p_value == pytest.approx(0.5) and r.p_min == pytest.approx(0.5)
    # equal magnitudes (.01 and -.01, computed along different float paths) tie exactly:
    # sums >= .02 of 4 - 2F (in .01) need F <= 1: none, either .01 -> 3/8, two-sided 6/8
    assert significance.paired_test([0.71, 0.69, 0.72], [0.70] * 3).p_value == pytest.approx(0.75)
    same = significance.paired_test([0.5, 0.6, 0.7], [0.5, 0.6, 0.7])
    assert (same.diff, same.t_low, same.t_high, same.p_value, same.p_min) == (0.0, 0.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="one length >= 2, got 3 and 2"):
        significance.paired_test([0.5, 0.6, 0.7], [0.5, 0.6])


def test_exact_permutation_for_unpaired_samples():
    # 3 vs 3: C(6, 3) = 20 splits; the observed one is the most extreme: two-sided p = 2/20
    r = significance.unpaired_test([0.71, 0.72, 0.73], [0.70, 0.69, 0.68])
    assert (r.test, r.n, r.exact, r.arrangements) == ("exact permutation", "3 vs 3", True, 20)
    assert r.p_value == pytest.approx(0.1) and r.p_min == pytest.approx(0.1)
    welch = scipy_stats.ttest_ind([0.71, 0.72, 0.73], [0.70, 0.69, 0.68], equal_var=False).confidence_interval()
    assert (r.t_low, r.t_high) == pytest.approx((welch.low, welch.high), abs=1e-12)
    # ties: [1, 1] vs [0, 0] -> of C(4, 2) = 6 splits one has the group mean 1: 2 * 1/6
    tied = significance.unpaired_test([1.0, 1.0], [0.0, 0.0])
    assert tied.p_value == pytest.approx(1 / 3) and tied.p_min == pytest.approx(1 / 3)
    assert (tied.t_low, tied.t_high) == (1.0, 1.0), "both samples constant: zero-width interval"
    assert significance.unpaired_test([0.2, 0.4, 0.6], [0.2, 0.4, 0.6]).p_value == 1.0


def test_large_n_is_monte_carlo_with_a_bootstrap_interval():
    # 20 pairs: 2^20 patterns > EXACT_LIMIT, so B random ones; no random pattern of 20 positive
    # differences reaches the observed mean, so p is its floor 2/(B+1).
    r = significance.paired_test([1.0 + 0.01 * i for i in range(20)], [0.0] * 20, resamples=999, seed=1)
    assert (r.test, r.exact, r.arrangements) == ("Monte Carlo sign-flip", False, 999)
    assert r.p_value == pytest.approx(2 / 1000) and r.p_min == pytest.approx(2 / 1000)
    assert r.boot_low is not None and r.boot_low < r.diff < r.boot_high
    assert r == significance.paired_test([1.0 + 0.01 * i for i in range(20)], [0.0] * 20, resamples=999, seed=1)
    assert significance.paired_test([1.0] * 19, [0.0] * 19, resamples=999).boot_low is None


def test_iqm_by_hand_and_its_stratified_bootstrap():
    assert significance.iqm([0.1, 0.2, 0.3, 0.4, 0.9]) == pytest.approx(0.3)  # cuts one each end
    assert significance.iqm([1, 2, 3, 4, 5, 6, 7, 8]) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert significance.iqm([0.71, 0.72, 0.76]) == pytest.approx(0.73)  # 3 runs: nothing cut
    few = significance.iqm_interval([0.71, 0.72, 0.76])
    assert (few.value, few.low, few.high, few.runs, few.tasks) == (pytest.approx(0.73), None, None, 3, 1)
    # two tasks, every run of a task scoring the same: resampling runs within a task changes
    # nothing, so the stratified interval has zero width (pooled resampling would not).
    flat = significance.iqm_interval([[0.2, 0.8]] * 10, resamples=500)
    assert (flat.value, flat.low, flat.high, flat.runs, flat.tasks) == (pytest.approx(0.5), 0.5, 0.5, 10, 2)
    # one task, runs 0 and 1: resampled IQMs (means of 2) are 0, .5, .5, 1 -> interval [0, 1]
    two = significance.iqm_interval([0.0, 1.0], resamples=4000, min_n=2)
    assert (two.value, two.low, two.high) == (0.5, 0.0, 1.0)


# -- reading and grouping ------------------------------------------------------------------------

def test_find_runs_skips_hidden_and_run_subfolders(tmp_path):
    d = make_run(tmp_path / "multirun" / "2026-01-01", "0")
    (d / ".hydra").mkdir()
    (d / ".hydra" / "config.yaml").write_text("a: 1")
    (d / "checkpoints").mkdir()
    assert find_runs([tmp_path / "multirun"]) == [d.resolve()]
    assert find_runs([d]) == [d.resolve()]


def test_find_runs_follows_folder_links_without_looping(tmp_path):
    a = make_run(tmp_path / "sweep_a", "0")
    b = make_run(tmp_path / "sweep_b", "1")
    pick = tmp_path / "pick"
    pick.mkdir()
    (pick / "a").symlink_to(a, target_is_directory=True)
    (pick / "b").symlink_to(b.parent, target_is_directory=True)
    (pick / "loop").symlink_to(pick, target_is_directory=True)  # a cycle is walked once
    assert find_runs([pick]) == sorted([a.resolve(), b.resolve()])


def test_no_runs_names_the_paths_searched(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CompareError, match="no run directories found under .*empty"):
        compare([tmp_path / "empty"])
    with pytest.raises(CompareError, match="no such file or directory: '.*nope'"):
        compare([tmp_path / "nope"])


def test_group_by_nested_key(tmp_path):
    for i, std in enumerate(["sample", "sample", "none", "none"]):
        make_run(tmp_path, f"r{i}", seed=i % 2, cfg={"advantage.std": std})
    c = compare([tmp_path], by=["advantage.std"], resamples=100)
    assert [g.label for g in c.groups] == ["none", "sample"]  # no grpo group label: first one
    assert [len(g.used) for g in c.groups] == [2, 2]
    c = compare([tmp_path], by=["method", "advantage.std"], baseline="grpo,sample", resamples=100)
    assert c.baseline == "method=grpo,advantage.std=sample"
    assert {g.label for g in c.groups} == {"method=grpo,advantage.std=none", "method=grpo,advantage.std=sample"}


def test_unknown_by_key_and_baseline_suggest(tmp_path):
    make_run(tmp_path, "r0")
    with pytest.raises(CompareError, match="Did you mean 'advantage.std'"):
        compare([tmp_path], by=["advantage.stdd"])
    with pytest.raises(CompareError, match="Did you mean 'grpo'.*Groups: grpo"):
        compare([tmp_path], baseline="gpro")
    with pytest.raises(CompareError, match="--metric eval/pass@2: no run logs it. Did you mean 'eval/pass@1'"):
        compare([tmp_path], metric="eval/pass@2")


def test_full_comparison_by_hand(tmp_path):
    for seed in range(3):
        make_run(tmp_path, f"grpo-{seed}", "grpo", seed, evals=shifted(0.01 * seed))
        make_run(tmp_path, f"srpo-{seed}", "srpo", seed, evals=shifted(0.01 * seed + 0.1), tokens=50.0)
    c = compare([tmp_path], resamples=999)
    grpo, srpo = c.groups
    assert c.baseline == "grpo" and grpo.label == "grpo"
    assert grpo.final.mean == pytest.approx(0.81) and grpo.final.n == 3
    assert grpo.final.half_width == pytest.approx(stats.t_quantile(2) * 0.01 / math.sqrt(3))
    assert srpo.auc.mean == pytest.approx((2 * 0.55 + 2 * 0.7) / 4 + 0.11)
    # threshold = baseline final mean 0.81: grpo seeds reach it at step 4 only for seed 1, 2
    # (0.81, 0.82); seed 0 ends at 0.80 -> median of [inf, 400, 400] = 400.
    assert c.settings["threshold"] == pytest.approx(0.81)
    assert grpo.to_threshold["tokens/trained"] == (400.0, 2)
    # srpo: 0.6 + 0.1 + 0.01 s >= 0.81 only at step 4 (0.9..) -> 4 * 50 trained, 4 * 150 generated
    assert srpo.to_threshold["tokens/trained"] == (200.0, 3)
    assert srpo.to_threshold["tokens/generated"] == (600.0, 3)
    assert grpo.step_time == 0.5
    final, auc = c.tests
    assert final.result.paired and final.result.diff == pytest.approx(0.1)
    # a constant shift on 3 seeds: the exact sign-flip test's floor, not a bootstrap's 1/(B+1)
    assert final.result.p_value == pytest.approx(0.25) and final.result.test == "exact sign-flip"
    assert "paired on seeds 0, 1, 2" in final.note and "no result can reach p < 0.05" in final.note
    assert grpo.iqm["final"].value == pytest.approx(0.81) and grpo.iqm["final"].low is None
    assert auc.quantity == "auc" and auc.result.diff == pytest.approx(0.1)


def test_unpaired_fallback_when_seeds_differ(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path, f"grpo-{seed}", "grpo", seed)
        make_run(tmp_path, f"srpo-{seed}", "srpo", seed + 10)
    test = compare([tmp_path], resamples=200).tests[0]
    assert not test.result.paired and "UNPAIRED" in test.note and "seeds do not match" in test.note


def test_one_seed_has_no_test(tmp_path):
    make_run(tmp_path, "a", "grpo", 0)
    make_run(tmp_path, "b", "srpo", 0)
    t = compare([tmp_path], resamples=100).tests[0]
    assert t.result is None and "at least 2 runs" in t.note


def test_step_axis_aligned_and_token_axis_interpolated(tmp_path):
    a = load_run(make_run(tmp_path, "a", tokens=100.0))  # eval at 0, 200, 400 trained tokens
    b = load_run(make_run(tmp_path, "b", tokens=200.0))  # eval at 0, 400, 800
    band = aggregate_curve([a, b], "eval/pass@1", "step")
    assert not band.interpolated and list(band.x) == [0, 2, 4]
    assert list(band.mean) == pytest.approx([0.5, 0.6, 0.8]) and list(band.half) == pytest.approx([0, 0, 0])
    band = aggregate_curve([a, b], "eval/pass@1", "tokens/trained")
    assert band.interpolated and band.x[0] == 0 and band.x[-1] == 400  # the range both cover
    # at 400 tokens a is at step 4 (0.8) and b at step 2 (0.6): mean 0.7, half-width
    # t_{0.975,1} * std([0.8, 0.6]) / sqrt(2) = 12.7062 * 0.1
    assert band.mean[-1] == pytest.approx(0.7) and band.half[-1] == pytest.approx(1.27062)
    assert band.mean[0] == pytest.approx(0.5) and len(band.x) == 100


# -- bad, crashed and unfinished runs ------------------------------------------------------------

def test_bad_runs_are_reported_not_dropped(tmp_path):
    for seed in (0, 1):
        make_run(tmp_path, f"ok-{seed}", seed=seed)
    make_run(tmp_path, "crashed", seed=2, steps=2, max_steps=4, status="failed", summary=False)
    make_run(tmp_path, "legacy-partial", seed=3, steps=2, max_steps=4, status=None, summary=False)
    make_run(tmp_path, "legacy-finished", seed=4, status=None)
    killed = make_run(tmp_path, "killed", seed=5, steps=2, max_steps=4, status="running", summary=False)
    state = json.loads((killed / "status.json").read_text())
    (killed / "status.json").write_text(json.dumps({**state, "pid": 2**22 + 12345}))  # no such pid
    make_run(tmp_path, "running", seed=6, steps=2, max_steps=4, status="running", summary=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text("method: grpo\nseed: 7\n")
    (empty / "metrics.jsonl").write_text("")
    c = compare([tmp_path], resamples=100)
    by_name = {r.name: r for r in c.runs}
    assert by_name["crashed"].status == "failed"
    assert "RuntimeError: CUDA out of memory" in by_name["crashed"].detail and "2/4 steps" in by_name["crashed"].detail
    assert by_name["legacy-partial"].status == "partial" and "no summary.json" in by_name["legacy-partial"].detail
    assert by_name["legacy-finished"].status == "finished" and by_name["legacy-finished"].used
    assert by_name["killed"].status == "killed" and "is gone" in by_name["killed"].detail
    assert by_name["running"].status == "running"
    assert by_name["empty"].status == "empty" and "metrics.jsonl is empty" in by_name["empty"].detail
    assert [r.name for r in c.runs if r.used] == ["legacy-finished", "ok-0", "ok-1"]
    warning = c.warnings[0]
    for name in ("crashed", "legacy-partial", "killed", "running", "empty"):
        assert name in warning
    report = compare([tmp_path], resamples=100, include_unfinished=True)
    assert {r.name for r in report.runs if r.used} == {r.name for r in c.runs} - {"empty"}


def test_unreadable_status_falls_back_to_the_old_rules(tmp_path):
    cut = make_run(tmp_path, "cut", status=None, summary=False)
    (cut / "status.json").write_text('{"status": "runn')
    no_pid = make_run(tmp_path, "no-pid", status=None, summary=False)
    (no_pid / "status.json").write_text('{"status": "running"}')
    assert load_run(cut).status == "partial"
    assert load_run(no_pid).status == "killed"


def test_config_mismatch_within_a_group_warns(tmp_path):
    make_run(tmp_path, "a", seed=0, steps=4)
    make_run(tmp_path, "b", seed=1, steps=4, cfg={"trainer.max_steps": 8})
    c = compare([tmp_path], resamples=100)
    assert any("configs differ" in w and "trainer.max_steps" in w and "8 (b)" in w for w in c.warnings)


def test_truncated_last_line_is_skipped_and_noted(tmp_path):
    d = make_run(tmp_path, "a", status="running", summary=False)
    with (d / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "train/rew')
    run = load_run(d)
    assert "1 unreadable line(s)" in run.detail and run.steps == 4


# -- the command line and the report files -------------------------------------------------------

def test_cli_writes_report_and_prints_table(tmp_path, capsys):
    for seed in (0, 1):
        make_run(tmp_path / "runs", f"grpo-{seed}", "grpo", seed, credit={"train/credit/neg_mass_at": 0.25})
        make_run(tmp_path / "runs", f"srpo-{seed}", "srpo", seed, evals=shifted(0.05),
                 credit={"train/credit/neg_mass_at": 0.5})
    make_run(tmp_path / "runs", "srpo-crash", "srpo", 2, status="failed", summary=False)
    out = tmp_path / "report"
    main(["compare", str(tmp_path / "runs"), "--out", str(out), "--bootstrap", "500"])
    printed = capsys.readouterr().out
    assert "grpo (baseline)" in printed and "srpo" in printed and "srpo-crash" in printed
    for name in ("report.md", "report.html", "compare.json", "curves_step.png", "curves_tokens_trained.png",
                 "curves_tokens_generated.png", "curves_time.png", "final.png"):
        assert (out / name).exists(), name
    md = (out / "report.md").read_text()
    assert "grpo (baseline)" in md and "| srpo |" in md and "CUDA out of memory" in md
    assert "neg_mass_at" in md and "0.500 ± 0.000 (n=2)" in md
    assert "data:image/png;base64," in (out / "report.html").read_text()
    # 2 seeds, a constant shift: exact sign-flip over 4 patterns, p = 2/4; shown with its test and n.
    # Holm over the table's 2 tests (final, AUC), both p = 0.5: 2 * 0.5 = 1, then max(1, 0.5) = 1.
    assert "| +0.050 | [+0.050, +0.050] | 0.5 | 1 | exact sign-flip, 2 pairs (4 arrangements; smallest possible p 0.5) | — |" in md
    assert "## Exploratory: Against the baseline 'grpo': exact seed-level tests (primary)" in md
    assert "Holm p: Holm-adjusted over the 2 test(s) with a p in this table (the family: every group x quantity here)" in md
    # fewer than 8 paired seeds: a warning with the exact floor, in the report and on the terminal
    floor = "'srpo' vs 'grpo': 2 paired seeds, so the exact seed-level test cannot go below p = 2/2^2 = 0.5; claims need >= 8 seeds"
    assert floor in md and "(floor 2/2^8 = 0.0078)" in md and floor in " ".join(printed.split())
    assert "no result can reach p < 0.05" in md and "0.800 (n=2, no interval below n=20)" in md
    numbers = json.loads((out / "compare.json").read_text())
    test = numbers["tests"][0]
    assert test["diff"] == pytest.approx(0.05) and (test["p_value"], test["p_min"]) == (0.5, 0.5)
    assert (test["test"], test["n"], test["sides"], test["bootstrap_ci95"]) == ("exact sign-flip", "2 pairs", "two-sided", None)
    assert [t["p_holm"] for t in numbers["tests"]] == [1.0, 1.0] and numbers["settings"]["holm"] is True
    assert numbers["preregistration"] is None
    assert numbers["groups"][0]["iqm"]["final"] == {"iqm": pytest.approx(0.8), "ci95": None, "runs": 2, "tasks": 1}


def test_cli_errors_exit_2_with_a_message(tmp_path, capsys):
    for argv, text in ((["compare", str(tmp_path)], "no run directories found under"),
                       (["compare", str(tmp_path), "--bootstrap", "0"], "--bootstrap must be a positive"),
                       (["compare"], "the following arguments are required: RUN_DIR")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "creditlab: error: " in err and text in err, err
