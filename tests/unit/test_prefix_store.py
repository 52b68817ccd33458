"""The HF backend's prefix store (backends/prefix_store.py): thought-by-thought generation, resets
and continuations prefill only what no decoded row already holds, and sample what they sampled
without it; a second call on the same prompts, or on changed weights, reuses nothing."""

from __future__ import annotations

import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.backends.prefix_store import PrefixStore
from creditlab.step.generation import ThoughtConfig, generate_thoughts
from creditlab.types import GenerationRequest, SamplingParams

from tests.helpers import THOUGHT, tiny_model_and_tokenizer, with_token_bias
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _kv(length: int) -> torch.Tensor:
    return torch.arange(float(length)).expand(2, 2, 1, length).unsqueeze(-1).contiguous()


def test_match_takes_the_longest_continuation_within_reach():
    store = PrefixStore(budget_mb=1.0)
    store.add((1, 2, 3, 4, 5), 2, _kv(4))  # context (1, 2), response (3, 4, 5)
    store.add((1, 2, 9, 9), 2, _kv(3))
    store.add((7, 7), 2, _kv(1))  # nothing generated: not kept
    assert len(store.entries) == 2
    got = store.match([(1, 2, 3, 4, 5, 6), (1, 2, 3, 4, 5), (1, 2, 3), (1, 2), (1, 2, 9, 8), (5,)])
    assert [n for n, _ in got] == [4, 4, 2, 0, 3, 0]  # all but the last token; >= the context
    assert got[4][1].tokens == (1, 2, 9, 9)
    small = PrefixStore(budget_mb=(_kv(4).numel() * 4 + 1) / 2**20)
    small.add((1, 2, 3, 4, 5), 2, _kv(4))
    small.add((1, 2, 3, 4, 6), 2, _kv(4))  # the oldest leaves
    assert [e.tokens for e in small.entries] == [(1, 2, 3, 4, 6)] and small.bytes == _kv(4).numel() * 4


def _alike(a, b, model) -> None:
    """Completions with and without the store: the same tokens, log-probs within rounding (the
    stored keys/values were computed in another batch shape)."""
    assert [c.response_ids for c in a] == [c.response_ids for c in b]
    for x, y in zip(a, b):
        n = lm_length(model.config, len(y.prompt_ids) + len(y.response_ids))
        assert_close_fp(torch.tensor(x.logprobs), torch.tensor(y.logprobs), length=n)


def _backend(store_mb: float, model, tok):
    return HFBackend(HFBackend.Config(prefix_cache_mb=store_mb), model=model, tokenizer=tok)


@pytest.fixture(scope="module")
def mt():
    model, tok = tiny_model_and_tokenizer(seed=3)
    return with_token_bias(model, {tok.convert_tokens_to_ids(THOUGHT): 2.5}), tok


def test_thoughts_prefill_only_the_prompts_and_sample_alike(mt):
    model, tok = mt
    prompts = [tuple(tok.encode(p, add_special_tokens=False)) for p in ("1+2=", "hello there, ", "Q: 7*6?")]
    reqs = [GenerationRequest(p) for p in prompts for _ in range(3)]
    cfg = ThoughtConfig(max_thoughts=4, max_thought_tokens=6)
    sp = SamplingParams(temperature=1.0, seed=4)
    on, off = _backend(64.0, model, tok), _backend(0.0, model, tok)
    a = generate_thoughts(on, reqs, sp, cfg)
    b = generate_thoughts(off, reqs, sp, cfg)
    _alike(a, b, model)
    assert [c.segment_ids for c in a] == [c.segment_ids for c in b]
    rounds = [len(set(c.segment_ids)) for c in a]
    assert max(rounds) >= 3, rounds  # several thoughts: later rounds continue stored rows
    with_store, without = on.metrics()["prefill_tokens"], off.metrics()["prefill_tokens"]
    # round 1 prefills the prompts (once each: the rows share them); every later round continues
    # stored rows, feeding each row's one new token as a decoding step: nothing more is prefilled
    assert with_store == sum(map(len, prompts)) < without / 2


def test_resets_continue_stored_rows_and_changed_weights_reuse_nothing(mt):
    model, tok = mt
    prompt = tuple(tok.encode("ab", add_special_tokens=False))
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=1)
    on, off = _backend(64.0, model, tok), _backend(0.0, model, tok)
    first = on.generate([GenerationRequest(prompt)] * 4, sp)
    assert [c.response_ids for c in first] == [c.response_ids for c in off.generate([GenerationRequest(prompt)] * 4, sp)]
    on.metrics()
    again = on.generate([GenerationRequest(prompt)] * 4, sp)  # the same prompts: nothing reused
    assert on.metrics()["prefill_tokens"] == len(prompt)
    assert [c.response_ids for c in again] == [c.response_ids for c in first]
    resets = [GenerationRequest(prompt, c.response_ids[:k]) for c, k in zip(first, (1, 3, 5, 8))]
    sp2 = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
    a, b = on.generate(resets, sp2), off.generate(resets, sp2)
    _alike(a, b, model)
    assert on.metrics()["prefill_tokens"] == 0  # each context's last token is fed as a step
    with torch.no_grad():
        model.model.norm.weight.mul_(1.0)  # an in-place write: the store's keys/values are stale
    on.generate(resets, sp2)
    assert on.metrics()["prefill_tokens"] == sum(len(prompt) + len(r.prefix_ids) for r in resets)


@pytest.mark.parametrize("shared_min", [1, 10_000])  # contexts kept once per group, or per row
def test_continuations_of_one_prefix_share_its_stored_keys_and_sample_alike(mt, shared_min):
    """Monte-Carlo continuations: K rows per stored prefix, each prefix's last token fed once as
    the group's first decoding step; then rows continuing those continuations reuse them too."""
    model, tok = mt
    prompt = tuple(tok.encode("Q: 7*6?", add_special_tokens=False))
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=5)

    def backend(mb):
        cfg = HFBackend.Config(prefix_cache_mb=mb, fused_shared_context_min=shared_min)
        return HFBackend(cfg, model=model, tokenizer=tok)

    on, off = backend(64.0), backend(0.0)
    first = on.generate([GenerationRequest(prompt)] * 2, sp)
    off.generate([GenerationRequest(prompt)] * 2, sp)
    on.metrics()
    mc = [GenerationRequest(prompt, c.response_ids[:k]) for c, k in zip(first, (2, 6)) for _ in range(3)]
    sp2 = SamplingParams(temperature=1.0, max_new_tokens=5, seed=6)
    a, b = on.generate(mc, sp2), off.generate(mc, sp2)
    _alike(a, b, model)
    assert on.metrics()["prefill_tokens"] == 0
    deeper = [GenerationRequest(prompt, c.response_ids) for c in a if c.finish_reason == "length"]
    assert deeper  # rows that ran to the length limit, continued again
    sp3 = SamplingParams(temperature=1.0, max_new_tokens=4, seed=7)
    a, b = on.generate(deeper, sp3), off.generate(deeper, sp3)
    _alike(a, b, model)
    assert on.metrics()["prefill_tokens"] == 0
