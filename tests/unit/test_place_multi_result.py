"""The decomposition card's placement (``sweeps/place_multi.yaml`` run as declared, with GRPO run
fresh beside the six; docs/methods/decomposition.md, "The placement of the other methods"),
recomputed by ``creditlab compare`` from the committed results file: the declaration the 56 runs
recorded, each contrast's difference, interval, exact p, equivalence p, Holm p and verdict, and
the group finals."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.helpers import final_accuracies, recompare, stable

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "methods" / "img" / "place_multi" / "results.jsonl.gz"

pytestmark = pytest.mark.slow

#: group -> (diff, t-interval, exact p, equivalence p, Holm p, verdict), as the card gives them
CARD = {
    "rrpo": (-0.0142, [-0.0214, -0.0071], 4 / 256, 233 / 256, 1.0, "inconclusive"),
    "srpo": (-0.0116, [-0.0180, -0.0052], 2 / 256, 183 / 256, 1.0, "different"),
    "vineppo": (0.0064, [0.0002, 0.0126], 16 / 256, 31 / 256, 124 / 256, "inconclusive"),
    "oar_g": (-0.0022, [-0.0070, 0.0026], 92 / 256, 3 / 256, 18 / 256, "inconclusive"),
    "ibpo": (-0.0027, [-0.0095, 0.0041], 104 / 256, 6 / 256, 30 / 256, "inconclusive"),
    "rredcot": (-0.0404, [-0.0496, -0.0313], 2 / 256, 1.0, 1.0, "different"),
}


def test_the_placement_follows_from_the_committed_runs(tmp_path):
    out = recompare(RESULTS, tmp_path)
    prereg = out["preregistration"]
    declared = prereg["declaration"]
    assert declared["baseline"] == "grpo" and declared["min_seeds"] == 8 and prereg["holm"] is True
    assert prereg["source"].startswith("config.yaml of 56 run(s)") and prereg["deviations"] == []
    tests = {t["group"]: t for t in prereg["tests"]}
    assert set(tests) == set(CARD) and {t["budget"] for t in tests.values()} == {"steps"}
    for group, (diff, ci, p, p_eq, p_holm, verdict) in CARD.items():
        t = tests[group]
        assert (t["expect"], t["margin"], t["verdict"], t["n"]) == ("none", 0.01, verdict, "8 pairs"), group
        assert round(t["diff"], 4) == diff and [round(x, 4) for x in t["t_ci95"]] == ci, group
        assert t["p_value"] == pytest.approx(p) and t["p_equivalent"] == pytest.approx(p_eq), group
        assert t["p_holm"] == pytest.approx(p_holm), group
    finals = {g["label"]: round(g["final"]["mean"], 3) for g in out["groups"]}
    assert finals == {"grpo": 0.476, "ibpo": 0.474, "oar_g": 0.474, "rredcot": 0.436, "rrpo": 0.462,
                      "srpo": 0.465, "vineppo": 0.483}
    for line in gzip.open(RESULTS, "rt"):
        run = json.loads(line)
        threads = "threads: 2" if run["name"].startswith("rredcot-") else "threads: 1"
        assert threads in run["files"]["config.yaml"] and "every: 50" in run["files"]["config.yaml"]
    runs = final_accuracies(RESULTS)
    assert {step for step, _ in runs.values()} == {100} and len(runs) == 56


def test_its_fresh_grpo_runs_are_decompose_multis():
    """The same config and seeds, run three days apart on this machine: the same metrics, so the
    placement's baseline is the decomposition's, and the two folders agree where they overlap."""
    def grpo(path):
        return {run["name"]: stable(json.loads(x) for x in run["files"]["metrics.jsonl"].splitlines())
                for run in map(json.loads, gzip.open(path, "rt")) if run["name"].startswith("grpo-")}

    fresh, earlier = grpo(RESULTS), grpo(RESULTS.parents[1] / "decompose_multi" / "results.jsonl.gz")
    assert sorted(fresh) == [f"grpo-seed{s}" for s in range(8)] and fresh == earlier
