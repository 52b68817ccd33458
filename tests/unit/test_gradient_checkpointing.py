"""model.gradient_checkpointing: the decoder layers really recompute in the backward (counted, and
fewer tensors are kept for it), the gradients equal those without it, the policy stays in eval
mode (no dropout), the shared-prompt forward falls back, and the config key composes and loads."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.run.models import LoraConfig, apply_lora, enable_gradient_checkpointing, load_policy
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.evaluation import EvalConfig
from creditlab.step.forward import _unshareable_mode, response_logits
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.rollout import RolloutConfig, collate
from creditlab.types import Completion, Problem, Trajectory

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _model(lora: bool, checkpointing: bool):
    model, tok = tiny_model_and_tokenizer(seed=3)
    if lora:
        model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8.0), seed=1)
        with torch.no_grad():  # a fresh adapter has B = 0: give B values so A gets gradients too
            gen = torch.Generator().manual_seed(2)
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    if checkpointing:
        enable_gradient_checkpointing(model)
    return model, tok


def _rollout(group: int = 3):
    """Two prompts (left-padded to one width), ``group`` responses of 2..7 tokens each."""
    gen = torch.Generator().manual_seed(0)
    trajs = []
    for g, plen in enumerate((4, 7)):
        prompt = tuple(torch.randint(5, 60, (plen,), generator=gen).tolist())
        for i in range(group):
            resp = tuple(torch.randint(5, 60, (2 + (g + 2 * i) % 6,), generator=gen).tolist())
            c = Completion(prompt, resp, (0.0,) * len(resp), "eos", "")
            trajs.append(Trajectory(Problem(str(g), "q", "1"), c, float(i % 2), g))
    return collate(trajs, 0)


def _module(model, tok):
    module = CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(), RolloutConfig(), EvalConfig(every=0),
        functools.partial(torch.optim.SGD, lr=0.1), seed=0,
    )
    module.manual_backward = lambda loss: loss.backward()
    return module


def _layers(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(base.model.layers)


def _step(model, tok):
    """One ``backward_rows`` of the update (the shared-prompt forward, the clipped loss) on every
    row; returns the gradients, the MLP calls per layer in the forward and in the backward, and
    the bytes autograd kept for the backward outside checkpointed regions."""
    module, batch = _module(model, tok), _rollout()
    adv = torch.linspace(-1, 1, batch.size)[:, None] * batch.loss_mask
    stats = MiniBatchStats.from_mask(batch.loss_mask, module.loss_cfg)
    calls = {"forward": 0, "backward": 0}
    phase = ["forward"]
    # A pre-hook: torch's recompute stops as soon as the last kept tensor is rebuilt (inside the
    # MLP's last linear), before any forward hook of the MLP would run.
    hooks = [layer.mlp.register_forward_pre_hook(lambda *a: calls.__setitem__(phase[0], calls[phase[0]] + 1))
             for layer in _layers(model)]
    kept: dict[int, int] = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    # The loss's backward inside backward_rows: flip the phase between forward and backward.
    def backward(loss):
        phase[0] = "backward"
        loss.backward()

    module.manual_backward = backward
    model.zero_grad(set_to_none=True)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module.backward_rows(batch, adv, torch.arange(batch.size), stats, None, None)
    finally:
        for h in hooks:
            h.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    n = len(_layers(model))
    return grads, calls["forward"] / n, calls["backward"] / n, sum(kept.values())


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointing_recomputes_and_gives_the_same_gradients(lora):
    want, fwd, bwd, kept_plain = _step(*_model(lora, checkpointing=False))
    model, tok = _model(lora, checkpointing=True)
    got, fwd_ckpt, bwd_ckpt, kept_ckpt = _step(model, tok)
    # Without checkpointing each layer runs once (one forward: the shared-prompt forward runs the
    # prompts and the responses as two calls); with it, the plain forward runs each layer once and
    # the backward runs it again.
    assert (fwd, bwd) == (2, 0)
    assert (fwd_ckpt, bwd_ckpt) == (1, 1)
    assert kept_ckpt < 0.6 * kept_plain, (kept_ckpt, kept_plain)
    assert want.keys() == got.keys() and want
    # the checkpointed step runs the plain forward, the other the shared-prompt one: other sums
    batch = _rollout()
    config = tiny_model_and_tokenizer(seed=3)[0].config
    n = lm_length(config, batch.input_ids.shape[1], backward=True, tokens=int(batch.attention_mask.sum()))
    n += config.num_hidden_layers * 7 * 4 * lora  # LoRA's rank-4 sums: 7 adapted projections a layer
    for name in want:
        assert_close_fp(got[name], want[name], length=n, msg=name)
    # The modes stay as loaded but for the decoder layers (their flag is what checkpointing reads;
    # peft's wrapper and adapter modules are in training mode either way, with no dropout).
    before = {n for n, m in _model(lora, checkpointing=False)[0].named_modules() if m.training}
    after = {n for n, m in model.named_modules() if m.training}
    assert after - before == {n for n, m in model.named_modules() if type(m).__name__ == "LlamaDecoderLayer"}
    assert before <= after and not any(m.self_attn.training for m in _layers(model))


def test_shared_prompt_forward_falls_back_only_with_gradients():
    model, _ = _model(lora=False, checkpointing=True)
    assert _unshareable_mode(model)
    with torch.no_grad():  # old / reference log-probs: no layer checkpoints, the cache is kept
        assert not _unshareable_mode(model)
        batch = _rollout()
        shared = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
        plain = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len, share_prompts=False)
        assert_close_fp(shared, plain, length=lm_length(model.config, batch.input_ids.shape[1]))
    assert not _unshareable_mode(_model(lora=False, checkpointing=False)[0])


@pytest.mark.parametrize("lora", ["false", "true"])
def test_config_key_composes_and_loads(tmp_path, lora):
    tiny_model_and_tokenizer(tmp_path)
    cfg = compose([
        f"model.name_or_path={tmp_path}", "model.gradient_checkpointing=true", f"model.lora.enabled={lora}",
        "model.lora.r=4", "model.accelerator=none",
    ])
    checked = validate(cfg)
    assert checked["model"].gradient_checkpointing is True
    model, _, _ = load_policy(checked["model"])
    layers = _layers(model)
    assert layers and all(layer.gradient_checkpointing and layer.training for layer in layers)
    assert not any(layer.self_attn.training for layer in layers)  # (peft's wrapper trains; no dropout)
    assert lora == "true" or not model.training
    off, _, _ = load_policy(validate(compose([f"model.name_or_path={tmp_path}"]))["model"])
    assert not any(getattr(m, "gradient_checkpointing", False) for m in off.modules())
    assert not any(m.training for m in off.modules())
