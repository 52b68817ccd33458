"""HFBackend: exact sampling settings, seeded determinism, logprobs = trainer's, stops, EOS,
prefix continuation and padding invariance (TESTING traps 4, 5, 7)."""

from __future__ import annotations

import copy

import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.backends.sampling import SamplingPlan, inverse_cdf, sample_tokens
from creditlab.errors import ConfigError
from creditlab.types import GenerationRequest, SamplingParams

from tests.helpers import THOUGHT, tiny_model_and_tokenizer, with_token_bias
from tests.numerics import approx_fp, assert_close_fp, lm_length

PROMPTS = ["1+2=", "hello world, how are", "x", "abc def ghi jkl mno", "Q: 17*3?"]


pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


@pytest.fixture(scope="module")
def mt():
    return tiny_model_and_tokenizer(seed=0)


@pytest.fixture(scope="module")
def backend(mt):
    model, tok = mt
    return HFBackend(model=model, tokenizer=tok)


def _reqs(tok, prompts=PROMPTS, prefixes=None):
    prefixes = prefixes or [()] * len(prompts)
    return [
        GenerationRequest(tuple(tok.encode(p, add_special_tokens=False)), tuple(x))
        for p, x in zip(prompts, prefixes)
    ]


def _teacher_logprobs(model, prompt_ids, response_ids, temperature=1.0):
    """(R, V) log_softmax(logits / T) predicting each response token, from a plain forward."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    p = len(prompt_ids)
    return torch.log_softmax(logits[p - 1 : -1] / temperature, -1)


def _greedy(backend, reqs, n=24, **kw):
    return backend.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=n, **kw))


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-0.1),
        dict(temperature=float("nan")),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(max_new_tokens=-3),
        dict(stop="</thought>"),
        dict(stop=("",)),
        dict(seed=1.5),
    ],
)
def test_invalid_sampling_params_raise(backend, mt, bad):
    with pytest.raises(ValueError):
        backend.generate(_reqs(mt[1])[:1], SamplingParams(**bad))


def test_empty_request_raises_and_no_requests_is_empty(backend):
    assert backend.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="neither"):
        backend.generate([GenerationRequest(())], SamplingParams())


def test_seeded_determinism_and_effective_settings(backend, mt):
    reqs = _reqs(mt[1])
    sp = SamplingParams(temperature=1.0, top_p=0.9, top_k=30, max_new_tokens=16, seed=3)
    a, b = backend.generate(reqs, sp), backend.generate(reqs, sp)
    assert a == b
    eff = backend.last_effective
    assert (eff["temperature"], eff["top_p"], eff["top_k"], eff["seed"]) == (1.0, 0.9, 30, 3)
    c = backend.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=16, seed=4))
    assert [x.response_ids for x in a] != [x.response_ids for x in c]
    backend.generate(reqs, SamplingParams(max_new_tokens=2))  # seed None: a fresh seed
    assert isinstance(backend.last_effective["seed"], int)


def test_greedy_is_teacher_forced_argmax_and_logprobs_match(backend, mt):
    model, tok = mt
    for c in _greedy(backend, _reqs(tok)):
        lp = _teacher_logprobs(model, c.prompt_ids, c.response_ids)
        assert lp.argmax(-1).tolist() == list(c.response_ids)
        got = torch.tensor(c.logprobs)
        want = lp.gather(1, torch.tensor(c.response_ids)[:, None]).squeeze(1)
        n = _length(model, c)
        assert_close_fp(got, want, length=n)
        ent = -(lp.exp() * lp).sum(-1)  # greedy: the entropy at T = 1
        assert_close_fp(torch.tensor(c.entropies), ent, length=n)


def test_sampled_logprobs_equal_teacher_forced_at_temperature(backend, mt):
    """Trap 4: log_softmax(logits / T) before truncation, for sampled and prefixed rows."""
    model, tok = mt
    prefixes = [(), tok.encode("ab", add_special_tokens=False), (), (7, 8, 9, 10), ()]
    reqs = _reqs(tok, prefixes=prefixes)
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=20, seed=11)
    for r, c in zip(reqs, backend.generate(reqs, sp)):
        assert c.response_ids[: c.prefix_len] == r.prefix_ids
        new = c.response_ids[c.prefix_len :]
        lp = _teacher_logprobs(model, r.prompt_ids, c.response_ids, 0.7)[c.prefix_len :]
        want = lp.gather(1, torch.tensor(new)[:, None]).squeeze(1)
        n = _length(model, c)
        assert_close_fp(torch.tensor(c.logprobs), want, length=n)
        ent = -(lp.exp() * lp).sum(-1)  # entropies: at T, before truncation, generated tokens
        assert len(c.entropies) == len(new)
        assert_close_fp(torch.tensor(c.entropies), ent, length=n)


def test_sampled_tokens_stay_in_top_k_and_top_p_sets(backend, mt):
    model, tok = mt
    reqs = _reqs(tok)
    for top_k, top_p in [(3, 1.0), (0, 0.5), (5, 0.6)]:
        sp = SamplingParams(temperature=1.3, top_k=top_k, top_p=top_p, max_new_tokens=24, seed=5)
        for c in backend.generate(reqs, sp):
            probs = _teacher_logprobs(model, c.prompt_ids, c.response_ids, 1.3).exp()
            for t, row in zip(c.response_ids, probs):
                order = row.argsort(descending=True)
                allowed = order[: top_k or len(order)]
                kept = row[allowed] / row[allowed].sum()
                mass_before = kept.cumsum(0) - kept
                allowed = allowed[mass_before < top_p + 1e-5]
                assert t in allowed.tolist()


def test_top_k_1_and_tiny_top_p_equal_greedy(backend, mt):
    reqs = _reqs(mt[1])
    greedy = [c.response_ids for c in _greedy(backend, reqs)]
    for kw in (dict(top_k=1), dict(top_p=1e-6)):
        sp = SamplingParams(temperature=1.5, max_new_tokens=24, seed=2, **kw)
        out = backend.generate(reqs, sp)
        assert [c.response_ids for c in out] == greedy


def test_sample_tokens_truncation_order_and_frequencies():
    """Crafted logits: exact supports of top-k then top-p, and frequencies without truncation."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20000, 4).contiguous()
    gen = torch.Generator().manual_seed(0)

    def draw(top_k=0, top_p=1.0):
        plan = SamplingPlan(1.0, top_p, top_k, 1, (), 0, None, 0, ())
        tok, lp, ent = sample_tokens(logits, plan, torch.rand(len(logits), generator=gen,
                                                              dtype=torch.float64))
        assert torch.allclose(lp, probs.log()[tok], atol=1e-6)  # before truncation
        assert torch.allclose(ent, -(probs * probs.log()).sum().expand(len(tok)), atol=1e-6)
        return torch.bincount(tok, minlength=4)

    assert (draw(top_p=0.75)[2:] == 0).all() and (draw(top_p=0.75)[:2] > 0).all()
    assert (draw(top_k=2)[2:] == 0).all()
    assert draw(top_k=2, top_p=0.6)[1:].sum() == 0  # top-p on the renormalised top-2 (0.625)
    freq = draw().double() / 20000
    assert torch.allclose(freq, probs.double(), atol=0.015)  # ~5 sigma, seeded


