"""``creditlab compare`` on fabricated runs that declare a comparison (``preregistration`` in their
config.yaml): the pre-registered section first (exact seed-level p, equivalence within a margin for
'none', Holm over the declared family, verdicts against the predictions, the per-problem test
beside), everything else exploratory; the runs must agree on what they declared. Each route that
could bend a verdict (--no-holm, --include-unfinished, seeds missing or added, a later file) is
tested by hand: the numbers still show, the verdict reads "not as declared" or the file gets its
own section. Every number by hand."""

import json
import math
import os
import subprocess

import pytest
from creditlab.analysis.compare import CompareError, compare
from creditlab.cli import main
from scipy import stats as scipy_stats

from tests.unit.test_compare import make_run
from tests.unit.test_paired_problems import _greedy, write_problems

DECLARED = {"name": "trap", "metric": "eval/pass@1", "budgets": ["steps", "tokens/generated"], "baseline": "grpo",
            "contrasts": [{"group": "oracle", "expect": "greater"}, {"group": "sham", "expect": "none", "margin": 0.02},
                          {"group": "anti", "expect": "less"}],
            "alpha": 0.05, "min_seeds": 8}
STEPS = (0, 2, 4)


def _sweep(root, declared=DECLARED):
    """Eight seeds. GRPO ends at 0.5 (150 generated tokens per step: 600 at step 4). The oracle
    reaches 0.6 at step 2 and 0.7 + 0.01 s at step 4 with 200 generated tokens per step, so at
    GRPO's 600 tokens it is read halfway between its steps 2 (400) and 4 (800). Sham: 0.5 ± 0.01
    alternating; anti (seeds 0-5 only): 0.4 - 0.01 s. Per problem (20): GRPO solves 0-9; the
    oracle 0-11 at step 2 and 0-13 at step 4."""
    cfg = {"preregistration": declared}
    for s in range(8):
        base = make_run(root, f"grpo-{s}", "grpo", s, evals={0: 0.5, 2: 0.5, 4: 0.5}, cfg=cfg)
        write_problems(base, {t: (_greedy(range(10), 20), [2] * 20) for t in STEPS})
        oracle = make_run(root, f"oracle-{s}", "oracle", s, evals={0: 0.5, 2: 0.6, 4: 0.7 + 0.01 * s},
                          generated=200.0, cfg=cfg)
        write_problems(oracle, {0: (_greedy(range(10), 20), [2] * 20), 2: (_greedy(range(12), 20), [2] * 20),
                                4: (_greedy(range(14), 20), [2] * 20)})
        make_run(root, f"sham-{s}", "sham", s, evals={0: 0.5, 2: 0.5, 4: 0.5 + (0.01 if s % 2 else -0.01)}, cfg=cfg)
        if s < 6:
            make_run(root, f"anti-{s}", "anti", s, evals={0: 0.5, 2: 0.45, 4: 0.4 - 0.01 * s}, cfg=cfg)


