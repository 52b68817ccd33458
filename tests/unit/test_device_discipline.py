"""Device discipline checked on a CPU: what a GPU run would reveal, shown without one.

A CPU has one device, so code that forgets the policy's device runs here and fails on a GPU. These
tests put the policy on ``meta`` (a device with shapes and no data): whatever the step builds for
the policy must then be on ``meta`` too. Causal-LM forwards cannot run on ``meta`` (the attention
mask code reads values), so the step's own plumbing is checked here — the batch and advantages the
update receives, the reference model, the policy handle's outputs — and every tensor factory of
the step, evaluation and credit-bench is audited for a missing ``device=`` by
``tests/integration/test_device_discipline.py`` (:class:`creditlab.testing.devices.ImplicitDeviceAudit`).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule, Parts
from creditlab.step.policy import ModelPolicyHandle
from creditlab.testing.devices import ImplicitDevice, ImplicitDeviceAudit
from creditlab.types import Advantages, Completion, Problem, RolloutConfig, Segments, Trajectory

from tests.helpers import tiny_model_and_tokenizer

META = torch.device("meta")


def test_audit_names_a_factory_without_device(tmp_path):
    here = (str(tmp_path.parent),)
    src = tmp_path / "made_here.py"
    src.write_text("import torch\n\ndef make():\n    return torch.zeros(3)\n")
    namespace: dict = {}
    exec(compile(src.read_text(), str(src), "exec"), namespace)
    with pytest.raises(ImplicitDevice, match=r"made_here\.py:4: torch\.zeros"), ImplicitDeviceAudit(here):
        namespace["make"]()
    with ImplicitDeviceAudit(here, record=True) as audit:  # the test's own file is not audited
        torch.zeros(2)
        torch.randperm(3, generator=torch.Generator())  # the generator fixes the device
    assert audit.found == []
    with ImplicitDeviceAudit(record=True) as audit:  # creditlab's own: an explicit device passes
        from creditlab.step.rollout import collate
        collate([_trajectory(0)], pad_id=0, device="cpu")
    assert audit.found == []


def _trajectory(i: int) -> Trajectory:
    c = Completion((2, 5, 6)[: 2 + i % 2], (7, 8, 9, 10)[: 2 + i % 3], (-1.0,) * (2 + i % 3), "eos", "")
    return Trajectory(Problem("p", "q", "1"), c, float(i % 2), 0, 0)


class _Stub:
    """Every part the step needs, without generation: fixed trajectories, one segment each,
    advantages made on the CPU (as an estimator built from Python lists would)."""

    def __init__(self, seen: dict) -> None:
        self.seen = seen

    def reset_metrics(self) -> None: ...
    def metrics(self) -> dict: return {}
    def load_weights(self, _): ...
    def release(self) -> None: ...
    def take_generated_tokens(self) -> int: return 0

    def collect(self, problems, ctx, sampler, seed):
        return [_trajectory(i) for i in range(4)]

    def segment(self, batch):
        self.seen["segment"] = batch.input_ids.device
        return Segments(tuple(((0, len(t.completion.response_ids)),) for t in batch.trajectories))

    def estimate(self, batch, ctx):
        self.seen["estimate"] = batch.loss_mask.device
        return Advantages(torch.ones(batch.loss_mask.shape, device="cpu"))


class _Stop(Exception):
    pass


def _meta_module(reference=None):
    model, tok = tiny_model_and_tokenizer(seed=0)
    seen: dict = {}
    stub = _Stub(seen)
    parts = Parts(stub, stub, stub, stub, stub, stub, stub)
    module = CreditAssignmentModule(
        model, tok, parts, lambda step: [Problem("p", "q", "1")], [], LossConfig(), RolloutConfig(),
        EvalConfig(every=0), functools.partial(torch.optim.SGD, lr=0.1), seed=0, reference=reference,
    )
    return module.to(META), seen


def test_the_step_hands_the_update_its_batch_on_the_policy_device():
    module, seen = _meta_module()

    def update(rollout, advantages):
        seen["update"] = {name: getattr(rollout, name).device for name in (
            "input_ids", "attention_mask", "response_ids", "response_mask", "loss_mask", "gen_logprobs")}
        seen["advantages"] = advantages.device
        raise _Stop

    module.update = update
    with pytest.raises(_Stop):
        module.training_step(None, 0)
    assert seen["segment"] == META and seen["estimate"] == META
    assert set(seen["update"].values()) == {META}, seen["update"]
    assert seen["advantages"] == META


def test_the_credit_metrics_get_the_advantages_on_the_batch_device():
    """The credit metrics weigh the advantages by the batch's loss mask, so both must be on one
    device (on CUDA, every estimator that builds its advantages on the host crashed there)."""
    module, seen = _meta_module()
    module.update = lambda rollout, advantages: {}
    module.step_metrics = lambda rollout, generated: {}

    def credit(rollout, advantages):
        seen["credit"] = (rollout.loss_mask.device, advantages.device)
        raise _Stop

    module.credit = credit
    with pytest.raises(_Stop):
        module.training_step(None, 0)
    assert seen["credit"] == (META, META)


def test_the_reference_model_follows_the_policy():
    model, _ = tiny_model_and_tokenizer(seed=0)
    module, _ = _meta_module(reference=copy.deepcopy(model).requires_grad_(False))
    devices = {p.device for p in module._reference[0].parameters()}
    assert devices == {META}, devices
    assert not any(k.startswith("_reference") for k in module.state_dict()), "the reference is not checkpointed"
    assert all(p.requires_grad for p in module.policy.parameters())
    assert not any(p is q for p in module.parameters() for q in module._reference[0].parameters())


def test_the_policy_handle_answers_on_the_policy_device():
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.set_attn_implementation("eager")  # sdpa's mask code reads values, which meta has not
    model.to(META)
    handle = ModelPolicyHandle(model, tok, None, torch.Generator())
    ids = torch.tensor([[0, 2, 5, 6], [2, 5, 6, 7]], device="cpu")
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], device="cpu")
    assert handle.logprobs(ids, mask).device == META  # inputs are moved at the handle's boundary
    emb, grad = handle.input_gradients(ids, mask, lambda e, logits: logits.sum())
    assert emb.device == META and grad.device == META
