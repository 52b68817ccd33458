"""LoRA through peft: config errors, everything that calls the model works on the PeftModel
(generation = training forward log-probs, shared-prompt forward = plain forward, the handle's
log-probs and input gradients), only adapter weights train, and merged weights reproduce it."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.accel.fused_decode import FusedDecoder
from creditlab.accel.support import supported
from creditlab.backends.hf import HFBackend
from creditlab.errors import ConfigError
from creditlab.run.models import LoraConfig, ModelConfig, apply_lora, merged_state_dict
from creditlab.step.evaluation import EvalConfig
from creditlab.step.forward import response_logits
from creditlab.step.losses import LossConfig, gather_logprobs
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import RolloutConfig, collate
from creditlab.types import GenerationRequest, Problem, SamplingParams, Trajectory

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _lora_model(seed: int = 0, **kw):
    """A tiny Llama with LoRA adapters whose B is random (a fresh adapter is exactly 0)."""
    model, tok = tiny_model_and_tokenizer(seed=seed)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8.0, **kw))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return peft_model, tok


def test_config_errors_name_the_fix():
    with pytest.raises(ConfigError, match="qkv matches no module.*q_proj, up_proj, v_proj"):
        apply_lora(tiny_model_and_tokenizer()[0], LoraConfig(enabled=True, target_modules=["qkv"]))
    with pytest.raises(ConfigError, match=r"model.lora.alhpa.*Did you mean 'model.lora.alpha'"):
        ModelConfig(recipe="x", lora={"alhpa": 4})
    with pytest.raises(ValueError, match="dropout must be 0"):
        LoraConfig(enabled=True, dropout=0.1)
    assert ModelConfig(recipe="x", lora={"enabled": True, "r": 8}).lora == LoraConfig(True, 8)
    assert apply_lora(tiny_model_and_tokenizer()[0], LoraConfig()).__class__.__name__ == "LlamaForCausalLM"


def test_targets_and_trainable_parameters():
    model, _ = _lora_model(target_modules=["q_proj", "v_proj"])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "v_proj"}
    fresh = apply_lora(tiny_model_and_tokenizer()[0], LoraConfig(enabled=True, r=4))  # all-linear
    assert {n.split(".")[-4] for n, p in fresh.named_parameters() if p.requires_grad} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    ids = torch.randint(5, 60, (2, 7))
    with torch.no_grad():  # B = 0 at the start: the adapted model is the base model
        assert torch.equal(fresh(ids).logits, tiny_model_and_tokenizer()[0](ids).logits)  # + B A x = + 0 exactly


def test_fused_decoder_takes_the_peft_model():
    """Since issue 40 the fused decoder runs a plain LoRA model from its effective weights
    (tests/unit/test_accel.py checks its samples against peft's forward)."""
    model, _ = _lora_model()
    assert supported(model) and FusedDecoder.build(model) is not None


def _requests(tok):
    prompts = ["1+2=", "hello world", "Q: 17*3?"]
    return [GenerationRequest(tuple(tok.encode(p, add_special_tokens=False))) for p in prompts]


def test_generation_logprobs_equal_the_training_forward():
    """TESTING trap 4 with LoRA: the backend's sampling log-probs are the trainer's log-probs."""
    model, tok = _lora_model()
    backend = HFBackend(model=model, tokenizer=tok)
    reqs = [r for r in _requests(tok) for _ in range(2)]  # repeated prompts: the shared forward
    out = backend.generate(reqs, SamplingParams(temperature=0.8, max_new_tokens=12, seed=5))
    trajs = [Trajectory(Problem("p", "q", "1"), c, 0.0, i // 2) for i, c in enumerate(out)]
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad():
        shared = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
        plain = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len,
                                share_prompts=False)
    real = batch.response_mask.bool()
    lp = gather_logprobs(shared, batch.response_ids, 0.8)
    # the adapters add a reduction over the rank r to each adapted projection
    config = model.get_base_model().config  # each layer's 7 adapted projections add a rank-r sum
    n = lm_length(config, batch.input_ids.shape[1]) + config.num_hidden_layers * 7 * model.peft_config["default"].r
    assert_close_fp(lp[real], batch.gen_logprobs[real], length=n)
    assert_close_fp(shared[real], plain[real], length=n)
    # the handle reaches the PeftModel too: teacher-forced log-probs and input gradients
    handle = ModelPolicyHandle(model, tok, backend, torch.Generator(), temperature=0.8)
    full = handle.logprobs(batch.input_ids, batch.attention_mask)[:, batch.prompt_len:]
    assert_close_fp(full[real], batch.gen_logprobs[real], length=n)
    emb, grad = handle.input_gradients(batch.input_ids, batch.attention_mask,
                                       lambda e, logits: logits.float().logsumexp(-1).sum())
    assert emb.shape == grad.shape and grad.abs().sum() > 0


def test_update_changes_only_the_adapters():
    model, tok = _lora_model()
    module = CreditAssignmentModule(
        model, tok, None, None, [], LossConfig(mode="reinforce"), RolloutConfig(), EvalConfig(every=0),
        functools.partial(torch.optim.AdamW, lr=1e-2), seed=0,
    )
    opt = module.configure_optimizers()
    named = dict(model.named_parameters())
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {
        id(p) for n, p in named.items() if "lora_" in n}
    module.optimizers = lambda: opt
    module.manual_backward = lambda loss: loss.backward()
    before = {n: p.detach().clone() for n, p in named.items()}
    backend = HFBackend(model=model, tokenizer=tok)
    out = backend.generate([r for r in _requests(tok) for _ in range(2)],
                           SamplingParams(temperature=1.0, max_new_tokens=8, seed=1))
    trajs = [Trajectory(Problem("p", "q", "1"), c, float(i % 2), i // 2) for i, c in enumerate(out)]
    batch = collate(trajs, tok.pad_token_id)
    metrics = module.update(batch, (batch.rewards[:, None] - 0.5) * batch.loss_mask)
    assert metrics["train/grad_norm"] > 0
    for name, p in named.items():
        changed = not torch.equal(before[name], p.detach())
        assert changed == ("lora_" in name), name
    assert module.frozen_keys and all("lora_" not in k for k in module.frozen_keys)


def test_merged_state_dict_has_base_names_and_reproduces_the_logits():
    model, _ = _lora_model()
    base, _ = tiny_model_and_tokenizer(seed=0)
    base_keys = set(base.state_dict())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)
    assert set(merged) == base_keys
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "model unchanged"
    base.load_state_dict(merged)
    ids = torch.randint(5, 60, (3, 9))
    with torch.no_grad():
        # W + B A rounded once against W x + B (A x): the merge adds the rank-r sum per layer
        n = lm_length(base.config, ids.shape[1]) + base.config.num_hidden_layers * 7 * model.peft_config["default"].r
        assert_close_fp(base(ids).logits, model(ids).logits, length=n)
        plain, _ = tiny_model_and_tokenizer(seed=0)
        assert (plain(ids).logits - model(ids).logits).abs().max() > 1e-3, "the adapters matter"
    assert set(merged_state_dict(plain)) == base_keys  # a plain model: its own state dict