def test_the_declared_comparison_leads_the_report_with_holm_over_its_family(tmp_path, capsys):
    """Exact sign-flip p: the oracle is above GRPO on all 8 seeds on both axes, 2/2^8; anti below on
    all 6, 2/2^6 = 0.03125; sham's ±0.01 balance, p = 1, and within its margin 0.02 on every seed:
    both one-sided tests of d ± 0.02 reach their floor, 1/2^8. Holm over the 6 declared claim p's
    (sham's is its equivalence p): 1/256, 1/256, 2/256, 2/256, 1/32, 1/32 -> 6/256 (twice),
    4 x 2/256 = 0.03125 (twice), 2 x 1/32 = 0.0625 (twice). The oracle agrees, sham is equivalent,
    and anti, with 6 of the 8 declared seeds, is not as declared (its numbers shown)."""
    _sweep(tmp_path / "runs")
    out = tmp_path / "report"
    main(["compare", str(tmp_path / "runs"), "--out", str(out)])
    printed = " ".join(capsys.readouterr().out.split())
    md = (out / "report.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Pre-registered comparison"
    assert all(h.startswith("## Exploratory: ") for h in headings[1:] if h not in ("## Warnings", "## Runs"))
    assert "## Exploratory: Against the baseline 'grpo': exact seed-level tests (primary)" in headings
    rows = {(line.split(" | ")[0][2:], line.split(" | ")[1]): line.split(" | ") for line in md.splitlines()
            if line.startswith("| ") and " vs grpo | " in line}
    oracle = rows[("oracle vs grpo", "steps (last evaluations)")]
    # contrast, budget, prediction, seeds, difference, t-interval, p, p equivalent, Holm p, decision, verdict,
    # per problem, note
    assert oracle[2:5] == ["greater", "8", "+0.2350"]  # mean of 0.2 + 0.01 s over s = 0..7
    assert oracle[6:11] == ["0.00781 (smallest possible 0.00781)", "—", "0.0312", "greater than grpo", "agrees"]
    se = math.sqrt(8 * 3.2 / 19 / 160)  # per problem: +1 on problems 10-13 of every seed (by hand below)
    assert oracle[11] == f"+0.200 [{0.2 - scipy_stats.t.ppf(0.975, 19) * se:+.3f}, " \
                         f"{0.2 + scipy_stats.t.ppf(0.975, 19) * se:+.3f}], p = {2 * scipy_stats.t.sf(0.2 / se, 19):.3g} (8 x 20)"
    tokens = rows[("oracle vs grpo", "tokens/generated = 600 (exactly equal)")]
    assert tokens[4] == "+0.1675" and tokens[8:11] == ["0.0312", "greater than grpo", "agrees"]  # (0.6 + 0.7 + 0.01 s)/2 - 0.5
    assert tokens[11].startswith("+0.150 [")  # +1 on problems 10, 11 and +0.5 on 12, 13 (halfway): 3/20
    sham = rows[("sham vs grpo", "steps (last evaluations)")]
    assert sham[2] == "none (within ±0.02)" and sham[4] == "+0.0000"
    assert sham[7:11] == ["0.00391", "0.0234", "no difference shown", "equivalent"]
    anti = rows[("anti vs grpo", "tokens/generated = 600 (exactly equal)")]
    assert anti[2:5] == ["less", "6", "-0.1250"] and anti[6].startswith("0.0312 ")
    assert anti[8:11] == ["0.0625", "no difference shown", "not as declared (6 paired seed(s), declared at least 8)"]
    assert "Holm correction over the declared family of 6 tests" in md and "Everything below the declared sections is exploratory" in md
    warning = ("pre-registered contrast 'anti' vs 'grpo': 6 paired seed(s), declared at least 8: its verdict is not "
               "as declared (smallest possible exact p 0.0312)")
    assert warning in md and warning in printed and "pre-registered comparison (config.yaml of 30 run(s))" in printed
    # compare.json: the same numbers
    numbers = json.loads((out / "compare.json").read_text())
    prereg = numbers["preregistration"]
    assert prereg["source"] == "config.yaml of 30 run(s)" and prereg["family"] == 6 and prereg["holm"] is True
    assert prereg["declaration"]["contrasts"][1:] == [{"group": "sham", "expect": "none", "margin": 0.02},
                                                      {"group": "anti", "expect": "less"}]
    got = {(t["group"], t["budget"]): t for t in prereg["tests"]}
    assert [got[("oracle", b)]["p_holm"] for b in ("steps", "tokens/generated")] == pytest.approx([0.03125] * 2)
    assert got[("sham", "steps")]["p_equivalent"] == pytest.approx(1 / 256) and got[("sham", "steps")]["verdict"] == "equivalent"
    assert got[("oracle", "tokens/generated")]["budgets"] == [600.0] * 8
    assert got[("oracle", "steps")]["p_value"] == pytest.approx(2 / 256)
    anti = got[("anti", "steps")]
    assert (anti["p_holm"], anti["decision"], anti["agrees"], anti["deviations"]) == (
        pytest.approx(0.0625), "no difference shown", None, ["6 paired seed(s), declared at least 8"])
    assert got[("oracle", "steps")]["per_problem"]["se"] == pytest.approx(se)
    assert got[("oracle", "steps")]["per_problem"]["variance_components"]["seed"] == 0
    assert numbers["settings"]["metric"] == "eval/pass@1" and numbers["settings"]["baseline"] == "grpo"


def test_no_holm_shows_the_raw_p_but_the_verdict_is_not_as_declared(tmp_path):
    """--no-holm: anti's raw 0.03125 <= 0.05 decides 'less', but the declared correction was Holm,
    so no verdict confirms or refutes anything (before: 'less, agrees'). A declaration of
    ``correction: none`` is read as declared without Holm."""
    _sweep(tmp_path / "runs")
    c = compare([tmp_path / "runs"], holm=False)
    anti, oracle = (next(t for t in c.prereg.tests if t.group == g) for g in ("anti", "oracle"))
    assert anti.p_holm is None and c.prereg.decision(anti) == "less" and c.prereg.agrees(anti) is None
    assert c.prereg.verdict(oracle) == "not as declared (--no-holm (declared: Holm over the family of 6))"
    assert all(t.p_holm is None for t in c.tests)
    main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "r"), "--no-holm"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Holm p" not in md and "No correction (--no-holm, not as declared)" in md
    _sweep(tmp_path / "plain", {**DECLARED, "correction": "none", "min_seeds": 6})
    c = compare([tmp_path / "plain"])
    anti, sham = (next(t for t in c.prereg.tests if t.group == g) for g in ("anti", "sham"))
    assert c.prereg.holm is False and c.prereg.verdict(anti) == "agrees"  # raw 2/2^6 <= 0.05, as declared
    assert c.prereg.verdict(sham) == "equivalent"  # 1/256 <= 0.05