def test_inverse_cdf_never_draws_a_zero_weight_and_spans_the_row():
    """Uniforms at 0 and just below 1 land on the first and last token of positive weight;
    tokens of weight 0 (before, between and after) are never drawn, and unnormalised weights
    are drawn in proportion."""
    weights = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0]] * 4)
    u = torch.tensor([0.0, 0.5 - 1e-12, 0.5, 1 - 2**-53], dtype=torch.float64)
    assert inverse_cdf(weights, u).tolist() == [1, 1, 3, 4]
    gen = torch.Generator().manual_seed(3)
    many = weights[:1].expand(40000, 6)
    counts = torch.bincount(inverse_cdf(many, torch.rand(40000, generator=gen, dtype=torch.float64)),
                            minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    assert torch.allclose(counts[[1, 3, 4]] / 40000.0, torch.tensor([0.5, 0.25, 0.25]), atol=0.01)
    with pytest.raises(ValueError, match="uniform"):
        sample_tokens(weights, SamplingPlan(1.0, 1.0, 0, 1, (), 0, None, 0, ()), None)


def test_multinomial_sampler_is_torch_multinomial_bit_for_bit():
    """backend.sampler=multinomial keeps the draws (and entropies) of runs before issue 40."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    plan = SamplingPlan(1.0, 1.0, 0, 1, (), 0, None, 0, ())
    tok, lp, ent = sample_tokens(logits, plan, torch.Generator().manual_seed(4))
    logp = torch.log_softmax(logits, -1)
    ref = torch.multinomial(logp.exp(), 1, generator=torch.Generator().manual_seed(4)).squeeze(1)
    assert torch.equal(tok, ref) and torch.equal(lp, logp.gather(1, ref[:, None]).squeeze(1))
    assert torch.equal(ent, -(logp.exp() * logp).sum(-1))
    with pytest.raises(ConfigError, match="backend.sampler must be inverse_cdf or multinomial"):
        HFBackend.Config(sampler="gumbel")


def test_generation_config_cannot_change_sampling(mt):
    """Trap 7: a stored top_k=50 / temperature=0.1 / penalties are ignored by our loop."""
    model, tok = mt
    odd = copy.deepcopy(model)
    gc = odd.generation_config
    gc.do_sample, gc.top_k, gc.temperature, gc.top_p = True, 50, 0.1, 0.3
    gc.repetition_penalty, gc.eos_token_id = 2.0, [1, 5]
    reqs = _reqs(tok)
    sp = SamplingParams(temperature=1.0, max_new_tokens=20, seed=9)
    a = HFBackend(model=model, tokenizer=tok).generate(reqs, sp)
    b_backend = HFBackend(model=odd, tokenizer=tok)
    b = b_backend.generate(reqs, sp)
    assert a == b
    assert b_backend.last_effective["top_k"] == 0 and b_backend.last_effective["temperature"] == 1.0


def test_single_token_stop_strings_end_rows_and_are_kept(mt):
    model, tok = mt
    thought = tok.convert_tokens_to_ids(THOUGHT)
    biased = with_token_bias(model, {thought: 1.0})
    be = HFBackend(model=biased, tokenizer=tok)
    reqs = _reqs(tok)
    free = _greedy(be, reqs, n=40)
    stopped = _greedy(be, reqs, n=40, stop=(THOUGHT,))
    assert be.last_effective["stop_token_ids"] == (thought,)
    n_hits = 0
    for f, s in zip(free, stopped):
        if thought in f.response_ids:
            n_hits += 1
            cut = f.response_ids.index(thought) + 1
            assert s.response_ids == f.response_ids[:cut] and s.finish_reason == "stop"
            assert s.text.endswith(THOUGHT) and len(s.logprobs) == cut
        else:
            assert s.response_ids == f.response_ids
    assert n_hits >= 2


def _chars_only(model):
    """The model with special tokens (ids 0-4) suppressed: one character per generated token."""
    return with_token_bias(model, {i: -1e4 for i in range(5)})


def test_multi_char_and_char_stop_strings(mt):
    model, tok = mt
    backend = HFBackend(model=_chars_only(model), tokenizer=tok)
    reqs = _reqs(tok)[:3]
    free = _greedy(backend, reqs, n=14)
    for f in free:
        text = tok.decode(f.response_ids)
        for stop in (text[6], text[6:8], text[5:9]):  # one char = one token; 2 and 4 chars
            [s] = _greedy(backend, [GenerationRequest(f.prompt_ids)], n=14, stop=(stop, "§§"))
            end = text.index(stop) + len(stop)
            assert s.text == text[:end] and s.finish_reason == "stop"
            assert s.response_ids == f.response_ids[:end]  # char tokenizer: 1 char per token


def test_stop_string_in_prefix_does_not_count(mt):
    """Stop strings are matched in the generated text only (as vLLM does)."""
    model, tok = mt
    backend = HFBackend(model=_chars_only(model), tokenizer=tok)
    checked = 0
    for f in _greedy(backend, _reqs(tok)[:3], n=16):
        text = tok.decode(f.response_ids)
        in_prefix = {text[i : i + 2] for i in range(4)}
        for stop in sorted(in_prefix - {text[i : i + 2] for i in range(5, 15)})[:2]:
            req = GenerationRequest(f.prompt_ids, f.response_ids[:5])  # the prefix holds `stop`
            [s] = _greedy(backend, [req], n=11, stop=(stop,))
            assert s.response_ids == f.response_ids and s.finish_reason == "length"
            checked += 1
    assert checked >= 3


def test_eos_ends_rows_and_is_kept_and_compaction_is_invariant(mt):
    model, tok = mt
    biased = with_token_bias(model, {tok.eos_token_id: 1.2})
    reqs = _reqs(tok)
    runs = [
        HFBackend(HFBackend.Config(compact_fraction=f), model=biased, tokenizer=tok).generate(
            reqs, SamplingParams(temperature=0.0, max_new_tokens=30)
        )
        for f in (0.0, 1.0)
    ]
    # Same tokens and ends; log-probs equal up to float rounding (compaction changes the batch
    # shape of the matrix products, which may change the last bits).
    for a, b in zip(*runs):
        assert (a.response_ids, a.finish_reason, a.text) == (b.response_ids, b.finish_reason, b.text)
        assert a.logprobs == approx_fp(b.logprobs, length=_length(model, b))
    ends = [c for c in runs[0] if c.finish_reason == "eos"]
    assert 2 <= len(ends) < len(reqs)  # some rows end early, others keep going
    for c in ends:
        assert c.response_ids[-1] == tok.eos_token_id
        assert tok.eos_token_id not in c.response_ids[:-1]
        assert "<eos>" not in c.text and len(c.logprobs) == len(c.response_ids)
    singles = [
        HFBackend(model=biased, tokenizer=tok).generate([r], SamplingParams(0.0, max_new_tokens=30))
        for r in reqs
    ]
    assert [s[0].response_ids for s in singles] == [c.response_ids for c in runs[0]]


@pytest.mark.parametrize("accelerator", ["auto", "none"])
def test_sampled_rows_do_not_depend_on_when_finished_rows_are_dropped(mt, accelerator):
    """Each row's draws come from its own uniforms: dropping finished rows at every look, at a
    quarter, or never gives the same samples (log-probs up to float rounding)."""
    model, tok = mt
    biased = with_token_bias(model, {tok.eos_token_id: 1.2})
    reqs = _reqs(tok) * 2
    sp = SamplingParams(temperature=1.0, top_k=30, max_new_tokens=30, seed=11)
    runs = [
        HFBackend(HFBackend.Config(compact_fraction=f, accelerator=accelerator), model=biased,
                  tokenizer=tok).generate(reqs, sp)
        for f in (0.0, 0.25, 1.0)
    ]
    ends = {c.finish_reason for c in runs[0]}
    assert ends == {"eos", "length"}, ends  # rows end at different steps: compaction happens
    for other in runs[1:]:
        _assert_same_samples(runs[0], other, model)


@pytest.mark.parametrize("accelerator", ["auto", "none"])
def test_prefill_tokens_count_each_distinct_context_once(mt, accelerator):
    """``metrics()["prefill_tokens"]``: the contexts' tokens run through the prefill, each
    distinct context once when the prefill is shared, every row's otherwise."""
    model, tok = mt
    reqs = _grouped_reqs(tok)
    contexts = [tuple(r.prompt_ids) + tuple(r.prefix_ids) for r in reqs]
    assert len(set(contexts)) < len(contexts)
    sp = SamplingParams(temperature=1.0, max_new_tokens=4, seed=1)
    for share, expect in ((True, sum(map(len, set(contexts)))), (False, sum(map(len, contexts)))):
        be = HFBackend(HFBackend.Config(share_prefill=share, accelerator=accelerator, prefix_cache_mb=0),
                       model=model, tokenizer=tok)  # no reuse of stored rows (test_prefix_store.py)
        be.generate(reqs, sp)
        be.generate(reqs[:1], sp)
        assert float(be.metrics()["prefill_tokens"]) == expect + len(contexts[0])
        assert float(be.metrics()["prefill_tokens"]) == 0  # reset by the call before


def test_max_new_tokens_gives_length(backend, mt):
    reqs = _reqs(mt[1])
    for c in _greedy(backend, reqs, n=7):
        assert c.finish_reason == "length" and len(c.response_ids) == 7 == len(c.logprobs)
    prefixed = [GenerationRequest(reqs[0].prompt_ids, (5, 6))]
    [c] = backend.generate(prefixed, SamplingParams(max_new_tokens=0))
    assert c.response_ids == (5, 6) and c.logprobs == () and c.finish_reason == "length"


def test_prefix_continuation_reproduces_uninterrupted_greedy_run(backend, mt):
    """Trap 5: prefix ids + continuation ids == the original ids."""
    reqs = _reqs(mt[1])
    full = _greedy(backend, reqs, n=30)
    for k in (1, 12, 29):
        cut = [GenerationRequest(r.prompt_ids, f.response_ids[:k]) for r, f in zip(reqs, full)]
        resumed = _greedy(backend, cut, n=30 - k)
        for f, c in zip(full, resumed):
            assert c.prefix_len == k and c.response_ids[:k] == f.response_ids[:k]
            assert c.response_ids == f.response_ids
            assert_close_fp(torch.tensor(c.logprobs), torch.tensor(f.logprobs[k:]), length=_length(mt[0], f))


def test_mixed_batch_equals_rows_alone(mt):
    """Padding invariance over prompt and prefix lengths, batch chunking and cache variants."""
    model, tok = mt
    prefixes = [(), (20, 21, 22, 23, 24, 25, 26), (30,), (), (40, 41, 42)]
    reqs = _reqs(tok, prefixes=prefixes)
    sp = SamplingParams(temperature=0.0, max_new_tokens=12)
    ref = HFBackend(model=model, tokenizer=tok)
    alone = [ref.generate([r], sp)[0] for r in reqs]
    for cfg in (
        HFBackend.Config(),
        HFBackend.Config(max_batch_size=2),
        HFBackend.Config(preallocate_kv=False),
        HFBackend.Config(use_cache=False),
    ):
        batch = HFBackend(cfg, model=model, tokenizer=tok).generate(reqs, sp)
        assert [c.response_ids for c in batch] == [c.response_ids for c in alone], cfg
        for a, b in zip(alone, batch):
            assert_close_fp(torch.tensor(a.logprobs), torch.tensor(b.logprobs), length=_length(model, b))


def test_train_mode_restored_and_load_weights(mt):
    model, tok = mt
    model = copy.deepcopy(model)
    model.train()
    model.model.layers[0].eval()  # a mixed state must come back exactly
    be = HFBackend(model=model, tokenizer=tok)
    reqs = _reqs(tok)[:2]
    before = _greedy(be, reqs, n=8)
    assert model.training and not model.model.layers[0].training and model.model.layers[1].training
    be.load_weights(None)
    assert _greedy(be, reqs, n=8) == before
    other, _ = tiny_model_and_tokenizer(seed=1)
    be.load_weights(other.state_dict())
    assert [c.response_ids for c in _greedy(be, reqs, n=8)] == [
        c.response_ids for c in _greedy(HFBackend(model=other, tokenizer=tok), reqs, n=8)
    ]
    metrics = be.metrics()
    assert metrics["tokens"] > 0 and metrics["tokens_per_s"] > 0


def test_prompt_longer_than_context_is_a_clear_error():
    from creditlab.backends.hf import HFBackend
    from creditlab.types import GenerationRequest, SamplingParams

    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    backend = HFBackend(model=model, tokenizer=tok)
    context = model.config.max_position_embeddings
    req = GenerationRequest(tuple([5] * context))
    with pytest.raises(ValueError, match="exceeds the model's context of"):
        backend.generate([req], SamplingParams(max_new_tokens=4, seed=0))


def _grouped_reqs(tok, group=4):
    """Repeated contexts: prompts x group, the same prompt with two prefixes, one lone row."""
    base = _reqs(tok, PROMPTS[:3])
    reqs = [r for r in base for _ in range(group)]
    reqs += [GenerationRequest(base[0].prompt_ids, (20, 21))] * 2  # same prompt, a prefix
    reqs += [GenerationRequest(base[0].prompt_ids, (20,)), GenerationRequest((), (7, 8, 9))]
    order = torch.randperm(len(reqs), generator=torch.Generator().manual_seed(0)).tolist()
    return [reqs[i] for i in order]


def _prefill_rows(model):
    """A list that records the batch size of every forward with more than one column."""
    rows = []

    def hook(module, args, kwargs, out):
        if kwargs["input_ids"].shape[1] > 1:
            rows.append(kwargs["input_ids"].shape[0])

    return rows, model.register_forward_hook(hook, with_kwargs=True)


def _length(model, completion):
    """Rounded terms behind one log-prob or entropy of ``completion`` (its whole sequence)."""
    return lm_length(model.config, len(completion.prompt_ids) + len(completion.response_ids))


def _assert_same_samples(a, b, model):
    """The same tokens and ends; log-probs within rounding (another batch shape or cache)."""
    assert [c.response_ids for c in a] == [c.response_ids for c in b]
    assert [c.finish_reason for c in a] == [c.finish_reason for c in b]
    for x, y in zip(a, b):
        assert_close_fp(torch.tensor(x.logprobs), torch.tensor(y.logprobs), length=_length(model, y))


@pytest.mark.parametrize(
    "cfg",
    [dict(), dict(preallocate_kv=False), dict(max_batch_size=5), dict(compact_fraction=0.0)],
)
def test_shared_prefill_samples_like_per_row_prefill(mt, cfg):
    """Each distinct context prefilled once: the same tokens (same RNG draws) as without sharing."""
    model, tok = mt
    biased = with_token_bias(model, {tok.eos_token_id: 1.0})  # rows end at different steps
    reqs = _grouped_reqs(tok)
    on = HFBackend(HFBackend.Config(**cfg), model=biased, tokenizer=tok)
    off = HFBackend(HFBackend.Config(share_prefill=False, **cfg), model=biased, tokenizer=tok)
    rows, hook = _prefill_rows(biased)
    results = []
    try:
        for sp in (
            SamplingParams(temperature=1.0, max_new_tokens=12, seed=5),
            SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=12, seed=6),
            SamplingParams(temperature=0.0, max_new_tokens=12),
        ):
            rows.clear()
            a = on.generate(reqs, sp)
            shared_rows = list(rows)
            rows.clear()
            b = off.generate(reqs, sp)
            _assert_same_samples(a, b, model)
            assert sum(shared_rows) < sum(rows) == len(reqs)
            results.append(a)
    finally:
        hook.remove()
    if not cfg:
        assert shared_rows == [6]  # 3 prompts + 1 prompt with each of 2 prefixes + 1 prefix only
    assert len({c.response_ids for c in results[0]}) > 6  # rows sharing a context still differ


