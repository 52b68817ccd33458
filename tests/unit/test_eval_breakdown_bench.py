"""benchmarks/eval_breakdown.py: an evaluation's seconds by part, and the two bounds on what
scheduling could still cut (refilling finished rows; sharing the greedy pass's prefill)."""

from __future__ import annotations

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/eval_breakdown.py")


def test_full_width_charges_every_row_step_the_full_batch_cost(bench):
    # 4 rows at 0.1 s a row-step while the batch is full; then 2 and 1 rows decode more slowly
    steps = [(4, 0.4), (4, 0.4), (2, 0.3), (1, 0.2)]
    assert bench.full_width_seconds(steps, 4) == pytest.approx(0.1 * (4 + 4 + 2 + 1))
    assert bench.full_width_seconds([], 4) == 0.0
    # no step at the full width (rows fed at the first step ended): the widest steps set the cost
    assert bench.full_width_seconds([(3, 0.6), (1, 0.5)], 4) == pytest.approx(0.2 * 4)
    # the median of the full-width steps, not their mean
    assert bench.full_width_seconds([(2, 0.2), (2, 0.2), (2, 2.0), (1, 0.5)], 2) == pytest.approx(0.1 * 7)


def test_summary_sums_parts_and_leaves_the_rest_as_other(bench):
    greedy = bench.Batch(2, True, 10.0, {"prefill": 3.0, "steps": 4.0, "sampling": 1.0},
                         [(2, 2.0), (1, 2.0)], [5, 3])
    sampled = bench.Batch(4, False, 20.0, {"prefill": 5.0, "steps": 10.0, "compact + store": 1.0},
                          [(4, 4.0), (4, 4.0), (2, 2.0)], [9, 9, 4, 6])
    s = bench.summarize([greedy, sampled])
    assert s["seconds"] == 30.0 and s["answers"] == 6
    assert s["parts"] == {"prefill": 8.0, "steps": 14.0, "sampling": 1.0, "compact + store": 1.0, "other": 6.0}
    assert s["full_width"] == pytest.approx(1.0 * 3 + 1.0 * 10)  # greedy 1 s a row-step, sampled 1 s
    assert s["greedy_prefill"] == 3.0  # a sampled call prefills the same prompts again
    assert bench.summarize([greedy])["greedy_prefill"] == 0.0  # greedy only: nothing repeats it
    text = bench.report([greedy, sampled], 31.0)
    assert "refilling finished rows would save at most 1.0 s" in text
    assert "sharing the greedy prefill with the samples 3.0 s (10%)" in text


def test_probe_wraps_the_backend_parts_and_puts_them_back(bench):
    from creditlab.accel import fused_decode
    from creditlab.backends import hf

    names = [(hf.HFBackend, "_forward"), (hf.HFBackend, "_generate_batch"), (hf, "sample_tokens"),
             (hf, "keep_rows"), (fused_decode.FusedDecoder, "step"), (fused_decode.FusedDecoder, "select")]
    before = [getattr(owner, name) for owner, name in names]
    with bench.probe() as batches:
        assert batches == []
        assert all(getattr(owner, name) is not b for (owner, name), b in zip(names, before))
    assert [getattr(owner, name) for owner, name in names] == before


def test_an_evaluation_of_the_tiny_model_is_broken_down(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # creditlab eval writes eval/ here
    with bench.probe() as batches:
        from creditlab.cli import main

        main(["eval", "--problems", "4", "--samples", "2"])
    assert [(b.rows, b.greedy) for b in batches] == [(4, True), (8, False)]
    for b in batches:
        assert b.steps and max(r for r, _ in b.steps) <= b.rows  # fused steps, at most the batch's rows
        assert b.parts["prefill"] > 0 and b.prefilled >= b.padding >= 0
        assert len(b.lengths) == b.rows
    assert "| all | 12 |" in bench.report(batches, 1.0)
