"""The decomposition card's re-run of ``sweeps/decompose_trap.yaml`` as declared (issue 55;
docs/methods/decomposition.md, credit_trap_last), recomputed by ``creditlab compare`` from the
committed results file: the declaration the 48 runs recorded, each test's difference, interval,
Holm p and verdict, and the finals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import recompare

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "methods" / "img" / "decompose_trap" / "results.jsonl.gz"

pytestmark = pytest.mark.slow

#: (group, budget) -> (expect, diff, t-interval, Holm p, verdict), as the card gives them
CARD = {
    ("oracle_credit", "steps"): ("none", 0.0045, [0.0009, 0.0081], 0.0234, "equivalent"),
    ("sham_credit", "steps"): ("none", 0.0073, [0.0022, 0.0125], 0.266, "inconclusive"),
    ("anti_credit", "steps"): ("less", -0.0197, [-0.0315, -0.0079], 0.0625, "not shown"),
    ("reward_flip", "steps"): ("less", -0.0499, [-0.0594, -0.0403], 0.0391, "agrees"),
    ("srpo_oracle", "steps"): ("none", -0.0013, [-0.0110, 0.0083], 0.0938, "inconclusive"),
    ("srpo_oracle", "tokens/generated"): ("none", 0.0107, [0.0028, 0.0187], 0.59, "inconclusive"),
}


def test_the_card_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    assert prereg["declaration"]["baseline"] == "grpo" and prereg["holm"] is True
    assert prereg["source"].startswith("config.yaml of 48 run(s)") and prereg["deviations"] == []
    tests = {(t["group"], t["budget"]): t for t in prereg["tests"]}
    assert set(tests) == set(CARD)
    for key, (expect, diff, ci, p_holm, verdict) in CARD.items():
        t = tests[key]
        assert (t["expect"], t["verdict"], t["n"]) == (expect, verdict, "8 pairs"), key
        assert round(t["diff"], 4) == diff and [round(x, 4) for x in t["t_ci95"]] == ci, key
        assert t["p_holm"] == pytest.approx(p_holm, abs=5e-4), key
