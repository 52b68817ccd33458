"""``creditlab compare`` on synthetic run directories written here (no training): numbers computed
by hand, grouping, bad and unfinished runs reported, the CLI's messages."""

import json
import math
import os
import socket

import pytest
import yaml
from creditlab import stats
from creditlab.cli import main
from creditlab.compare import CompareError, aggregate_curve, compare
from creditlab.rundirs import find_runs, load_run

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
    # s = sqrt(2.5), se = s / sqrt(5) = sqrt(0.5); t_{0.975, 4} = 2.7764
    assert ci.mean == 3 and ci.n == 5
    assert ci.half_width == pytest.approx(2.7764 * math.sqrt(0.5), abs=1e-9)
    assert stats.mean_ci([0.7]).n == 1 and math.isnan(stats.mean_ci([0.7]).half_width)
    assert stats.mean_ci([]).n == 0


def test_t_quantiles_between_table_entries():
    assert stats.t_quantile_975(2) == 4.3027
    assert 2.0211 < stats.t_quantile_975(35) < 2.0423
    assert stats.t_quantile_975(10**6) == pytest.approx(1.96, abs=1e-3)
    with pytest.raises(ValueError):
        stats.t_quantile_975(0)


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


def test_bootstrap_identical_groups():
    r = stats.bootstrap_diff([0.5, 0.6, 0.7], [0.5, 0.6, 0.7], paired=True, resamples=2000)
    assert (r.diff, r.low, r.high, r.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert stats.bootstrap_diff([0.5, 0.6, 0.7], [0.5, 0.6, 0.7], paired=False).p_value == 1.0


def test_bootstrap_constant_shift():
    r = stats.bootstrap_diff([0.6, 0.7, 0.9], [0.5, 0.6, 0.8], paired=True, resamples=999)
    assert r.diff == pytest.approx(0.1) and r.low == pytest.approx(0.1) and r.high == pytest.approx(0.1)
    assert r.p_value == pytest.approx(1 / 1000)


def test_bootstrap_two_pairs_known_distribution():
    # differences [0, 1]: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4, so
    # P(|m - 0.5| >= 0.5) = 1/2 and the interval spans [0, 1].
    r = stats.bootstrap_diff([0.0, 1.0], [0.0, 0.0], paired=True, resamples=20000, seed=3)
    assert r.diff == 0.5 and (r.low, r.high) == (0.0, 1.0)
    assert r.p_value == pytest.approx(0.5, abs=0.02)
    again = stats.bootstrap_diff([0.0, 1.0], [0.0, 0.0], paired=True, resamples=20000, seed=3)
    assert again == r, "seeded: deterministic"


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
    assert grpo.final.half_width == pytest.approx(stats.t_quantile_975(2) * 0.01 / math.sqrt(3))
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
    assert final.result.p_value == pytest.approx(1 / 1000) and "paired on seeds 0, 1, 2" in final.note
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
    numbers = json.loads((out / "compare.json").read_text())
    assert numbers["tests"][0]["diff"] == pytest.approx(0.05)


def test_cli_errors_exit_2_with_a_message(tmp_path, capsys):
    for argv, text in ((["compare", str(tmp_path)], "no run directories found under"),
                       (["compare", str(tmp_path), "--bootstrap", "0"], "--bootstrap must be a positive"),
                       (["compare"], "the following arguments are required: RUN_DIR")):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "creditlab: error: " in err and text in err, err
