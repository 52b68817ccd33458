"""The credit-bench report on a hand-made BenchResult: every file written, the numbers put in appear
formatted in report.md, the HTML embeds its plots, bench.json round-trips, the terminal table."""

import json
import struct

from creditlab.creditbench.report import fmt_interval, print_table, write_report
from creditlab.creditbench.result import (
    BenchResult,
    EstimatorScores,
    Interval,
    SelectorScores,
    Separation,
)
from rich.console import Console

def png_width(path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


SCORE_KEYS = ("spearman", "spearman_within", "sign", "blame_hit", "error")


def scores(base: float) -> dict[str, Interval]:
    """Every score for both reductions, distinct values: ``base + 0.01 * i`` (+0.1 for the sum)."""
    out = {}
    for j, red in enumerate(("mean", "sum")):
        for i, s in enumerate(SCORE_KEYS):
            v = round(base + 0.01 * i + 0.1 * j, 4)
            out[f"{s}/{red}"] = Interval(v, round(v - 0.05, 4), round(v + 0.04, 4))
    return out


def make_result(selectors: bool = True, instrument: bool = True) -> BenchResult:
    est = [
        EstimatorScores("mc_k4", scores(0.6), {"seconds": 12.5, "generated_tokens": 4096, "forward_tokens": 512},
                        points=((0.2, 0.15), (-0.3, -0.25), (0.0, 0.05))),
        EstimatorScores("grpo", scores(0.2), {"seconds": 0.1, "generated_tokens": 0, "forward_tokens": 0},
                        points=((0.2, 0.5), (-0.3, 0.5), (0.1, -0.5))),
        EstimatorScores("broken_plugin", error="KeyError: 'values' (needs a value head)"),
    ]
    seps = [Separation("mc_k4", "grpo", Interval(0.4, 0.31, 0.52)),
            Separation("grpo", "other", Interval(0.031, -0.01, 0.07))]
    sel = [
        SelectorScores("random", {"exact": Interval(0.125, 0.1, 0.15), "early": Interval(0.4, 0.35, 0.45),
                                  "late": Interval(0.475, 0.42, 0.53), "oracle_exact": Interval(0.13, 0.11, 0.16)},
                       {"seconds": 0.01}, chains=40),
        SelectorScores("self_localize", {"exact": Interval(0.366, 0.3, 0.43), "early": Interval(0.2, 0.15, 0.26),
                                         "late": Interval(0.434, 0.38, 0.5)},
                       {"seconds": 3.2, "forward_tokens": 20000}, chains=40),
    ] if selectors else []
    return BenchResult(
        settings={"model": "tiny", "task": "arith", "split": "train", "prompts": 64, "group_size": 8, "k": 32,
                  "seed": 0, "sign_threshold": 0.1, "command": "creditlab credit-bench model=tiny"},
        counts={"chains": 512, "failed_chains": 240, "thoughts": 2304, "states": 1800, "continuations": 57600},
        noise={"value_se": 0.0712, "advantage_se": 0.0934, "value_split_half": 0.912,
               "advantage_split_half": 0.687, "advantage_reliability": 0.734, "error_floor": 0.266},
        instrument={"most_negative_is_first_wrong": Interval(0.812, 0.76, 0.86)} if instrument else None,
        rank_by="spearman/mean", estimators=est, separations=seps, selectors=sel,
        truth_cost={"seconds": 420.0, "generated_tokens": 1234567},
    )


def test_fmt_interval():
    assert fmt_interval(Interval(0.4123, 0.38, 0.4449)) == "0.412 [0.380, 0.445]"
    assert fmt_interval(Interval(0.031, -0.01, 0.07), signed=True) == "+0.031 [-0.010, +0.070]"
    assert fmt_interval(Interval(0.5, 0.25, 0.75), digits=1) == "0.5 [0.2, 0.8]"
    assert fmt_interval(None) == "—"


def test_write_report_writes_every_file_and_the_numbers(tmp_path):
    out = tmp_path / "bench" / "report"  # does not exist yet
    paths = write_report(make_result(), out)
    assert set(paths) == {"md", "html", "json", "scatter", "scores"}
    for p in paths.values():
        assert p.parent == out and p.stat().st_size > 0
    assert paths["scatter"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["scores"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_width(paths["scores"]) == 1100  # two panels: estimators and selectors

    md = paths["md"].read_text()
    # settings and the ground truth's counts and noise
    assert "creditlab credit-bench model=tiny" in md and "G = 8" in md and "K = 32" in md
    for cell in ("| chains | 512 |", "| failed chains | 240 |", "| (chain, thought) pairs | 2,304 |",
                 "| Monte-Carlo continuations | 57,600 |", "0.071 |", "0.093 |", "0.912 |", "0.687 |",
                 "0.734 |", "0.266 |"):
        assert cell in md, cell
    assert "oracle's first wrong step: 0.812 [0.760, 0.860]" in md
    # ranking order, each estimator's intervals (mean table, then the sum table)
    est = md[md.index("## Estimators"):md.index("## Where they do not separate")]
    assert "| 1 | mc_k4 | 0.600 [0.550, 0.640] | 0.610 [0.560, 0.650] | 0.620 [0.570, 0.660] |" in est
    assert "| 2 | grpo | 0.200 [0.150, 0.240] |" in est
    assert "| 1 | mc_k4 | 0.700 [0.650, 0.740] |" in est  # sum reduction
    assert est.index("| 1 | mc_k4") < est.index("| 2 | grpo")
    assert "error/mean (lower is better)" in est
    assert "- broken_plugin: KeyError: 'values' (needs a value head)" in est
    assert "| broken_plugin" not in est  # not ranked
    # separations as built from the intervals
    assert "- mc_k4 vs grpo: +0.400 [+0.310, +0.520] — separated" in md
    assert "- grpo vs other: +0.031 [-0.010, +0.070] — not separated" in md
    # selectors, with the oracle column since one has it
    assert ("| random | 40 | 0.125 [0.100, 0.150] | 0.400 [0.350, 0.450] | 0.475 [0.420, 0.530] "
            "| 0.130 [0.110, 0.160] |") in md
    assert "| self_localize | 40 | 0.366 [0.300, 0.430] | 0.200 [0.150, 0.260] | 0.434 [0.380, 0.500] | — |" in md
    # cost: truth, estimators, selectors
    assert "| ground truth | Monte-Carlo truth and groups | 420.00 | 1,234,567 | — |" in md
    assert "| mc_k4 | estimator | 12.50 | 4,096 | 512 |" in md
    assert "| self_localize | selector | 3.20 | — | 20,000 |" in md
    assert "## How to read the scores" in md and "![" in md and "(scatter.png)" in md
    # sections in order
    heads = ["## Ground truth", "## Estimators", "## Where they do not separate", "## Reset selectors",
             "## Cost", "## How to read the scores", "## Plots"]
    assert [md.index(h) for h in heads] == sorted(md.index(h) for h in heads)

    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 2
    assert "<title>creditlab credit-bench</title>" in page and "mc_k4" in page and "broken_plugin" in page


def test_bench_json_round_trips(tmp_path):
    data = json.loads(write_report(make_result(), tmp_path)["json"].read_text())
    assert data["rank_by"] == "spearman/mean"
    assert data["estimators"][0]["name"] == "mc_k4"
    assert data["estimators"][0]["scores"]["blame_hit/sum"] == {"value": 0.73, "low": 0.68, "high": 0.77}
    assert data["estimators"][1]["points"] == [[0.2, 0.5], [-0.3, 0.5], [0.1, -0.5]]
    assert data["estimators"][2]["error"].startswith("KeyError") and data["estimators"][2]["scores"] == {}
    assert data["selectors"][1]["scores"]["exact"] == {"value": 0.366, "low": 0.3, "high": 0.43}
    assert data["separations"][1]["separated"] is False and data["separations"][0]["separated"] is True
    assert data["instrument"]["most_negative_is_first_wrong"]["value"] == 0.812
    assert data["noise"]["error_floor"] == 0.266 and data["counts"]["continuations"] == 57600
    assert data["truth_cost"]["generated_tokens"] == 1234567


def test_non_finite_scores_are_null_in_json(tmp_path):
    r = make_result()
    r.estimators[1].scores["spearman_within/mean"] = Interval(float("nan"), float("nan"), float("nan"))
    text = write_report(r, tmp_path)["json"].read_text()
    assert "NaN" not in text
    assert json.loads(text)["estimators"][1]["scores"]["spearman_within/mean"] == {"value": None, "low": None,
                                                                                   "high": None}


def test_print_table_names_estimators_and_selectors(tmp_path):
    console = Console(record=True, width=200)
    paths = {"md": tmp_path / "report.md", "html": tmp_path / "report.html"}
    print_table(make_result(), console, paths)
    text = console.export_text()
    for name in ("mc_k4", "grpo", "broken_plugin", "random", "self_localize"):
        assert name in text, name
    assert "0.600 [0.550, 0.640]" in text  # the rank score
    assert "0.640 [0.590, 0.680]" in text  # error/mean of mc_k4
    assert "0.366 [0.300, 0.430]" in text
    assert "not scored" in text and "KeyError" in text
    assert "advantage reliability 0.734, error floor 0.266" in text
    assert str(paths["md"]) in text


def test_no_selectors_no_instrument_still_renders(tmp_path):
    r = make_result(selectors=False, instrument=False)
    paths = write_report(r, tmp_path)
    md = paths["md"].read_text()
    assert "No reset selector was scored." in md
    assert "Instrument check" not in md and "is the oracle's first wrong step:" not in md
    assert "| random" not in md and "oracle_exact |" not in md
    assert png_width(paths["scores"]) == 550  # the estimators' panel alone
    console = Console(record=True, width=200)
    print_table(r, console)
    text = console.export_text()
    assert "reset selectors" not in text and "mc_k4" in text and "report:" not in text


def test_nothing_scored_still_renders(tmp_path):
    r = make_result(selectors=False, instrument=False)
    r.estimators = [r.estimators[2]]
    r.separations = []
    paths = write_report(r, tmp_path)
    md = paths["md"].read_text()
    assert "Fewer than two estimators were scored." in md and "broken_plugin: KeyError" in md
    assert paths["scatter"].stat().st_size > 0 and paths["scores"].stat().st_size > 0
