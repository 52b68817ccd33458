"""creditlab.step.token_logprobs: the fused LM head gives the log-probs, entropies and gradients of
the full logits on every supported architecture (shared prompts, padding, LoRA), only at the
response's real tokens; the update and the old log-probs are the same with it on and off; heads it
cannot reproduce fall back."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.run.models import LoraConfig, apply_lora
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import RolloutConfig
from creditlab.step.token_logprobs import FUSED_MIN_VOCAB, fused_head_of, response_logprobs

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import approx_fp, assert_close_fp, lm_length
from tests.unit.test_branch_logprobs import _case
from tests.unit.test_accel import MODELS
from tests.unit.test_forward import _rollout
from tests.unit.test_fused_head import _Largest
from tests.unit.test_lora import _lora_model

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _run(model, batch, fused, temperature=0.7):
    """(logprob, entropy, grads) of a weighted sum of the response log-probs."""
    model.zero_grad(set_to_none=True)
    lp, ent = response_logprobs(
        model, batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_ids,
        batch.response_mask, temperature, fused=fused)
    weights = torch.linspace(-1.0, 1.0, batch.size)[:, None] * batch.response_mask
    (-(lp * weights).sum() / batch.response_mask.sum()).backward()
    grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    mask = batch.response_mask.bool()
    return lp.detach()[mask], ent[mask], grads


def _lengths(model, batch):
    """Rounded terms behind one log-prob or entropy, and behind one parameter's gradient (a LoRA
    model's adapted projections add their rank-r sums: 7 a layer)."""
    config = getattr(model, "get_base_model", lambda: model)().config
    lora = 7 * config.num_hidden_layers * model.peft_config["default"].r if hasattr(model, "peft_config") else 0
    seq, tokens = batch.input_ids.shape[1], int(batch.attention_mask.sum())
    return lm_length(config, seq) + lora, lm_length(config, seq, backward=True, tokens=tokens) + 2 * lora


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fused_equals_full_logits_on_every_architecture(name):
    model, _ = MODELS[name]()
    model.train()
    assert fused_head_of(model, "on") is not None
    batch = _rollout(prompt_lens=(3, 7, 5, 0))  # shared prompts, an empty one, both paddings
    lp, ent, g = _run(model, batch, "on")
    lp_ref, ent_ref, g_ref = _run(model, batch, "off")
    n, n_grad = _lengths(model, batch)
    assert_close_fp(lp, lp_ref, length=n)
    assert_close_fp(ent, ent_ref, length=n)
    assert g.keys() == g_ref.keys()
    for name in g:
        assert_close_fp(g[name], g_ref[name], length=n_grad, msg=name)


def test_fused_under_lora_equals_full_logits():
    lora, _ = _lora_model(seed=4)
    model = lora.get_base_model()
    head = fused_head_of(lora, "on")
    assert head is not None and head[1] is model.lm_head.weight  # all-linear leaves lm_head alone
    batch = _rollout(seed=3)
    lp, ent, g = _run(lora, batch, "on")
    lp_ref, ent_ref, g_ref = _run(lora, batch, "off")
    n, n_grad = _lengths(model, batch)
    assert_close_fp(lp, lp_ref, length=n)
    assert_close_fp(ent, ent_ref, length=n)
    assert g.keys() == g_ref.keys() and all("lora_" in n for n in g)
    for name in g:
        assert_close_fp(g[name], g_ref[name], length=n_grad, msg=name)


def test_which_heads_fuse():
    model, _ = tiny_model_and_tokenizer(seed=0)
    assert model.lm_head.weight.shape[0] < FUSED_MIN_VOCAB
    assert fused_head_of(model, "auto") is None  # a toy vocabulary keeps its logits
    assert fused_head_of(model, "off") is None
    decoder, weight, bias = fused_head_of(model, "on")
    assert decoder is model.model and weight is model.lm_head.weight and bias is None
    model.config.model_type = "gemma2"  # soft-capped logits: not a plain head
    assert fused_head_of(model, "on") is None
    with pytest.raises(ValueError, match="auto, on, off"):
        fused_head_of(model, "yes")
    wrapped = apply_lora(tiny_model_and_tokenizer(seed=0)[0], LoraConfig(enabled=True, r=2, target_modules=["lm_head"]))
    assert fused_head_of(wrapped, "on") is None  # a LoRA-adapted head is not a plain Linear