def test_an_unfinished_run_or_a_missing_seed_makes_the_verdict_not_as_declared(tmp_path):
    """The oracle's seed 7 stopped early. Left out (the default), 7 paired seeds are fewer than
    declared; counted (--include-unfinished), an unfinished run enters the test. Either way the
    numbers show and the verdict is not as declared."""
    _sweep(tmp_path / "runs")
    state = json.loads((tmp_path / "runs" / "oracle-7" / "status.json").read_text())
    (tmp_path / "runs" / "oracle-7" / "status.json").write_text(json.dumps({**state, "status": "stopped"}))
    oracle = next(t for t in compare([tmp_path / "runs"]).prereg.tests if t.group == "oracle")
    assert len(oracle.seeds) == 7 and oracle.result.p_value == pytest.approx(2 / 128)
    assert compare([tmp_path / "runs"]).prereg.verdict(oracle) == "not as declared (7 paired seed(s), declared at least 8)"
    c = compare([tmp_path / "runs"], include_unfinished=True)
    oracle = next(t for t in c.prereg.tests if t.group == "oracle")
    assert len(oracle.seeds) == 8 and oracle.result.p_value == pytest.approx(2 / 256)
    assert c.prereg.verdict(oracle) == "not as declared (unfinished run(s) counted: oracle-7 (--include-unfinished))"
    assert c.prereg.verdict(next(t for t in c.prereg.tests if t.group == "sham")) == "equivalent"  # all finished


def test_declared_seeds_are_the_ones_tested(tmp_path):
    """``seeds: [0..7]``: two more seeds run later are left out (and said so), the verdict stands;
    a declared seed that is missing makes it not as declared."""
    declared = {**DECLARED, "seeds": list(range(8))}
    _sweep(tmp_path / "runs", declared)
    for s in (8, 9):  # added after the fact, on the oracle's side of the line
        make_run(tmp_path / "runs", f"grpo-{s}", "grpo", s, evals={0: 0.5, 2: 0.5, 4: 0.5}, cfg={"preregistration": declared})
        make_run(tmp_path / "runs", f"oracle-{s}", "oracle", s, evals={0: 0.5, 2: 0.6, 4: 0.9},
                 generated=200.0, cfg={"preregistration": declared})
    c = compare([tmp_path / "runs"])
    oracle = next(t for t in c.prereg.tests if t.group == "oracle" and t.budget == "steps")
    assert oracle.seeds == list(range(8)) and oracle.result.diff == pytest.approx(0.235)
    assert oracle.note.endswith("; seeds 8, 9 not declared, left out") and c.prereg.verdict(oracle) == "agrees"
    for name in ("oracle-3",):
        for f in (tmp_path / "runs" / name).iterdir():
            f.unlink()
        (tmp_path / "runs" / name).rmdir()
    c = compare([tmp_path / "runs"])
    oracle = next(t for t in c.prereg.tests if t.group == "oracle" and t.budget == "steps")
    assert 3 not in oracle.seeds and len(oracle.seeds) == 7
    assert c.prereg.verdict(oracle) == "not as declared (declared seed(s) 3 missing)"


