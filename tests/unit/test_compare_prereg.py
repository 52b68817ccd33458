"""``creditlab compare`` on fabricated runs that declare a comparison (``preregistration`` in their
config.yaml): the pre-registered section first (exact seed-level p, Holm over the declared family,
decisions against the predictions, the per-problem test beside), everything else exploratory;
the runs must agree on what they declared. Every number by hand."""

import json
import math

import pytest
from creditlab.analysis.compare import CompareError, compare
from creditlab.cli import main
from scipy import stats as scipy_stats

from tests.unit.test_compare import make_run
from tests.unit.test_paired_problems import _greedy, write_problems

DECLARED = {"name": "trap", "metric": "eval/pass@1", "budgets": ["steps", "tokens/generated"], "baseline": "grpo",
            "contrasts": [{"group": "oracle", "expect": "greater"}, {"group": "sham", "expect": "none"},
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
    """Exact sign-flip p: the oracle is above GRPO on all 8 seeds on both axes, 2/2^8 = 0.0078125;
    anti below on all 6, 2/2^6 = 0.03125; sham's ±0.01 balance, p = 1. Holm over the 6 declared
    tests: 6 x 0.0078125 = 0.046875 (and max(5 x 0.0078125, that)), 4 x 0.03125 = 0.125 (and
    max(3 x 0.03125, that)), then 1. At alpha 0.05 the oracle is greater (agrees), sham shows no
    difference (agrees with none), anti's 0.125 shows none (disagrees with less)."""
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
    # contrast, budget, prediction, seeds, difference, t-interval, p, Holm p, decision, agrees, per problem, note
    assert oracle[2:5] == ["greater", "8", "+0.2350"]  # mean of 0.2 + 0.01 s over s = 0..7
    assert oracle[6:10] == ["0.00781 (smallest possible 0.00781)", "0.0469", "greater than grpo", "yes"]
    se = math.sqrt(8 * 3.2 / 19 / 160)  # per problem: +1 on problems 10-13 of every seed (by hand below)
    assert oracle[10] == f"+0.200 [{0.2 - scipy_stats.t.ppf(0.975, 19) * se:+.3f}, " \
                         f"{0.2 + scipy_stats.t.ppf(0.975, 19) * se:+.3f}], p = {2 * scipy_stats.t.sf(0.2 / se, 19):.3g} (8 x 20)"
    tokens = rows[("oracle vs grpo", "tokens/generated = 600 (exactly equal)")]
    assert tokens[4] == "+0.1675" and tokens[7:10] == ["0.0469", "greater than grpo", "yes"]  # (0.6 + 0.7 + 0.01 s)/2 - 0.5
    assert tokens[10].startswith("+0.150 [")  # +1 on problems 10, 11 and +0.5 on 12, 13 (halfway): 3/20
    sham = rows[("sham vs grpo", "steps (last evaluations)")]
    assert sham[4] == "+0.0000" and sham[7:10] == ["1", "no difference shown", "yes"]
    anti = rows[("anti vs grpo", "tokens/generated = 600 (exactly equal)")]
    assert anti[2:5] == ["less", "6", "-0.1250"] and anti[6].startswith("0.0312 ")
    assert anti[7:10] == ["0.125", "no difference shown", "no"]
    assert "Holm correction over the declared family of 6 tests" in md and "Everything below this section is exploratory" in md
    warning = ("pre-registered contrast 'anti' vs 'grpo': 6 paired seed(s), fewer than the declared min_seeds 8 "
               "(smallest possible exact p 0.0312)")
    assert warning in md and warning in printed and "pre-registered comparison (config.yaml of 30 run(s))" in printed
    # compare.json: the same numbers
    numbers = json.loads((out / "compare.json").read_text())
    prereg = numbers["preregistration"]
    assert prereg["source"] == "config.yaml of 30 run(s)" and prereg["family"] == 6 and prereg["holm"] is True
    assert prereg["declaration"]["contrasts"][2] == {"group": "anti", "expect": "less"}
    got = {(t["group"], t["budget"]): t for t in prereg["tests"]}
    assert [got[("oracle", b)]["p_holm"] for b in ("steps", "tokens/generated")] == pytest.approx([0.046875] * 2)
    assert got[("oracle", "tokens/generated")]["budgets"] == [600.0] * 8
    assert got[("oracle", "steps")]["p_value"] == pytest.approx(2 / 256)
    assert (got[("anti", "steps")]["p_holm"], got[("anti", "steps")]["decision"], got[("anti", "steps")]["agrees"]) == (
        pytest.approx(0.125), "no difference shown", False)
    assert got[("oracle", "steps")]["per_problem"]["se"] == pytest.approx(se)
    assert got[("oracle", "steps")]["per_problem"]["variance_components"]["seed"] == 0
    assert numbers["settings"]["metric"] == "eval/pass@1" and numbers["settings"]["baseline"] == "grpo"


def test_without_holm_the_raw_p_decides(tmp_path):
    """--no-holm: anti's raw 0.03125 <= 0.05, so it is less (agrees); no Holm column anywhere."""
    _sweep(tmp_path / "runs")
    c = compare([tmp_path / "runs"], holm=False)
    anti = next(t for t in c.prereg.tests if t.group == "anti")
    assert anti.p_holm is None and c.prereg.decision(anti) == "less" and c.prereg.agrees(anti) is True
    assert all(t.p_holm is None for t in c.tests)
    main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "r"), "--no-holm"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Holm p" not in md and "No correction (--no-holm)" in md


def test_the_declared_settings_and_a_declaration_file(tmp_path, capsys):
    """The declaration sets by, baseline and metric; a --by or --baseline that would not test it is
    an error; --no-prereg makes the comparison exploratory; runs declaring different things are
    refused, naming which, unless --prereg FILE says which to test."""
    _sweep(tmp_path / "runs")
    with pytest.raises(CompareError, match=r"^--baseline sham: the pre-registration \(config.yaml of 30 run\(s\)\) "
                       r"declares grpo; drop --baseline, or add --no-prereg"):
        compare([tmp_path / "runs"], baseline="sham")
    with pytest.raises(CompareError, match="--by seed: the pre-registration"):
        compare([tmp_path / "runs"], by=["seed"])
    plain = compare([tmp_path / "runs"], baseline="sham", use_prereg=False)
    assert plain.prereg is None and plain.baseline == "sham"
    make_run(tmp_path / "runs", "grpo-8", "grpo", 8, cfg={"preregistration": {**DECLARED, "alpha": 0.01}})
    make_run(tmp_path / "runs", "grpo-9", "grpo", 9)  # declares nothing
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(tmp_path / "runs"), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert ("the runs declare different pre-registrations: 'trap' in anti-0, anti-1, anti-2, anti-3 and 26 more; "
            "'trap' (alpha differs) in grpo-8; none in grpo-9. Pass --prereg FILE") in err
    declared = tmp_path / "declared.yaml"
    declared.write_text("preregistration:\n  metric: eval/pass@1\n  budgets: [steps]\n  baseline: grpo\n"
                        "  contrasts:\n    - {group: oracle, expect: greater, budgets: [steps, tokens/generated]}\n"
                        "    - {group: ghost, expect: none}\n")
    c = compare([tmp_path / "runs"], prereg=declared)
    assert c.prereg.source == f"--prereg {declared}"
    assert [(t.group, t.budget) for t in c.prereg.tests] == [("oracle", "steps"), ("oracle", "tokens/generated"),
                                                             ("ghost", "steps")]
    # ghost has no runs: it stays in the family as p = 1 (Holm: 3 x 2/2^8, then max(2 x 2/2^8, that))
    oracle, _, ghost = c.prereg.tests
    assert ghost.result is None and ghost.note == "not tested: no such group" and c.prereg.decision(ghost) == "not tested"
    assert oracle.p_holm == pytest.approx(3 * 2 / 256) and ghost.p_holm == 1.0
    assert any(w.startswith("pre-registered group 'ghost' has no usable run") for w in c.warnings)
