"""The decomposition card's declared oracle_credit - sham_credit test on seeds 20-35
(docs/methods/decomposition.md, "Credit alone against its matched control"), recomputed by
``creditlab compare`` from the committed results file: the declaration the runs recorded, the
difference, its interval, the exact p and the verdict, and each seed's difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import final_accuracies, recompare

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "methods" / "img" / "sham_multi" / "results.jsonl.gz"

pytestmark = pytest.mark.slow


def test_the_card_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    assert prereg["declaration"]["baseline"] == "sham_credit" and prereg["declaration"]["seeds"] == list(range(20, 36))
    assert prereg["source"].startswith("config.yaml of 32 run(s)") and prereg["deviations"] == [] and out["later_declaration"] is None
    (test,) = prereg["tests"]
    assert (test["group"], test["expect"], test["verdict"], test["decision"]) == ("oracle_credit", "greater", "agrees", "greater")
    assert round(test["diff"], 4) == 0.0090 and [round(x, 4) for x in test["t_ci95"]] == [0.0041, 0.0138]
    assert test["p_value"] == pytest.approx(68 / 65536) and test["p_holm"] == test["p_value"]  # 0.00104
    finals = {g["label"]: round(g["final"]["mean"], 3) for g in out["groups"]}
    assert finals == {"sham_credit": 0.476, "oracle_credit": 0.485}
    runs = final_accuracies(RESULTS)
    diffs = [round(runs[f"oracle_credit-seed{s}"][1] - runs[f"sham_credit-seed{s}"][1], 4) for s in range(20, 36)]
    assert {step for step, _ in runs.values()} == {100}
    assert diffs == [0.0105, 0.0155, 0.0135, 0.007, 0.005, 0.0145, 0.002, 0.0325,
                     0.0025, 0.0, 0.015, -0.0025, -0.0025, 0.013, 0.0155, 0.002]
