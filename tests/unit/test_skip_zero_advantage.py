"""``loss.skip_zero_advantage``: rows whose advantages are all zero (a GRPO group with equal
rewards) run no forward or backward, and the update is the full one up to float rounding: the
same parameter change, the same loss; the per-token metrics average over the rows run; AdamW still
steps every parameter when no row is left; and the option refuses a KL term."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.rollout import RolloutConfig

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length
from tests.unit.test_forward import _rollout

pytestmark = pytest.mark.usefixtures("one_thread")


def _module(skip: bool, optimizer=functools.partial(torch.optim.SGD, lr=0.1), **loss):
    model, tok = tiny_model_and_tokenizer(seed=2)
    module = CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(skip_zero_advantage=skip, **loss),
        RolloutConfig(temperature=0.8), EvalConfig(every=0), optimizer, seed=0,
    )
    opt = optimizer([p for p in model.parameters() if p.requires_grad])
    opt.grads = []  # each optimizer step's gradients, as the step saw them
    step = opt.step

    def recorded(*a, **kw):
        opt.grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(*a, **kw)

    opt.step = recorded
    module.optimizers = lambda: opt
    module.manual_backward = lambda l: l.backward()
    ran: list[int] = []  # the rows each forward of the update saw
    forward = module.token_logprobs

    def counted(rollout, rows, *a, **kw):
        ran.extend(rows.tolist())
        return forward(rollout, rows, *a, **kw)

    module.token_logprobs = counted
    return module, opt, ran


def _advantages(batch, live_groups):
    """(B, T) advantages: non-zero (and of both signs) in ``live_groups`` only, as GRPO gives a group
    whose rewards differ; the other groups' rows are all zero."""
    sign = torch.tensor([(-1.0) ** i * (1 + i % 3) for i in range(batch.size)])
    live = torch.isin(batch.group_ids, torch.tensor(live_groups))
    return (sign * live)[:, None] * batch.loss_mask


@pytest.mark.numerics
@pytest.mark.parametrize("loss", [{}, {"micro_batch_size": 3}, {"updates_per_batch": 2},
                                  {"agg": "token-mean", "mode": "reinforce"}])
def test_skipping_zero_rows_gives_the_full_update(loss):
    batch = _rollout(prompt_lens=(2, 7, 4), group=4, seed=11)  # 3 groups of 4 rows
    adv = _advantages(batch, [1])
    out = {}
    for skip in (False, True):
        module, opt, ran = _module(skip, **loss)
        out[skip] = module.update(batch, adv), opt.grads, ran
    (full, g_full, ran_full), (skipped, g_skip, ran_skip) = out[False], out[True]
    live = set(torch.nonzero(batch.group_ids == 1).flatten().tolist())
    if loss.get("updates_per_batch", 1) == 1:
        assert sorted(ran_full) == list(range(batch.size))
    assert set(ran_skip) == live  # the zero rows never reach the model
    config, seq = module.policy.config, batch.input_ids.shape[1]
    n_grad = lm_length(config, seq, backward=True, tokens=int(batch.attention_mask.sum()))
    assert len(g_skip) == len(g_full) == loss.get("updates_per_batch", 1)
    for step_full, step_skip in zip(g_full, g_skip):  # every optimizer step's gradient
        assert step_skip.keys() == step_full.keys()
        for name in step_full:
            assert_close_fp(step_skip[name], step_full[name], length=n_grad, msg=name)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert skipped[key] == pytest.approx(full[key], rel=1e-5, abs=1e-7), key
    assert skipped["train/skipped_rows"] == pytest.approx(1 - len(live) / batch.size)
    assert "train/skipped_rows" not in full


def test_per_token_metrics_average_over_the_rows_run():
    """One update, no clipping possible (ratio 1): the ratio mean is 1 either way, and the entropy
    is the mean over the rows run, i.e. the full update's entropy of those rows alone."""
    batch = _rollout(prompt_lens=(2, 7, 4), group=4, seed=11)
    adv = _advantages(batch, [0, 2])
    module, _, _ = _module(True)
    metrics = module.update(batch, adv)
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    reference, _, _ = _module(False)
    live = torch.isin(batch.group_ids, torch.tensor([0, 2]))
    with torch.no_grad():
        _, ent = reference.token_logprobs(batch, torch.nonzero(live).flatten())
    mask = batch.loss_mask[live, : ent.shape[1]]
    assert metrics["train/entropy"] == pytest.approx(float((ent * mask).sum() / mask.sum()), rel=1e-5)


def test_no_row_left_still_steps_every_parameter():
    """Every advantage zero: no row runs, yet AdamW steps every parameter on an exact zero gradient
    (its moments decay, as in the full update), and the parameters move exactly as there."""
    batch = _rollout(prompt_lens=(2, 7, 4), group=4, seed=11)
    adamw = functools.partial(torch.optim.AdamW, lr=0.1, weight_decay=0.01)
    moved = {}
    for skip in (False, True):
        module, opt, ran = _module(skip, optimizer=adamw)
        module.update(batch, _advantages(batch, [0, 1, 2]))  # momentum first
        ran.clear()
        metrics = module.update(batch, torch.zeros_like(batch.loss_mask))
        assert all(opt.state[p]["step"] == 2 for p in module.policy.parameters() if p.requires_grad)
        moved[skip] = [p.detach().clone() for p in module.policy.parameters()], metrics, list(ran)
    assert len(moved[True][2]) == 1 and moved[True][1]["train/skipped_rows"] == 1.0  # the one padding row
    assert moved[True][1]["train/loss"] == 0.0 and moved[True][1]["train/padding"] == 0.0
    assert "train/entropy" not in moved[True][1]  # nothing ran: no entropy measured, rather than a 0
    for a, b in zip(moved[False][0], moved[True][0]):
        assert_close_fp(b, a, length=64)


def test_skip_needs_no_kl_term():
    with pytest.raises(ConfigError, match=r"skip_zero_advantage needs kl_coef == 0 .* set loss.kl_coef=0 or "
                                          r"loss.skip_zero_advantage=false"):
        LossConfig(skip_zero_advantage=True, kl_coef=0.1)
    with pytest.raises(ConfigError, match="skip_zero_advantage must be true or false"):
        LossConfig(skip_zero_advantage="yes")
    assert LossConfig(skip_zero_advantage=True).skip_zero_advantage and not LossConfig().skip_zero_advantage
