"""The update step moves the policy the right way and leaves masked tokens alone."""

import functools

import torch

from creditlab.evaluation import EvalConfig
from creditlab.losses import LossConfig
from creditlab.module import CreditAssignmentModule
from creditlab.rollout import RolloutConfig, collate
from creditlab.types import Completion, Problem, Trajectory
from tests.helpers import tiny_model_and_tokenizer


def _module(loss=None, lr=0.5):
    torch.manual_seed(0)
    model, tok = tiny_model_and_tokenizer()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
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
