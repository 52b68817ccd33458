"""creditlab.accel: FusedDecoder's one-token steps equal the model's own forward (Llama, Qwen2; GQA,
biases, tied embeddings, left padding, fused or in-place weights) and HFBackend samples the same
tokens with it on or off; every model it does not reproduce exactly falls back to the model's
forward; ``model.accelerator`` chooses it (auto / none / fused) and the run records the choice."""

from __future__ import annotations

import copy
import warnings

import creditlab.accel as accel
import pytest
import torch
from creditlab.accel import choose
from creditlab.accel.fused_decode import FusedDecoder
from creditlab.backends.hf import HFBackend
from creditlab.backends.kv_cache import make_cache
from creditlab.errors import ConfigError
from creditlab.step.forward import CACHE_KEY, cache_of
from creditlab.types import GenerationRequest, SamplingParams
from packaging.specifiers import SpecifierSet

from tests.helpers import char_tokenizer, tiny_model_and_tokenizer, with_token_bias
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.accel, pytest.mark.numerics]


def _assert_logprobs_alike(a, b, model):
    """Per completion: log-probs within the rounding of one whole sequence's forward."""
    for x, y in zip(a, b):
        n = lm_length(model.config, len(y.prompt_ids) + len(y.response_ids))
        assert_close_fp(torch.tensor(x.logprobs), torch.tensor(y.logprobs), length=n)


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
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                **{CACHE_KEY: cache})
    return cache_of(out), mask, pos[:, -1], out.logits[:, -1]


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
        n = lm_length(model.config, 16)  # the cache's capacity: prompt and steps
        assert_close_fp(ctx_logits[inverse], logits, length=n)
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
                        use_cache=True, **{CACHE_KEY: ref_cache}).logits[:, -1]
            assert_close_fp(dec.step(tok, last), ref, length=n)
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
    off = HFBackend(HFBackend.Config(accelerator="none", **cfg), model=model, tokenizer=tok)
    assert (on.accelerator.path, off.accelerator.path) == ("fused", "none")
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
        _assert_logprobs_alike(a, b, model)
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
# model.accelerator
# ------------------------------------------------------------------------------------------------
def test_the_accelerator_choice_and_its_record(monkeypatch):
    model, tok = tiny_model_and_tokenizer(seed=0)
    assert accel.tested_transformers() is not None, "the accel extra states the tested transformers range"
    assert choose("auto", model).path == "fused" and choose("fused", model).path == "fused"
    assert choose("none", model).record() == {
        "requested": "none", "path": "none", "reason": "model.accelerator=none"}
    backend = HFBackend(HFBackend.Config(accelerator="auto"), model=model, tokenizer=tok)
    assert backend.describe()["accelerator"]["path"] == "fused"
    half = copy.deepcopy(model).to(torch.bfloat16)  # every real preset: bf16
    assert choose("auto", half).path == "none" and "float32" in choose("auto", half).reason
    with pytest.raises(ConfigError, match="model.accelerator=fused: LlamaForCausalLM is not a float32"):
        choose("fused", half)
    with pytest.raises(ConfigError, match="model.accelerator must be one of auto, none, fused, compile"):
        choose("fast", model)
    monkeypatch.setattr(accel, "tested_transformers", lambda: SpecifierSet("<1"))
    assert choose("auto", model).path == "none" and "outside the tested range" in choose("auto", model).reason
    with pytest.raises(ConfigError, match="outside the tested range <1"):
        choose("fused", model)


def test_compile_wraps_the_forward_and_keeps_the_parameters(monkeypatch):
    """``model.accelerator=compile``: the loader compiles ``model.forward`` (dynamic shapes) and
    nothing else; the backend then decodes through that forward, not the fused steps."""
    import torch
    from creditlab.accel import compile_model

    model, tok = tiny_model_and_tokenizer(seed=0)
    names = [n for n, _ in model.named_parameters()]
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    assert compile_model(model, "none") is model and seen == []
    assert compile_model(model, "compile") is model and seen == [{"dynamic": True}]
    assert [n for n, _ in model.named_parameters()] == names
    assert choose("compile", model).path == "compile"
    assert HFBackend(HFBackend.Config(accelerator="compile"), model=model, tokenizer=tok).describe() == {
        "accelerator": {"requested": "compile", "path": "compile", "reason": "torch.compile(model.forward, dynamic=True)"}}


@pytest.mark.parametrize("name", ["llama-gqa", "llama-head-bias", "qwen2-tied", "qwen2-mqa"])
def test_bfloat16_steps_are_close_to_float32(name):
    """dtype=bfloat16: the products run from bfloat16 weight copies (LM head included); the
    logits stay within bfloat16 rounding of the float32 model's, and differ from them."""
    model, _ = MODELS[name]()
    rows = LAYOUTS["ragged-shuffled"]
    distinct = list(dict.fromkeys(rows))
    inverse = torch.tensor([distinct.index(c) for c in rows])
    with torch.inference_mode():
        assert FusedDecoder.build(model, copy_budget_mb=0.0, dtype=torch.bfloat16) is None
        dec = FusedDecoder.build(model, dtype=torch.bfloat16)
        assert dec.layers[0].w_qkv.dtype == dec.head_weight.dtype == torch.bfloat16
        ref_cache, mask, last, logits = _prefill(model, rows, capacity=16)
        ctx_cache, ctx_mask, _, _ = _prefill(model, distinct, capacity=16)
        dec.start(ctx_cache, inverse, ctx_mask.bool(), max_new=6, min_shared_context=0)
        worst = 0.0
        for _ in range(6):
            tok = logits.argmax(-1)
            last = last + 1
            mask = torch.cat([mask, mask.new_ones(len(last), 1)], dim=1)
            ref = model(input_ids=tok[:, None], attention_mask=mask, position_ids=last[:, None],
                        use_cache=True, **{CACHE_KEY: ref_cache}).logits[:, -1]
            got = dec.step(tok, last)
            assert got.dtype == torch.float32
            worst = max(worst, float((got - ref).abs().max() / ref.abs().max()))
            logits = ref
    assert 0 < worst < 0.03, worst


