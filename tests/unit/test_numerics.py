"""tests/numerics.py: the tolerance by hand, two summation orders within it, a real error outside
it, the count of an LM's reductions by hand, the headroom log, and a kernel restriction that did
not take effect stopping the run (``make test-numerics``; its variables: test_demo_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers import ROOT, tiny_model_and_tokenizer
from tests.numerics import LAMBDA, approx_fp, assert_close_fp, headroom, lm_length, tolerance


def test_tolerance_by_hand():
    eps = 2.0**-23  # float32
    assert tolerance(4.0, 100) == pytest.approx(LAMBDA * 10 * eps * 4.0, rel=1e-12)
    assert tolerance(-4.0, 100) == tolerance(4.0, 100)
    assert tolerance(1.0, 1, torch.float64) == pytest.approx(LAMBDA * 2.0**-52, rel=1e-12)
    assert tolerance(1.0, 1, torch.bfloat16) == pytest.approx(LAMBDA * 2.0**-7, rel=1e-12)
    with pytest.raises(ValueError, match="length must be a count of terms >= 1"):
        tolerance(1.0, 0)


def test_two_summation_orders_agree_within_it_and_a_real_error_does_not():
    """A float32 sum of 4,096 positive terms in three orders (forward, reversed, pairwise) agrees
    within the tolerance; dropping one term (about 1/4,100 of the sum) is about 6 tolerances
    outside it."""
    x = torch.rand(4096, generator=torch.Generator().manual_seed(0)) + 0.5
    forward = torch.zeros((), dtype=torch.float32)
    for v in x:
        forward += v
    backward = torch.zeros((), dtype=torch.float32)
    for v in x.flip(0):
        backward += v
    pairwise = x.sum()
    scale = float(x.abs().sum())
    assert forward != backward or forward != pairwise  # the orders do round differently
    for got in (backward, pairwise):
        assert_close_fp(got, forward, length=x.numel(), scale=scale)
        assert float(got) == approx_fp(float(forward), length=x.numel())  # all terms > 0: scale = |sum|
    with pytest.raises(AssertionError, match=r"tolerance .* = 5 \* sqrt\(4096\)"):
        assert_close_fp(x[1:].sum(), forward, length=x.numel(), scale=scale)
    assert float(x[1:].sum()) != approx_fp(float(forward), length=x.numel())


def test_a_padding_position_left_unmasked_is_far_outside_it():
    """One left pad attended to (a masking bug) moves the real tokens' logits by ~10^4 tolerances."""
    from creditlab.step.policy import forward_logits

    model, _ = tiny_model_and_tokenizer(seed=0)
    ids = torch.randint(5, 60, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3], mask[2, :1] = 0, 0
    leak = mask.clone()
    leak[2, 0] = 1
    with torch.no_grad():
        want, got = forward_logits(model, ids, mask), forward_logits(model, ids, leak)
    real = mask.bool()
    n = lm_length(model.config, ids.shape[1])
    assert torch.equal(forward_logits(model, ids, mask).detach()[real], want[real])  # the same run again
    diff = float((got[real] - want[real]).abs().max())
    assert diff > 1000 * tolerance(float(want[real].abs().max()), n)


def test_a_gradient_is_judged_against_its_tensors_scale():
    """An element that cancels to ~0 carries the rounding of its large terms: elementwise
    (atol 1e-6, rtol 1e-4) fails it, the tensor's scale does not."""
    want = torch.tensor([55.0, -40.0, 3e-6])
    got = want + torch.tensor([0.0, 2e-6, 2.5e-5])  # 2.5e-5: ~4 eps x 55, as seen on AVX2
    with pytest.raises(AssertionError):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-4)
    assert_close_fp(got, want, length=1000)


def test_lm_length_by_hand():
    model, _ = tiny_model_and_tokenizer()  # 2 layers, hidden 64, MLP 128, 4 heads, vocab 105
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads) == (2, 64, 128, 4)
    # per layer: norms 2 x 64, q/k/v 64, scores 16, softmax and values 2 x 10, o 64, up 64, down 128
    per_layer = 128 + 64 + 16 + 20 + 64 + 64 + 128
    forward = 2 * per_layer + 2 * 64 + cfg.vocab_size
    assert lm_length(cfg, 10) == forward
    assert lm_length(cfg, 10, backward=True, tokens=37) == 2 * forward + 37


def test_the_log_records_headroom(tmp_path, monkeypatch):
    log = tmp_path / "numerics.jsonl"
    monkeypatch.setenv("CREDITLAB_NUMERICS_LOG", str(log))
    assert_close_fp(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 2.0**-22]), length=4)
    assert 3.0 == approx_fp(3.0, length=4, where="x")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    tol = tolerance(2.0 + 2.0**-22, 4)  # the expected tensor's scale
    assert rows[0]["diff"] == 2.0**-22 and rows[0]["tol"] == tol and rows[0]["ratio"] == pytest.approx(2.0**-22 / tol)
    assert rows[1] == {**rows[1], "where": "x", "diff": 0.0, "ratio": 0.0}
    assert "test_the_log_records_headroom" in rows[0]["test"]
    table = headroom([str(log)])
    assert table.splitlines()[0].startswith("| test | tolerances | worst ratio, ")
    assert "test_the_log_records_headroom` | " in table


def test_an_expected_capability_that_did_not_take_effect_stops_the_run():
    """``CREDITLAB_EXPECT_CPU_CAPABILITY`` names kernels torch does not run: a usage error, no test."""
    env = {**os.environ, "CREDITLAB_EXPECT_CPU_CAPABILITY": "NOT_A_CAPABILITY"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/unit/test_numerics.py::test_tolerance_by_hand"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 4, done.stdout + done.stderr  # pytest's usage error
    assert "CREDITLAB_EXPECT_CPU_CAPABILITY=NOT_A_CAPABILITY, but torch runs" in done.stdout + done.stderr