def test_loss_config_fused_head_values():
    assert LossConfig().fused_head == "auto"
    assert LossConfig(fused_head=False).fused_head == "off"
    assert LossConfig(fused_head=True).fused_head == "on"
    with pytest.raises(ConfigError, match="fused_head must be one of auto, on, off"):
        LossConfig(fused_head="fused")


def test_fused_path_never_builds_the_padded_logits():
    """Forward and backward of the fused path create nothing as large as (rows, T, V): padding
    never reaches the head (the unfused path builds exactly that)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    batch = _rollout(prompt_lens=(3, 7, 5), group=4, seed=5)
    full = batch.size * batch.response_ids.shape[1] * cfg.vocab_size
    for fused, below in (("auto", True), ("off", False)):
        with _Largest() as seen:
            _run(model, batch, fused)
        assert (seen.largest < full) is below, (fused, seen.largest, full)


def _module(model, tok, fused):
    return CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(micro_batch_size=5, fused_head=fused),
        RolloutConfig(temperature=0.8), EvalConfig(every=0),
        functools.partial(torch.optim.SGD, lr=0.1), seed=0,
    )


def test_module_update_and_old_logprobs_same_with_fused_head_on_and_off():
    """The update's backward (loss, gradients, entropy metric) and the old log-probs agree."""
    torch.manual_seed(0)
    batch = _rollout(prompt_lens=(4, 2, 6), group=4, seed=7)
    adv = torch.linspace(-1.0, 1.0, batch.size)[:, None].expand_as(batch.response_mask).contiguous()
    out = {}
    for fused in ("on", "off"):
        model, tok = tiny_model_and_tokenizer(seed=2)
        module = _module(model, tok, fused)
        module.manual_backward = lambda loss: loss.backward()
        stats = MiniBatchStats.from_mask(batch.loss_mask, module.loss_cfg)
        with torch.no_grad():
            old = module.old_logprobs(batch)
        parts = module.backward_rows(batch, adv, torch.arange(batch.size), stats, old, None)
        out[fused] = old, parts, {n: q.grad.clone() for n, q in model.named_parameters()}
    (old_on, parts_on, g_on), (old_off, parts_off, g_off) = out["on"], out["off"]
    n, n_grad = _lengths(model, batch)
    assert_close_fp(old_on, old_off, length=n)
    assert parts_on.keys() == parts_off.keys()
    tokens = int(batch.loss_mask.sum())
    for k in parts_on:
        # Each part sums `tokens` per-token values (an entropy sum of ~200 is compared relatively).
        # Their terms are of scale >= 1: |adv| <= 1 with ratios ~1 (the loss cancels to ~0) and
        # log-probs of a few nats; so the scale is max(1, |part|).
        want = float(parts_off[k])
        assert parts_on[k] == approx_fp(want, length=tokens + n, scale=max(1.0, abs(want)), where=k), k
    for name in g_on:
        assert_close_fp(g_on[name], g_off[name], length=n_grad, msg=name)


def test_handle_logprobs_and_branches_same_with_fused_head_on_and_off():
    """``PolicyHandle.logprobs`` (all real tokens, or only the wanted positions) and
    ``branch_logprobs`` (cached trunks) through the fused head equal the full logits' values."""
    model, tok = tiny_model_and_tokenizer(seed=3)
    model.eval()
    handles = {mode: ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(0), temperature=0.7,
                                       micro_batch_size=2, fused_head=mode) for mode in ("on", "off")}
    ids, mask, rows, at, bids, bmask = case = _case(model.config.vocab_size)
    want = torch.zeros_like(mask, dtype=torch.bool)
    want[:, 4:8] = True
    for positions in (None, want):
        on, off = (handles[m].logprobs(ids, mask, positions) for m in ("on", "off"))
        assert_close_fp(on, off, length=lm_length(model.config, ids.shape[1]))
        assert (on[:, 0] == 0).all() and (on[mask == 0] == 0).all()
        if positions is not None:
            assert (on[~want] == 0).all() and (on[want & (mask > 0)] < 0).all()
    on, off = (handles[m].branch_logprobs(*case) for m in ("on", "off"))
    assert_close_fp(on, off, length=lm_length(model.config, ids.shape[1] + bids.shape[1]))
    assert (on[bmask == 0] == 0).all() and (on[bmask > 0] < 0).all()