@pytest.mark.parametrize("accelerator", ["auto", "none"])
def test_backend_dtype_bfloat16_samples_close_to_float32(accelerator):
    """backend.dtype=bfloat16 through the fused steps or, for the model's own forward, autocast:
    greedy log-probs within bfloat16 rounding of float32's; float16 is refused by name."""
    model, tok = MODELS["llama-gqa"]()
    reqs = _requests(tok)
    sp = SamplingParams(temperature=0.0, max_new_tokens=10)
    fp32 = HFBackend(HFBackend.Config(accelerator=accelerator), model=model, tokenizer=tok)
    bf16 = HFBackend(HFBackend.Config(accelerator=accelerator, dtype="bfloat16"), model=model,
                     tokenizer=tok)
    assert (fp32.dtype, bf16.dtype) == (torch.float32, torch.bfloat16)
    a, b = fp32.generate(reqs, sp), bf16.generate(reqs, sp)
    diffs = [abs(x - y) for ca, cb in zip(a, b) if ca.response_ids == cb.response_ids
             for x, y in zip(ca.logprobs, cb.logprobs)]
    assert len(diffs) >= 5 * 10  # most rows take the same greedy path
    assert 0 < max(diffs) < 0.05
    with pytest.raises(ConfigError, match="backend.dtype must be auto, float32 or bfloat16"):
        HFBackend.Config(dtype="float16")


def _lora(name: str, targets="all-linear"):
    """``MODELS[name]`` under peft LoRA adapters with nonzero B (so that they matter)."""
    from creditlab.run.models import LoraConfig, apply_lora

    model, tok = MODELS[name]()
    model = apply_lora(model, LoraConfig(enabled=True, r=4, alpha=8, target_modules=targets))
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    return model.eval(), tok


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-tied"])
def test_lora_model_decodes_with_fused_steps(name, monkeypatch):
    """A peft LoRA model is supported: its fused steps run from W + scaling·B·A and sample the
    same tokens as its own (peft) forward; adapters off, a merged adapter, or DoRA fall back."""
    pytest.importorskip("peft")
    model, tok = _lora(name)
    assert accel.supported(model) and choose("auto", model).path == "fused"
    calls = []
    step = FusedDecoder.step
    monkeypatch.setattr(FusedDecoder, "step", lambda self, *a: calls.append(1) or step(self, *a))
    reqs = _requests(tok)
    on = HFBackend(HFBackend.Config(), model=model, tokenizer=tok)
    off = HFBackend(HFBackend.Config(accelerator="none"), model=model, tokenizer=tok)
    for sp in (SamplingParams(temperature=1.0, max_new_tokens=12, seed=3),
               SamplingParams(temperature=0.0, max_new_tokens=12)):
        a = on.generate(reqs, sp)
        assert calls
        b = off.generate(reqs, sp)
        assert [c.response_ids for c in a] == [c.response_ids for c in b]
        _assert_logprobs_alike(a, b, model)
    plain, _ = MODELS[name]()  # the adapters change the samples: they were really used
    assert [c.response_ids for c in HFBackend(model=plain, tokenizer=tok).generate(reqs, sp)] != [
        c.response_ids for c in a]
    with torch.inference_mode():
        assert FusedDecoder.build(model, copy_budget_mb=0.0) is None  # LoRA needs the copies
    merged = copy.deepcopy(model)
    merged.base_model.model.model.layers[0].self_attn.q_proj.merge()
    assert not accel.supported(merged)
    dora, _ = _lora_dora(name)
    assert not accel.supported(dora)


def _lora_dora(name: str):
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    model, tok = MODELS[name]()
    cfg = PeftLoraConfig(r=4, lora_alpha=8, use_dora=True, target_modules=["q_proj", "v_proj"])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        return get_peft_model(model, cfg).eval(), tok


def test_compile_keeps_inductors_cache_per_cpu_capability(monkeypatch, tmp_path):
    """torch 2.13 reuses inductor code across ATEN_CPU_CAPABILITY values (a kernel cached under
    AVX2 did not build under the baseline): compile mode moves torch's default cache folder to one
    per capability, and leaves a folder the user chose alone."""
    import getpass
    import os
    import tempfile

    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic: compiled.append(fn) or fn)
    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)  # what importing torch sets
    model, _ = tiny_model_and_tokenizer()
    assert accel.compile_model(model, "none") is model and not compiled
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default
    accel.compile_model(model, "compile")
    assert compiled and os.environ["TORCHINDUCTOR_CACHE_DIR"] == f"{default}_{torch.backends.cpu.get_cpu_capability().lower()}"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    accel.compile_model(tiny_model_and_tokenizer()[0], "compile")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)
