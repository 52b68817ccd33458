"""One update step (``CreditAssignmentModule.update``) on CUDA equals the same step on the CPU.

Both sides start from the same tiny fp32 model and train on the same collated batch (two prompts
of different lengths, so left padding and the shared-prompt forward run; responses of 4-11 tokens,
so right padding; per-token advantages; a trained prefix masked on some rows) with plain SGD
(lr 0.1, gradient clipping at 1.0, as the module does it). SGD, not Adam: Adam's first step
divides each gradient entry by its own magnitude, which would turn rounding noise in near-zero
entries into full-size differences.

Tolerance: each parameter's change on CUDA equals the CPU's within ``rtol=1e-3`` plus
``1e-4 x`` the largest CPU change (for entries whose change is ~0). The gradients are the same fp32
math with other kernels and reduction orders, so they differ by ~1e-6 relative; 1e-3 leaves room
for the clipping norm and the old-log-prob pass while a bf16/TF32 cast (~1e-2) or a wrong mask
(an O(1) difference in some entries) fails. The logged metrics agree to ``rel=1e-4``.

The batch is moved to the model's device here, so this test checks the step's numerics on CUDA;
whether the RL step itself gets its collated batch onto the device is what the 3-step runs
(test_train_cuda.py) check.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

from tests.helpers import tiny_model_and_tokenizer

LR = 0.1
RTOL = 1e-3
ATOL_OF_MAX = 1e-4
METRIC_REL = 1e-4

LOSSES = {
    "clip-2-minibatches-micro3": {"mode": "clip", "agg": "seq-mean-token-mean", "updates_per_batch": 2,
                                  "micro_batch_size": 3},
    "reinforce-token-mean": {"mode": "reinforce", "agg": "token-mean"},
    # rows 0, 3, 6 get no advantage (as a group of equal rewards): they are skipped on both devices
    "clip-2-minibatches-skip-zero-rows": {"mode": "clip", "updates_per_batch": 2, "skip_zero_advantage": True},
}


def _module(model, tok, loss):
    """The module around ``model`` with an SGD optimizer and a plain backward (no Trainer)."""
    from creditlab.step.evaluation import EvalConfig
    from creditlab.step.losses import LossConfig
    from creditlab.step.module import CreditAssignmentModule
    from creditlab.types import RolloutConfig

    opt = torch.optim.SGD(model.parameters(), lr=LR)
    module = CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(**loss), RolloutConfig(), EvalConfig(every=0),
        functools.partial(torch.optim.SGD, lr=LR), seed=0,
    )
    module.optimizers = lambda: opt
    module.manual_backward = lambda value: value.backward()
    return module


def _batch():
    """8 rows, 2 prompts of different lengths, responses of 4-11 tokens; rows 1, 4, 7 train
    from response token 1 and rows 2, 5 from token 2."""
    from creditlab.step.rollout import collate
    from creditlab.types import Completion, Problem, Trajectory

    gen = torch.Generator().manual_seed(1)
    prompts = [(2, 5, 6), (2, 7, 8, 9, 10, 11)]
    trajs = []
    for i in range(8):
        n = 4 + i
        resp = tuple(torch.randint(5, 100, (n,), generator=gen).tolist())
        engine = tuple((-3.0 - torch.rand(n, generator=gen)).tolist())
        c = Completion(prompts[i % 2], resp, engine, "eos", "")
        trajs.append(Trajectory(Problem(f"p{i % 2}", "q", "1"), c, float(i % 3 == 0), i % 2, i % 3))
    return collate(trajs, 0)


def _to(batch, device):
    """``batch`` with every tensor field on ``device``."""
    moved = {f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)
             if isinstance(getattr(batch, f.name), torch.Tensor)}
    return dataclasses.replace(batch, **moved)


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_update_step_on_cuda_equals_cpu(fp32_matmuls, loss):
    model, tok = tiny_model_and_tokenizer(seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    gpu_model = copy.deepcopy(model).cuda()
    batch = _batch()
    adv = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2)) * batch.loss_mask
    if LOSSES[loss].get("skip_zero_advantage"):
        adv[::3] = 0.0

    cpu_metrics = _module(model, tok, LOSSES[loss]).update(batch, adv)
    gpu_metrics = _module(gpu_model, tok, LOSSES[loss]).update(_to(batch, "cuda"), adv.cuda())

    assert next(gpu_model.parameters()).device.type == "cuda"
    cpu_params, gpu_params = dict(model.named_parameters()), dict(gpu_model.named_parameters())
    largest = max(float((cpu_params[n].detach() - before[n]).abs().max()) for n in before)
    assert largest > 0, "the CPU step changed nothing: the comparison would be empty"
    for name, start in before.items():
        want = cpu_params[name].detach() - start
        got = gpu_params[name].detach().cpu() - start
        torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL_OF_MAX * largest, msg=name)
    assert set(gpu_metrics) == set(cpu_metrics)
    assert dict(gpu_metrics) == pytest.approx(dict(cpu_metrics), rel=METRIC_REL, abs=1e-6)