def test_a_none_prediction_can_fail(tmp_path):
    """Without a margin (a block recorded before margins), 'none' is never confirmed: inconclusive.
    With one, a sham as strong as the oracle (+0.2 on every seed) is 'different' (its p 2/256 at
    0.05 over the family of 6: 6 x 2/256 = 0.047), and a sham that swings ±0.03 around GRPO is
    neither: its difference p is 1, and d - 0.02 is +0.01 on four seeds and -0.05 on four, so a mean
    as low as -0.02 needs all four -0.05 kept (16 of 256 sign patterns): equivalence p 0.0625."""
    old = {**DECLARED, "contrasts": [{"group": "oracle", "expect": "greater"}, {"group": "sham", "expect": "none"},
                                     {"group": "anti", "expect": "less"}]}
    _sweep(tmp_path / "old", old)
    c = compare([tmp_path / "old"])
    sham = next(t for t in c.prereg.tests if t.group == "sham")
    assert c.prereg.decision(sham) == "no difference shown" and c.prereg.verdict(sham) == "inconclusive (no margin declared)"
    assert c.prereg.agrees(sham) is False
    for s in range(8):
        for f in (tmp_path / "old" / f"sham-{s}").iterdir():
            f.unlink()
        make_run(tmp_path / "strong", f"sham-{s}", "sham", s, evals={0: 0.5, 2: 0.6, 4: 0.7}, cfg={"preregistration": DECLARED})
        make_run(tmp_path / "swing", f"sham-{s}", "sham", s, evals={0: 0.5, 2: 0.5, 4: 0.5 + (0.03 if s % 2 else -0.03)},
                 cfg={"preregistration": DECLARED})
    _sweep(tmp_path / "runs")
    others = [tmp_path / "runs" / f"{m}-{s}" for m in ("grpo", "oracle", "anti") for s in range(8)
              if (tmp_path / "runs" / f"{m}-{s}").exists()]
    strong = compare(others + [tmp_path / "strong"])
    sham = next(t for t in strong.prereg.tests if t.group == "sham" and t.budget == "steps")
    assert sham.result.p_value == pytest.approx(2 / 256) and strong.prereg.verdict(sham) == "different"
    swing = compare(others + [tmp_path / "swing"])
    sham = next(t for t in swing.prereg.tests if t.group == "sham" and t.budget == "steps")
    assert sham.result.p_value == 1.0 and sham.p_equivalent == pytest.approx(16 / 256)
    assert swing.prereg.verdict(sham) == "inconclusive"


def _git(repo, *args, date=None):
    env = {**os.environ, **({"GIT_COMMITTER_DATE": date, "GIT_AUTHOR_DATE": date} if date else {})}
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True, env=env)