def test_shared_prefill_with_sliding_window_cache():
    """A sliding-window model (``DynamicSlidingWindowLayer`` cache, rows gathered) samples alike."""
    from transformers import MistralConfig, MistralForCausalLM

    from tests.helpers import char_tokenizer

    tok = char_tokenizer()
    torch.manual_seed(0)
    cfg = MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=6, pad_token_id=0,
        eos_token_id=tok.eos_token_id,
    )
    model = MistralForCausalLM(cfg).eval()
    reqs = _grouped_reqs(tok, group=2)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=1)
    rows, hook = _prefill_rows(model)
    try:
        a = HFBackend(model=model, tokenizer=tok).generate(reqs, sp)
        assert rows == [6]
    finally:
        hook.remove()
    off = HFBackend(HFBackend.Config(share_prefill=False), model=model, tokenizer=tok)
    _assert_same_samples(a, off.generate(reqs, sp), model)


def test_shared_prefill_off_for_other_cache_layers(mt, monkeypatch):
    """A cache layer with possibly more per-row state than keys/values: every row is prefilled."""
    from transformers.cache_utils import DynamicLayer

    class OtherLayer(DynamicLayer):
        pass

    import creditlab.backends.hf as hf

    model, tok = mt
    be = HFBackend(model=model, tokenizer=tok)
    make = hf.make_cache

    def make_cache(model, capacity, preallocate=True):
        cache = make(model, capacity, preallocate)
        cache.layers = [OtherLayer() for _ in cache.layers]
        return cache

    monkeypatch.setattr(hf, "make_cache", make_cache)
    reqs = _grouped_reqs(tok, group=2)
    sp = SamplingParams(temperature=1.0, max_new_tokens=8, seed=2)
    rows, hook = _prefill_rows(model)
    try:
        a = be.generate(reqs, sp)
        assert rows == [len(reqs)]
    finally:
        hook.remove()
    _assert_same_samples(a, HFBackend(model=model, tokenizer=tok).generate(reqs, sp), model)


