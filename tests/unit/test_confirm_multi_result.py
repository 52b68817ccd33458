"""The decomposition card's re-run of the declared confirmation (``sweeps/confirm_multi.yaml``:
oracle_credit against GRPO, seeds 8-19; docs/methods/decomposition.md, "Confirmation of the
positive control on fresh seeds"), recomputed by ``creditlab compare`` from the committed results
file: the declaration the runs recorded, the difference, its interval, the exact p, the verdict,
and each seed's difference."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import final_accuracies, recompare

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "methods" / "img" / "confirm_multi" / "results.jsonl.gz"

pytestmark = pytest.mark.slow


def test_the_card_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    assert prereg["declaration"]["baseline"] == "grpo" and prereg["declaration"]["min_seeds"] == 12
    assert prereg["source"].startswith("config.yaml of 24 run(s)") and prereg["deviations"] == [] and out["later_declaration"] is None
    (test,) = prereg["tests"]
    assert (test["group"], test["expect"], test["verdict"]) == ("oracle_credit", "greater", "not shown")
    assert round(test["diff"], 4) == 0.0024 and [round(x, 4) for x in test["t_ci95"]] == [-0.0017, 0.0065]
    assert test["p_value"] == pytest.approx(948 / 4096) and test["p_holm"] == test["p_value"]  # 0.231
    finals = {g["label"]: round(g["final"]["mean"], 3) for g in out["groups"]}
    assert finals == {"grpo": 0.480, "oracle_credit": 0.482}
    for line in gzip.open(RESULTS, "rt"):
        config = json.loads(line)["files"]["config.yaml"]
        assert "threads: 2" in config and "every: 50" in config and "sampler: inverse_cdf" in config
    runs = final_accuracies(RESULTS)
    diffs = [round(runs[f"oracle_credit-seed{s}"][1] - runs[f"grpo-seed{s}"][1], 4) for s in range(8, 20)]
    assert {step for step, _ in runs.values()} == {100}
    assert diffs == [-0.0015, 0.01, 0.0035, 0.008, 0.0015, 0.0055, 0.004, -0.0045, 0.0075, 0.01, -0.008, -0.0075]
