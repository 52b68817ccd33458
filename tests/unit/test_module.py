"""The update step moves the policy the right way and leaves masked tokens alone."""

import functools
import math
from dataclasses import replace

import pytest
import torch
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.rollout import RolloutConfig, collate
from creditlab.types import Completion, Problem, Trajectory

from tests.helpers import tiny_model_and_tokenizer


def _module(loss=None, lr=0.5, model=None):
    torch.manual_seed(0)
    model, tok = model or tiny_model_and_tokenizer()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    module = CreditAssignmentModule(
        model, tok, None, None, [], loss or LossConfig(), RolloutConfig(), EvalConfig(every=0),
        functools.partial(torch.optim.SGD, lr=lr), seed=0,
    )
    module.optimizers = lambda: opt
    module.manual_backward = lambda loss: loss.backward()
    return module, model


def _batch(trainable_from=0):
    gen = torch.Generator().manual_seed(1)
    trajs = []
    for i in range(4):
        resp = tuple(torch.randint(5, 50, (6,), generator=gen).tolist())
        c = Completion((2, 5, 6), resp, (0.0,) * 6, "eos", "")
        trajs.append(Trajectory(Problem("p", "q", "1"), c, float(i % 2), 0, trainable_from))
    return collate(trajs, 0)


def test_update_raises_logprob_of_positive_advantage_rows():
    for mode in ("reinforce", "clip"):
        module, _ = _module(LossConfig(mode=mode))
        batch = _batch()
        adv = torch.tensor([-1.0, 1.0, -1.0, 1.0])[:, None] * batch.loss_mask
        before = module.old_logprobs(batch).sum(1)
        metrics = module.update(batch, adv)
        delta = module.old_logprobs(batch).sum(1) - before
        assert (delta[[1, 3]] > 0).all() and (delta[[0, 2]] < 0).all(), (mode, delta)
        assert metrics["train/ratio_mean"] == 1.0 and metrics["train/grad_norm"] > 0


def test_masked_prefix_tokens_get_no_gradient():
    module, model = _module()
    batch = _batch(trainable_from=6)  # every token masked: nothing to learn
    adv = torch.ones_like(batch.loss_mask) * batch.loss_mask
    before = [p.detach().clone() for p in model.parameters()]
    module.update(batch, adv)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def _with_engine_logprobs(batch, logprobs):
    """``batch`` re-collated with each completion's engine log-probs set to ``logprobs[i]``."""
    trajs = []
    for i, t in enumerate(batch.trajectories):
        n = len(t.completion.response_ids)
        c = replace(t.completion, logprobs=tuple(float(v) for v in logprobs[i, :n]))
        trajs.append(replace(t, completion=c))
    return collate(trajs, 0)


def test_update_logs_the_engine_trainer_logprob_mismatch():
    """Trap 4: every step logs |log π_engine - log π_trainer| (max, mean) and a KL estimate,
    from the rollout's stored engine log-probs, whatever the backend."""
    for updates in (1, 2):
        module, _ = _module(LossConfig(updates_per_batch=updates), lr=0.0)
        batch = _batch()
        exact = _with_engine_logprobs(batch, module.old_logprobs(batch))
        m = module.update(exact, torch.ones_like(exact.loss_mask) * exact.loss_mask)
        assert m["train/backend/logprob_abs_diff_max"] < 1e-5  # same model scores: ratio 1
        off = _with_engine_logprobs(batch, module.old_logprobs(batch) - 0.25)
        m = module.update(off, torch.ones_like(off.loss_mask) * off.loss_mask)
        assert abs(m["train/backend/logprob_abs_diff_max"] - 0.25) < 1e-5
        assert abs(m["train/backend/logprob_abs_diff_mean"] - 0.25) < 1e-5
        k3 = math.exp(0.25) - 0.25 - 1  # d = log π_engine - log π_trainer = -0.25
        assert abs(m["train/backend/logprob_kl"] - k3) < 1e-5


def test_tis_cap_weights_the_update():
    module, _ = _module(LossConfig(tis_cap=2.0))
    batch = _batch()
    off = _with_engine_logprobs(batch, module.old_logprobs(batch) - 1.0)  # π_old/π_engine = e
    m = module.update(off, torch.ones_like(off.loss_mask) * off.loss_mask)
    assert m["train/backend/tis_weight_mean"] == pytest.approx(2.0)
    assert m["train/backend/tis_clip_frac"] == pytest.approx(1.0)


def test_a_metric_key_has_one_writer():
    """Two channels writing one key is an error naming both (one would silently hide the other);
    the values keep their reduction types."""
    from creditlab.step.step_metrics import MetricClash, one_writer_per_key
    from creditlab.types import Mean, Sum

    out = one_writer_per_key([("advantage", "A.estimate()", {"groups": Sum(3)}),
                              ("rollout", "Sampler.metrics()", {"completions": Sum(8)}),
                              ("rollout", "Strategy.metrics()", {"reset/seeds_per_prompt": Mean(0.5)})])
    assert out == {"train/advantage/groups": 3.0, "train/rollout/completions": 8.0,
                   "train/rollout/reset/seeds_per_prompt": 0.5}
    assert type(out["train/advantage/groups"]) is Sum
    with pytest.raises(MetricClash, match=r"'train/advantage/groups' is written by both A.estimate\(\) and A.metrics\(\)"):
        one_writer_per_key([("advantage", "A.estimate()", {"groups": 3.0}), ("advantage", "A.metrics()", {"groups": 3.0})])


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_several_updates_under_bf16_autocast_see_the_updated_weights(lora):
    """Lightning's bf16-mixed precision runs the whole training step under one autocast context,
    which keeps its bf16 copies of (peft's LoRA) weights: after the first of ``updates_per_batch``
    optimizer steps, the next mini-batch's forward saw the old adapters (its ratios exactly 1;
    measured). The update clears that cache after every optimizer step."""
    from creditlab.run.models import LoraConfig, apply_lora

    ratios = {}
    for autocast in (False, True):
        torch.manual_seed(0)
        model, tok = tiny_model_and_tokenizer()
        if lora:
            model = apply_lora(model, LoraConfig(enabled=True, r=4), seed=1)
            with torch.no_grad():  # B = 0 at the start: give the adapters values, so A moves too
                for name, p in model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
        module, _ = _module(LossConfig(mode="clip", updates_per_batch=2), lr=2.0, model=(model, tok))
        batch = _batch()
        adv = torch.tensor([-1.0, 1.0, -1.0, 1.0])[:, None] * batch.loss_mask
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            ratios[autocast] = module.update(batch, adv)["train/ratio_max"]
    assert ratios[False] > 1.01 and ratios[True] > 1.01, ratios  # the second mini-batch moved