def test_topk_entropy_exact_on_the_head_and_a_lower_bound_on_the_tail():
    """The vLLM backend's entropy from top-k log-probs (no vLLM needed: entries are plain)."""
    from types import SimpleNamespace

    from creditlab.backends.vllm_params import topk_entropy

    probs = torch.tensor([0.4, 0.3, 0.1, 0.1, 0.05, 0.05])
    exact = float(-(probs * probs.log()).sum())
    entries = {i: SimpleNamespace(logprob=float(p.log()), rank=i + 1) for i, p in enumerate(probs)}
    assert topk_entropy(entries, -1) == pytest.approx(exact, abs=1e-6)
    assert topk_entropy(entries, 6) == pytest.approx(exact, abs=1e-6)
    # top 2 + the tail mass 0.3 at -log p_2 = -log 0.3 nats each
    head = float(-(probs[:2] * probs[:2].log()).sum())
    assert topk_entropy(entries, 2) == pytest.approx(head + 0.3 * -float(probs[1].log()), abs=1e-6)
    assert topk_entropy(entries, 2) <= exact
    sampled = {**{i: entries[i] for i in range(2)}, 5: entries[5]}  # vLLM adds the sampled token
    assert topk_entropy(sampled, 2) == topk_entropy(entries, 2)


def test_vllm_weight_sync_settings_are_checked_before_vllm_is_needed():
    """``backend.weight_sync`` is validated by name (no vLLM needed), and ``memory`` is refused
    for an engine of several workers, whose workers live in other processes."""
    from creditlab.backends.vllm import VLLMBackend
    from creditlab.run.config import vllm_weight_sync, vllm_workers

    assert vllm_workers({}) == 1
    assert vllm_workers({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert [vllm_weight_sync("auto", {}), vllm_weight_sync("auto", {"tensor_parallel_size": 2})] == ["memory", "file"]
    with pytest.raises(ConfigError, match="backend.weight_sync must be one of auto, memory, file, got 'disk'"):
        VLLMBackend.Config(weight_sync="disk")
    with pytest.raises(ConfigError, match="weight_sync=memory needs an engine of one worker"):
        VLLMBackend.Config(weight_sync="memory", engine_kwargs={"tensor_parallel_size": 2})