def test_a_later_declaration_is_its_own_section_on_fresh_runs(tmp_path, capsys):
    """A file cannot relabel the runs: runs declaring different things are refused (or, given a
    later file, get no pre-registered section); the file must be committed, is dated by its commit,
    and is tested only on runs started after it, under its own heading, with its own baseline
    (credit alone against the sham)."""
    _sweep(tmp_path / "runs")
    make_run(tmp_path / "runs", "grpo-9", "grpo", 9)  # declares nothing
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert ("the runs declare different pre-registrations: 'trap' in anti-0, anti-1, anti-2, anti-3 and 26 more; "
            "none in grpo-9. Compare the runs of one declaration, or add --no-prereg") in err
    repo = tmp_path / "decl"
    repo.mkdir()
    later = repo / "later.yaml"
    later.write_text("preregistration:\n  metric: eval/pass@1\n  budgets: [steps]\n  baseline: sham\n"
                     "  contrasts:\n    - {group: oracle, expect: greater}\n  seeds: [20, 21, 22, 23, 24, 25, 26, 27]\n")
    with pytest.raises(CompareError, match=r"later.yaml: not a committed file of a git repository; a later declaration is "
                       r"dated by its commit"):
        compare([tmp_path / "runs"], prereg=later)
    _git(repo, "init", "-q")
    _git(repo, "add", "later.yaml")
    _git(repo, "commit", "-qm", "declare", date="2026-06-01T12:00:00+00:00")
    later.write_text(later.read_text() + "  alpha: 0.1\n")
    with pytest.raises(CompareError, match="later.yaml: changed since its last commit"):
        compare([tmp_path / "runs"], prereg=later)
    _git(repo, "checkout", "-q", "later.yaml")
    c = compare([tmp_path / "runs"], prereg=later)  # every run predates it: nothing to test
    assert c.prereg is None and c.later.later and len(c.later.left_out) == 31
    assert c.later.left_out[0].endswith("(no start time in status.json)") and c.later.tests[0].result is None
    assert c.warnings[0].endswith("none in grpo-9: no pre-registered section")
    fresh = tmp_path / "fresh"
    for s in range(20, 28):
        for name, method, top in ((f"sham-{s}", "sham", 0.5), (f"oracle-{s}", "oracle", 0.52 + 0.001 * s)):
            d = make_run(fresh, name, method, s, evals={0: 0.5, 2: 0.5, 4: top})
            state = json.loads((d / "status.json").read_text())
            (d / "status.json").write_text(json.dumps({**state, "started": "2026-06-02T09:00:00"}))
    d = make_run(fresh, "oracle-28", "oracle", 28, evals={0: 0.5, 2: 0.5, 4: 0.9})  # before the commit: left out
    (d / "status.json").write_text(json.dumps({**json.loads((d / "status.json").read_text()),
                                               "started": "2026-05-30T09:00:00"}))
    c = compare([tmp_path / "runs", fresh], prereg=later, baseline=None)
    (t,) = c.later.tests
    assert (t.baseline, t.seeds, t.result.diff) == ("sham", list(range(20, 28)), pytest.approx(0.0435))
    assert t.result.p_value == pytest.approx(2 / 256) and c.later.verdict(t) == "agrees"
    assert "fresh/oracle-28 (started 2026-05-30T09:00:00, before the declaration)" in c.later.left_out
    out = tmp_path / "r"
    main(["compare", str(tmp_path / "runs"), str(fresh), "--prereg", str(later), "--out", str(out)])
    md = (out / "report.md").read_text()
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert "## Later declaration (not pre-registered for earlier runs)" in md and "## Pre-registered comparison" not in md
    assert f"(committed 2026-06-01T12:00:00+00:00, commit {commit[:12]})" in md
    assert "| oracle vs sham | steps (last evaluations) | greater | 8 |" in md
    assert json.loads((out / "compare.json").read_text())["later_declaration"]["tests"][0]["verdict"] == "agrees"


def test_equivalent_wins_over_a_significant_difference_inside_the_margin(tmp_path):
    """Sham +0.005 on all 8 seeds, margin 0.02: its difference is significant (2/256 x 6 = 0.047)
    but lies within the margin (equivalence p 1/256, Holm 0.0234): the declared question is
    answered 'equivalent'."""
    _sweep(tmp_path / "runs")
    for s in range(8):
        for f in (tmp_path / "runs" / f"sham-{s}").iterdir():
            f.unlink()
        (tmp_path / "runs" / f"sham-{s}").rmdir()
        make_run(tmp_path / "runs", f"sham-{s}", "sham", s, evals={0: 0.5, 2: 0.5, 4: 0.505}, cfg={"preregistration": DECLARED})
    c = compare([tmp_path / "runs"])
    sham = next(t for t in c.prereg.tests if t.group == "sham" and t.budget == "steps")
    assert sham.result.p_value == pytest.approx(2 / 256) and c.prereg.significant(sham)
    assert sham.p_equivalent == pytest.approx(1 / 256) and c.prereg.verdict(sham) == "equivalent"


def test_runs_that_declared_nothing_get_a_report_that_is_exploratory_throughout(tmp_path, capsys):
    """Without a declaration no table is a claim: every table is headed 'Exploratory: ' and the
    report (and the terminal) say why, even where a p is small (here 2/2^8)."""
    for s in range(8):
        make_run(tmp_path / "runs", f"grpo-{s}", "grpo", s, evals={0: 0.5, 4: 0.5})
        make_run(tmp_path / "runs", f"oracle-{s}", "oracle", s, evals={0: 0.5, 4: 0.6 + 0.01 * s})
    main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "report")])
    printed = " ".join(capsys.readouterr().out.split())
    md = (tmp_path / "report" / "report.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert "## Pre-registered comparison" not in headings
    assert all(h.startswith("## Exploratory: ") for h in headings if h not in ("## Warnings", "## Runs"))
    assert "## Exploratory: Against the baseline 'grpo': exact seed-level tests (primary)" in headings
    assert "Nothing was declared before these runs" in md and "every table below is exploratory" in md
    assert "Nothing was declared before these runs" in printed and printed.index("Nothing was declared") < printed.index("exploratory: against baseline")
