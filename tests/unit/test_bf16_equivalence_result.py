"""Issue 54's declared bf16 test (sweeps/bf16_equivalence.yaml; docs/real-model.md, "Does bf16
change a conclusion?"), recomputed by ``creditlab compare`` from the committed results file: the
declaration the runs recorded, the difference, its interval, the equivalence p and the verdict,
and each seed's difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import final_accuracies, recompare

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "bf16_equivalence" / "results.jsonl.gz"

pytestmark = pytest.mark.slow


def test_the_equivalence_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    assert prereg["declaration"]["baseline"] == "32-true" and prereg["declaration"]["seeds"] == list(range(40, 52))
    assert prereg["declaration"]["by"] == ["trainer.precision"]
    assert prereg["source"].startswith("config.yaml of 24 run(s)") and prereg["deviations"] == []
    assert out["later_declaration"] is None
    (test,) = prereg["tests"]
    assert (test["group"], test["expect"], test["margin"], test["verdict"]) == ("bf16-mixed", "none", 0.01, "equivalent")
    assert round(test["diff"], 4) == -0.0040 and [round(x, 4) for x in test["t_ci95"]] == [-0.0099, 0.0019]
    assert test["p_equivalent"] == pytest.approx(104 / 4096) and test["p_holm"] == test["p_equivalent"]  # 0.0254
    assert test["p_value"] == pytest.approx(696 / 4096)  # 0.170: no difference shown either
    finals = {g["label"]: round(g["final"]["mean"], 4) for g in out["groups"]}
    assert finals == {"32-true": 0.4762, "bf16-mixed": 0.4722}
    runs = final_accuracies(RESULTS)
    diffs = [round(runs[f"bf16-mixed-seed{s}"][1] - runs[f"32-true-seed{s}"][1], 4) for s in range(40, 52)]
    assert {step for step, _ in runs.values()} == {100}
    assert diffs == [-0.009, 0.0035, -0.0025, -0.0155, -0.001, -0.0175, -0.0145, 0.005, -0.0095, -0.0045, 0.0105, 0.007]
