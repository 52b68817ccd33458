"""The decomposition card's re-test of ``sweeps/decompose_multi.yaml`` as declared (issue 55;
docs/methods/decomposition.md, "Re-run as declared"), recomputed by ``creditlab compare`` from the
committed results file: the declaration the 48 runs recorded (six contrasts, Holm), each
contrast's difference, interval, exact p, Holm p and verdict, and each seed's difference."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import final_accuracies, recompare

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "methods" / "img" / "decompose_multi" / "results.jsonl.gz"

pytestmark = pytest.mark.slow

#: (group, budget) -> (expect, diff, t-interval, exact p, Holm p, verdict), as the card gives them
CARD = {
    ("oracle_credit", "steps"): ("greater", 0.0073, [0.0019, 0.0126], 6 / 256, 12 / 256, "agrees"),
    ("sham_credit", "steps"): ("none", -0.0046, [-0.0131, 0.0040], 66 / 256, None, "inconclusive"),
    ("anti_credit", "steps"): ("less", -0.0358, [-0.0441, -0.0274], 2 / 256, 12 / 256, "agrees"),
    ("reward_flip", "steps"): ("less", -0.0426, [-0.0572, -0.0280], 2 / 256, 12 / 256, "agrees"),
    ("srpo_oracle", "steps"): ("greater", -0.0088, [-0.0137, -0.0039], 4 / 256, 12 / 256, "contradicts"),
    ("srpo_oracle", "tokens/generated"): ("greater", -0.0119, [-0.0164, -0.0074], 2 / 256, 12 / 256, "contradicts"),
}
SEEDS = {  # method - GRPO at step 100, seeds 0-7
    "oracle_credit": [-0.001, 0.0055, 0.014, 0.01, 0.0005, 0.004, 0.0075, 0.0175],
    "sham_credit": [-0.006, -0.012, -0.005, -0.002, -0.022, -0.002, -0.0015, 0.014],
    "srpo_oracle": [-0.008, -0.0085, -0.0135, -0.0105, -0.0175, -0.0075, 0.003, -0.008],
}


def test_the_card_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    declared = prereg["declaration"]
    assert declared["baseline"] == "grpo" and declared["min_seeds"] == 8 and prereg["holm"] is True
    assert prereg["source"].startswith("config.yaml of 48 run(s)") and prereg["deviations"] == []
    assert out["later_declaration"] is None
    tests = {(t["group"], t["budget"]): t for t in prereg["tests"]}
    assert set(tests) == set(CARD)
    for key, (expect, diff, ci, p, p_holm, verdict) in CARD.items():
        t = tests[key]
        assert (t["expect"], t["verdict"], t["n"]) == (expect, verdict, "8 pairs"), key
        assert round(t["diff"], 4) == diff and [round(x, 4) for x in t["t_ci95"]] == ci, key
        assert t["p_value"] == pytest.approx(p), key
        if p_holm is not None:
            assert t["p_holm"] == pytest.approx(p_holm), key
    assert tests[("sham_credit", "steps")]["margin"] == 0.01  # the margin written after seeds 0-7 of the lost runs
    finals = {g["label"]: round(g["final"]["mean"], 3) for g in out["groups"]}
    assert finals == {"grpo": 0.476, "oracle_credit": 0.483, "sham_credit": 0.472, "anti_credit": 0.441,
                      "reward_flip": 0.434, "srpo_oracle": 0.467}
    for line in gzip.open(RESULTS, "rt"):
        config = json.loads(line)["files"]["config.yaml"]
        assert "threads: 1" in config and "every: 50" in config and "sampler: inverse_cdf" in config
    runs = final_accuracies(RESULTS)
    assert {step for step, _ in runs.values()} == {100} and len(runs) == 48
    for method, diffs in SEEDS.items():
        assert [round(runs[f"{method}-seed{s}"][1] - runs[f"grpo-seed{s}"][1], 4) for s in range(8)] == diffs
