"""creditlab.fused: FusedDecoder's one-token steps equal the model's own forward (Llama, Qwen2; GQA,
biases, tied embeddings, left padding, fused or in-place weights) and HFBackend samples the same
tokens with it on or off; shared_prompt_logits gives the plain forward's logits and gradients; every
model they do not reproduce exactly falls back to the model's forward."""

from __future__ import annotations

import copy

import pytest
import torch
from creditlab.accel.fused import FusedDecoder
from creditlab.backends.hf import HFBackend
from creditlab.backends.kv_cache import make_cache
from creditlab.types import GenerationRequest, SamplingParams

from tests.helpers import char_tokenizer, tiny_model_and_tokenizer, with_token_bias

pytestmark = pytest.mark.usefixtures("one_thread")


def _qwen2(tie: bool = True, kv_heads: int = 2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = char_tokenizer()
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
        tie_word_embeddings=tie, pad_token_id=0, eos_token_id=tok.eos_token_id,
        initializer_range=0.1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(cfg).eval()
        with torch.no_grad():  # nonzero q/k/v biases, so that they matter
            for layer in model.model.layers:
                for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    p.bias.normal_(0, 0.1)
    return model, tok


def _llama_dynamic_rope():
    """Dynamic NTK RoPE with a short original context: its frequencies change as positions grow
    past 12, so the decoder must compute them at every step as the model does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = char_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=12,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        initializer_range=0.1, pad_token_id=0, eos_token_id=tok.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return LlamaForCausalLM(cfg).eval(), tok


MODELS = {
    "llama-dynamic-rope": _llama_dynamic_rope,
    "llama-gqa": lambda: tiny_model_and_tokenizer(seed=0),
    "llama-mha": lambda: tiny_model_and_tokenizer(seed=1, heads=4, kv_heads=4),
    "llama-head-bias": lambda: (lambda m, t: (with_token_bias(m, {t.eos_token_id: 0.5}), t))(
        *tiny_model_and_tokenizer(seed=2)),
    "qwen2-tied": lambda: _qwen2(tie=True),
    "qwen2-mqa": lambda: _qwen2(tie=False, kv_heads=1),
}


def _prefill(model, contexts, capacity):
    """(cache, mask, last position, last logits) of a left-padded prefill of ``contexts``."""
    width = max(len(c) for c in contexts)
    ids = torch.tensor([[0] * (width - len(c)) + list(c) for c in contexts])
    mask = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = make_cache(model, capacity)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache,
                use_cache=True)
    return out.past_key_values, mask, pos[:, -1], out.logits[:, -1]


A, B, C = (5, 6, 7, 8, 9), (10, 11), (12, 13, 14, 15, 16)
LAYOUTS = {
    "ragged-shuffled": [A, B, A, C, B, A, (17,)],  # groups of 3, 2, 1, 1 in any order, padding
    "sorted-groups": [A] * 3 + [C] * 3,  # equal groups in order, no padding: no slot copies
    "all-distinct": [A, B, C, (17,)],
}


@pytest.mark.parametrize("budget,shared_min", [(512.0, 0), (0.0, 0), (512.0, 10**6)])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_steps_equal_model_forward(name, layout, budget, shared_min):
    """Per-row reference: every row prefilled and decoded by the model with its own cache."""
    model, _ = MODELS[name]()
    model.eval()
    rows = LAYOUTS[layout]
    distinct = list(dict.fromkeys(rows))
    inverse = torch.tensor([distinct.index(c) for c in rows])
    steps, keep_at = 8, 4
    with torch.inference_mode():
        dec = FusedDecoder.build(model, copy_budget_mb=budget)
        assert dec is not None and dec.fused_weights == (budget > 0)
        ref_cache, mask, last, logits = _prefill(model, rows, capacity=16)
        ctx_cache, ctx_mask, _, ctx_logits = _prefill(model, distinct, capacity=16)
        torch.testing.assert_close(ctx_logits[inverse], logits, rtol=1e-5, atol=1e-5)
        has_pad = bool((ctx_mask == 0).any())
        dec.start(ctx_cache, inverse, ctx_mask.bool() if has_pad else None, max_new=steps,
                  min_shared_context=shared_min)
        assert dec._split == (shared_min == 0 and len(distinct) < len(rows))
        gen = torch.Generator().manual_seed(0)
        for step in range(steps):
            if step == keep_at:  # drop rows (a whole group too, in "ragged" layouts)
                keep = torch.arange(0, len(last), 2)
                dec.select(keep)
                ref_cache.batch_select_indices(keep)
                mask, last, logits = mask[keep], last[keep], logits[keep]
            tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
            last = last + 1
            mask = torch.cat([mask, mask.new_ones(len(last), 1)], dim=1)
            ref = model(input_ids=tok[:, None], attention_mask=mask, position_ids=last[:, None],
                        past_key_values=ref_cache, use_cache=True).logits[:, -1]
            torch.testing.assert_close(dec.step(tok, last), ref, rtol=1e-5, atol=1e-5)
            logits = ref
        with pytest.raises(RuntimeError, match="decoding steps"):
            dec.step(tok, last + 1)


def _requests(tok):
    prompts = ["1+2=", "hello world, how are", "x", "Q: 17*3?"]
    base = [GenerationRequest(tuple(tok.encode(p, add_special_tokens=False))) for p in prompts]
    reqs = [r for r in base for _ in range(3)]
    reqs += [GenerationRequest(base[0].prompt_ids, (20, 21)), GenerationRequest((), (7, 8, 9))]
    return reqs


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-tied"])
@pytest.mark.parametrize(
    "cfg", [dict(), dict(share_prefill=False), dict(compact_fraction=0.0), dict(max_batch_size=5),
            dict(fused_copy_budget_mb=0.0), dict(preallocate_kv=False),
            dict(fused_shared_context_min=0)],
)
def test_generate_samples_alike_with_fused_steps_on_or_off(name, cfg, monkeypatch):
    model, tok = MODELS[name]()
    model = with_token_bias(model, {tok.eos_token_id: 1.5})  # rows end early: compaction
    on = HFBackend(HFBackend.Config(**cfg), model=model, tokenizer=tok)
    off = HFBackend(HFBackend.Config(fused_decode=False, **cfg), model=model, tokenizer=tok)
    calls = []
    step = FusedDecoder.step
    monkeypatch.setattr(FusedDecoder, "step", lambda self, *a: calls.append(1) or step(self, *a))
    reqs = _requests(tok)
    for sp in (
        SamplingParams(temperature=1.0, max_new_tokens=14, seed=5),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=14, seed=6),
        SamplingParams(temperature=0.0, max_new_tokens=14),
    ):
        calls.clear()
        a = on.generate(reqs, sp)
        assert calls, "the fused steps did not run"
        n_on = len(calls)
        b = off.generate(reqs, sp)
        assert len(calls) == n_on  # off: the model's forward only
        assert [c.response_ids for c in a] == [c.response_ids for c in b]
        assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs),
                                       rtol=0, atol=1e-5)
    assert {c.finish_reason for c in a} >= {"eos", "length"}


def test_unsupported_models_and_caches_fall_back():
    from transformers import MistralConfig, MistralForCausalLM

    model, tok = tiny_model_and_tokenizer(seed=0)
    assert FusedDecoder.build(model) is not None

    sliding = MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=6))
    assert FusedDecoder.build(sliding) is None  # not a supported class

    hooked = copy.deepcopy(model)
    hooked.model.layers[1].mlp.register_forward_hook(lambda m, a, o: o * 2)
    assert FusedDecoder.build(hooked) is None

    half = copy.deepcopy(model).to(torch.bfloat16)
    assert FusedDecoder.build(half) is None

    class MyMLP(type(model.model.layers[0].mlp)):
        pass

    sub = copy.deepcopy(model)
    sub.model.layers[0].mlp.__class__ = MyMLP
    assert FusedDecoder.build(sub) is None

    patched = copy.deepcopy(model)
    patched.model.norm.forward = lambda x: x
    assert FusedDecoder.build(patched) is None

    gelu = copy.deepcopy(model)
    gelu.config.hidden_act = "gelu"
    assert FusedDecoder.build(gelu) is None

    # HFBackend: a hooked model samples through its forward (the hook applies)
    calls = []
    step = FusedDecoder.step
    try:
        FusedDecoder.step = lambda self, *a: calls.append(1) or step(self, *a)
        reqs = [GenerationRequest(tuple(tok.encode("abc", add_special_tokens=False)))] * 2
        sp = SamplingParams(max_new_tokens=4, seed=0)
        HFBackend(model=hooked, tokenizer=tok).generate(reqs, sp)
        assert not calls
        HFBackend(HFBackend.Config(use_cache=False), model=model, tokenizer=tok).generate(
            reqs, SamplingParams(max_new_tokens=4, seed=0))
        assert not calls  # no cache: the model's forward over the whole sequence
        HFBackend(model=model, tokenizer=tok).generate(reqs, sp)
        assert calls
    finally:
        FusedDecoder.step = step


# ------------------------------------------------------------------------------------------------
# Training forward
# ------------------------------------------------------------------------------------------------
def _batch(prompt_lens=(3, 7, 5, 0), group=4, seed=0):
    """Groups (one with an empty prompt) with responses of 1..8 tokens, rows shuffled."""
    from creditlab.rollout import collate
    from creditlab.types import Completion, Problem, Trajectory

    gen = torch.Generator().manual_seed(seed)
    trajs = []
    for g, plen in enumerate(prompt_lens):
        prompt = tuple(torch.randint(5, 60, (plen,), generator=gen).tolist())
        for _ in range(group):
            n = int(torch.randint(1, 9, (1,), generator=gen))
            resp = tuple(torch.randint(5, 60, (n,), generator=gen).tolist())
            completion = Completion(prompt, resp, (0.0,) * n, "eos", "")
            trajs.append(Trajectory(Problem(str(g), "q", "1"), completion, 0.0, g))
    order = torch.randperm(len(trajs), generator=gen).tolist()
    return collate([trajs[i] for i in order], 0)


def _logits_and_grads(model, fn, batch):
    from creditlab.losses import gather_logprobs

    model.zero_grad(set_to_none=True)
    logits = fn()
    lp = gather_logprobs(logits, batch.response_ids)
    weights = torch.linspace(-1.0, 1.0, batch.size)[:, None] * batch.response_mask
    (-(lp * weights).sum() / batch.response_mask.sum()).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shared_prompt_logits_equal_plain_forward_and_gradients(name, monkeypatch):
    import creditlab.forward as fwd
    from creditlab.policy import forward_logits

    model, _ = MODELS[name]()
    model.train()
    batch = _batch()
    p, ids, mask = batch.prompt_len, batch.input_ids, batch.attention_mask
    assert (mask[:, :p] == 0).any() and (mask[:, p:] == 0).any()  # left and right padding
    used = []
    real = fwd.shared_prompt_logits
    monkeypatch.setattr(fwd, "shared_prompt_logits", lambda *a: used.append(1) or real(*a))
    def plain():
        return forward_logits(model, ids, mask)[:, p - 1 : -1].float()

    want, g_want = _logits_and_grads(model, plain, batch)
    got, g_got = _logits_and_grads(model, lambda: fwd.response_logits(model, ids, mask, p), batch)
    shared = name != "llama-dynamic-rope"  # dynamic RoPE: the plain forward, prompts not shared
    assert used == [1] * shared
    unfused, g_unfused = _logits_and_grads(
        model, lambda: fwd.response_logits(model, ids, mask, p, fused=False), batch)
    assert used == [1] * shared
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # pads too
    torch.testing.assert_close(unfused, want, atol=1e-5, rtol=0)
    for a, b in zip(g_want, g_got):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        no_grad = fwd.response_logits(model, ids, mask, p)
        torch.testing.assert_close(no_grad, want, atol=1e-5, rtol=0)


def test_shared_prompt_logits_skip_hooked_models():
    import creditlab.forward as fwd

    model, _ = tiny_model_and_tokenizer(seed=3)
    batch = _batch(seed=1)
    calls = []
    handle = model.model.layers[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        with torch.no_grad():
            fwd.response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
    finally:
        handle.remove()
    assert len(calls) == 2  # the hook ran: the model's own (shared) prompt and response passes
