"""Thought-by-thought generation and thought spans (METHODS.md section 2, TESTING trap 5)."""

from __future__ import annotations

import pytest
from creditlab.backends.hf import HFBackend
from creditlab.interfaces import GenerationBackend, ResetSelector
from creditlab.step.generation import ThoughtConfig, generate_thoughts, round_seed, thought_spans
from creditlab.types import Completion, GenerationRequest, Problem, ResetPoint, SamplingParams

from tests.helpers import THOUGHT, char_tokenizer, tiny_model_and_tokenizer, with_token_bias
from tests.numerics import approx_fp, lm_length

TOK = char_tokenizer()
D = TOK.convert_tokens_to_ids(THOUGHT)


pytestmark = pytest.mark.usefixtures("one_thread")


def enc(text: str) -> tuple[int, ...]:
    return tuple(TOK.encode(text, add_special_tokens=False))


# --- thought_spans --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ids,delim,spans",
    [
        ((), (9,), ()),
        ((1, 2, 3), (9,), ((0, 3),)),
        ((1, 9, 2, 9), (9,), ((0, 2), (2, 4))),
        ((9, 9, 1), (9,), ((0, 1), (1, 2), (2, 3))),
        ((1, 7, 8, 2, 7, 8, 3), (7, 8), ((0, 3), (3, 6), (6, 7))),
        ((7, 7, 8, 7), (7, 8), ((0, 3), (3, 4))),  # a partial delimiter does not split
        ((7, 8, 7, 8), (7, 8, 7), ((0, 3), (3, 4))),  # left to right, no overlap
    ],
)
def test_thought_spans(ids, delim, spans):
    assert thought_spans(ids, delim) == spans
    covered = [i for a, b in spans for i in range(a, b)]
    assert covered == list(range(len(ids)))  # a partition of [0, len)


def test_thought_spans_rejects_empty_delimiter():
    with pytest.raises(ValueError):
        thought_spans((1, 2), ())


# --- a scripted backend ---------------------------------------------------------------------
class Scripted(GenerationBackend):
    """Serves, per prompt, the next thought of a script: ``(text, finish_reason)``."""

    def __init__(self, scripts: dict[str, list[tuple[str, str]]]) -> None:
        super().__init__(model=None, tokenizer=TOK)
        self.scripts = {enc(p): list(s) for p, s in scripts.items()}
        self.calls: list[tuple[list[GenerationRequest], SamplingParams]] = []

    def generate(self, requests, sampling):
        self.calls.append((list(requests), sampling))
        out = []
        for r in requests:
            text, finish = self.scripts[r.prompt_ids].pop(0)
            new = enc(text)
            lps = (-0.5,) * len(new)
            out.append(
                Completion(r.prompt_ids, r.prefix_ids + new, lps, finish, "", len(r.prefix_ids))
            )
        return out


def _segments(c: Completion) -> list[str]:
    """Decoded text of each segment id, in order."""
    ids = sorted(set(c.segment_ids))
    assert ids == list(range(ids[0], ids[-1] + 1))
    return [TOK.decode([t for t, s in zip(c.response_ids, c.segment_ids) if s == j]) for j in ids]


def test_thoughts_until_final_marker_with_round_seeds():
    be = Scripted(
        {
            "p": [
                ("a+b" + THOUGHT, "stop"),
                ("c" + THOUGHT, "stop"),
                ("so \\boxed{3}" + THOUGHT, "stop"),
                ("x", "stop"),
            ],
            "q": [("z" * 4, "length"), ("w" + THOUGHT, "stop"), ("end<eos>", "eos")],
        }
    )
    sp = SamplingParams(temperature=0.7, top_p=0.95, max_new_tokens=999, seed=5)
    cfg = ThoughtConfig(max_thought_tokens=4)
    reqs = [GenerationRequest(enc("p")), GenerationRequest(enc("q"))]
    p, q = generate_thoughts(be, reqs, sp, cfg)

    assert p.finish_reason == "stop"
    assert _segments(p) == ["a+b" + THOUGHT, "c" + THOUGHT, "so \\boxed{3}" + THOUGHT]
    assert thought_spans(p.response_ids, (D,)) == ((0, 4), (4, 6), (6, 19))
    assert len(p.logprobs) == len(p.response_ids) and p.prefix_len == 0
    assert p.entropies is None  # the scripted backend records none
    assert p.text == "a+b" + THOUGHT + "c" + THOUGHT + "so \\boxed{3}" + THOUGHT
    # a capped thought without delimiter counts as one thought; EOS ends the row
    assert q.finish_reason == "eos" and _segments(q) == ["zzzz", "w" + THOUGHT, "end<eos>"]

    assert [len(reqs) for reqs, _ in be.calls] == [2, 2, 2]
    for r, (reqs, params) in enumerate(be.calls):
        assert params.seed == round_seed(5, r) and params.stop == (THOUGHT,)
        assert params.max_new_tokens == 4 and (params.temperature, params.top_p) == (0.7, 0.95)
    assert be.calls[1][0][0].prefix_ids == enc("a+b" + THOUGHT)
    assert len({round_seed(5, r) for r in range(20)}) == 20


def test_end_at_eos_false_asks_for_the_next_thought_as_the_official_srpo_loop():
    """``end_at_eos=False`` (the SRPO paper presets): a thought ending with EOS but no final
    marker is followed by the next thought, the EOS kept in the tokens, until the marker or the
    thought budget; a prefix ending with EOS is continued too."""
    script = [("a<eos>", "eos"), ("b" + THOUGHT, "stop"), ("\\boxed{2}<eos>", "eos"), ("never", "stop")]
    be = Scripted({"p": list(script), "q": [("<eos>", "eos")] * 3})
    cfg = ThoughtConfig(max_thoughts=3, end_at_eos=False)
    p, q = generate_thoughts(be, [GenerationRequest(enc("p")), GenerationRequest(enc("q"))], SamplingParams(seed=0), cfg)
    assert p.finish_reason == "stop" and _segments(p) == ["a<eos>", "b" + THOUGHT, "\\boxed{2}<eos>"]
    assert p.response_ids.count(TOK.eos_token_id) == 2 and len(p.logprobs) == len(p.response_ids)
    assert q.finish_reason == "length" and _segments(q) == ["<eos>"] * 3  # bounded by max_thoughts
    # the default ends the chain at the first EOS, as before
    [d] = generate_thoughts(Scripted({"p": list(script)}), [GenerationRequest(enc("p"))], SamplingParams(seed=0),
                            ThoughtConfig(max_thoughts=3))
    assert d.finish_reason == "eos" and _segments(d) == ["a<eos>"]
    # a reset prefix ending with EOS: continued without end_at_eos, finished with it
    prefix = enc("a<eos>")
    [c] = generate_thoughts(Scripted({"p": [("\\boxed{1}", "stop")]}), [GenerationRequest(enc("p"), prefix)],
                            SamplingParams(seed=0), cfg)
    assert c.finish_reason == "stop" and c.response_ids[: len(prefix)] == prefix and c.prefix_len == len(prefix)
    [e] = generate_thoughts(Scripted({}), [GenerationRequest(enc("p"), prefix)], SamplingParams(seed=0),
                            ThoughtConfig(max_thoughts=3))
    assert e.finish_reason == "eos" and e.response_ids == prefix


def test_max_thoughts_counts_prefix_thoughts_and_rows_leave_the_batch():
    be = Scripted(
        {"p": [(f"{i}" + THOUGHT, "stop") for i in range(9)], "q": [("a" + THOUGHT, "stop")] * 9}
    )
    prefix = enc("x" + THOUGHT + "y" + THOUGHT)
    reqs = [GenerationRequest(enc("p")), GenerationRequest(enc("q"), prefix)]
    p, q = generate_thoughts(be, reqs, SamplingParams(seed=0), ThoughtConfig(max_thoughts=4))
    assert p.finish_reason == q.finish_reason == "length"
    assert _segments(p) == [f"{i}" + THOUGHT for i in range(4)]
    assert q.response_ids[:4] == prefix and q.prefix_len == 4 and len(q.logprobs) == 4
    assert q.segment_ids == (0, 0, 1, 1, 2, 2, 3, 3)
    assert [len(reqs) for reqs, _ in be.calls] == [2, 2, 1, 1]
    req = GenerationRequest(enc("q"), prefix)
    [done] = generate_thoughts(be, [req], SamplingParams(), ThoughtConfig(max_thoughts=2))
    assert done.response_ids == prefix and done.finish_reason == "length" and done.logprobs == ()


def test_prefix_ending_mid_thought_continues_that_thought():
    be = Scripted({"p": [("ed{4}" + THOUGHT, "stop"), ("never", "stop")]})
    prefix = enc("s1" + THOUGHT + "\\box")
    [c] = generate_thoughts(be, [GenerationRequest(enc("p"), prefix)], SamplingParams(seed=1))
    assert c.response_ids[: len(prefix)] == prefix and c.prefix_len == len(prefix)
    assert _segments(c) == ["s1" + THOUGHT, "\\boxed{4}" + THOUGHT]  # marker split across rounds
    assert c.finish_reason == "stop" and len(be.calls) == 1
    spans = thought_spans(c.response_ids, (D,))
    assert [c.segment_ids[a:b] == (j,) * (b - a) for j, (a, b) in enumerate(spans)] == [True] * 2


class ByPrefix(GenerationBackend):
    """Serves one thought per request, chosen from the request alone: the first thought of a
    response is ``"zzzz"`` (capped at 4 tokens, no delimiter), every later one ``"w</thought>"``."""

    def __init__(self) -> None:
        super().__init__(model=None, tokenizer=TOK)
        self.calls = 0

    def generate(self, requests, sampling):
        self.calls += 1
        out = []
        for r in requests:
            new, finish = (enc("zzzz"), "length") if not r.prefix_ids else (enc("w" + THOUGHT), "stop")
            out.append(Completion(r.prompt_ids, r.prefix_ids + new, (-0.5,) * len(new), finish, "",
                                  len(r.prefix_ids)))
        return out


def test_prefix_with_a_capped_thought_keeps_the_seeds_thoughts():
    """A reset prefix holding a thought capped without delimiter: the seed's segment ids carried
    in the request keep it one thought, so the continuation has max_thoughts thoughts, not one
    more (issue 14, item 4)."""
    cfg = ThoughtConfig(max_thoughts=3, max_thought_tokens=4)
    be = ByPrefix()
    [seed] = generate_thoughts(be, [GenerationRequest(enc("p"))], SamplingParams(seed=0), cfg)
    assert _segments(seed) == ["zzzz", "w" + THOUGHT, "w" + THOUGHT]
    for cut in (1, 2):  # the prefix is the seed's first `cut` thoughts
        end = seed.segment_ids.index(cut)
        req = GenerationRequest(seed.prompt_ids, seed.response_ids[:end], seed.segment_ids[:end])
        be.calls = 0
        [c] = generate_thoughts(be, [req], SamplingParams(seed=1), cfg)
        assert c.response_ids == seed.response_ids and c.segment_ids == seed.segment_ids
        assert c.prefix_len == end and len(c.logprobs) == len(c.response_ids) - end
        assert c.finish_reason == "length" and be.calls == 3 - cut
    # a prefix cut inside a thought (fewer tokens than the cap, no delimiter) continues it
    req = GenerationRequest(seed.prompt_ids, seed.response_ids[:5], seed.segment_ids[:5])
    [c] = generate_thoughts(be, [req], SamplingParams(seed=1), cfg)
    assert c.segment_ids == (0,) * 4 + (1,) * 3 + (2,) * 2 and c.finish_reason == "length"
    with pytest.raises(ValueError, match="prefix_segment_ids"):
        generate_thoughts(be, [GenerationRequest(enc("p"), enc("ab"), (0,))], SamplingParams(), cfg)


def test_reset_suffix_after_a_capped_seed_thought_has_the_seeds_thought_count():
    """Through the reset buffer: the suffix of a seed whose first thought was capped keeps that
    thought apart and stops at max_thoughts thoughts."""
    from creditlab.testing import FakePolicyHandle
    from creditlab.types import Trajectory
    from creditlab_resets.buffer import ResetBuffer

    class Fixed(ResetSelector):
        def select(self, trajectory, spans, ctx):
            return ResetPoint(1)  # regenerate from thought 1: the prefix is the capped thought

    cfg = ThoughtConfig(max_thoughts=3, max_thought_tokens=4)
    be = ByPrefix()

    def sample_fn(problems, requests, seed):
        outs = generate_thoughts(be, requests, SamplingParams(seed=seed), cfg)
        return [Trajectory(p, c, 0.0, -1, c.prefix_len) for p, c in zip(problems, outs)]

    problem = Problem("p", "p", "1")
    buf = ResetBuffer(2, "1x1", 2, 1.0, True, (D,))
    result = buf.build([problem], [enc("p")], sample_fn, Fixed(), FakePolicyHandle(tokenizer=TOK), 0)
    [suffix] = [t for t in result.trajectories if t.trainable_from > 0]
    c = suffix.completion
    assert c.prefix_len == 4 and _segments(c) == ["zzzz", "w" + THOUGHT, "w" + THOUGHT]


def test_invalid_thought_settings_raise():
    be = Scripted({})
    req = [GenerationRequest(enc("p"))]
    with pytest.raises(ValueError, match="stop"):
        generate_thoughts(be, req, SamplingParams(stop=("\n",)))
    for kw in (dict(max_thoughts=0), dict(max_thought_tokens=0), dict(delimiter="")):
        cfg = ThoughtConfig(**kw)
        with pytest.raises(ValueError):
            generate_thoughts(be, req, SamplingParams(), cfg)


# --- with the real HF backend ---------------------------------------------------------------
@pytest.fixture(scope="module")
def hf():
    model, tok = tiny_model_and_tokenizer(seed=0)
    biased = with_token_bias(model, {D: 1.2, 0: -1e4, 2: -1e4, 3: -1e4})  # short thoughts
    return HFBackend(model=biased, tokenizer=tok), tok


PROMPTS = ["1+2=", "hello world", "x", "abc def ghi"]


@pytest.mark.numerics
def test_greedy_thoughts_equal_plain_greedy_and_segments_match_spans(hf):
    be, tok = hf
    reqs = [GenerationRequest(tuple(tok.encode(p, add_special_tokens=False))) for p in PROMPTS]
    cfg = ThoughtConfig(max_thoughts=5, max_thought_tokens=12, final_marker="")
    greedy = SamplingParams(temperature=0.0)
    out = generate_thoughts(be, reqs, greedy, cfg)
    plain = be.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=60))
    n_delim = 0
    for c, p in zip(out, plain):
        assert c.response_ids == p.response_ids[: len(c.response_ids)]  # rounds resume exactly
        assert len(c.logprobs) == len(c.response_ids) == len(c.segment_ids)
        # entropies join across rounds: those of one plain call, token for token
        n = lm_length(be.model.config, len(p.prompt_ids) + len(p.response_ids))
        assert c.entropies == approx_fp(p.entropies[: len(c.response_ids)], length=n)
        pairs = list(zip(c.response_ids, c.segment_ids))
        segs = [[t for t, s in pairs if s == j] for j in range(max(c.segment_ids) + 1)]
        assert len(segs) <= 5 and all(s for s in segs)
        for s in segs:  # each thought ends at the delimiter, EOS or the cap
            assert s[-1] in (D, tok.eos_token_id) or len(s) == 12
            assert D not in s[:-1]
        n_delim += sum(s[-1] == D for s in segs)
        if all(s[-1] == D for s in segs[:-1]):
            spans = thought_spans(c.response_ids, (D,))
            assert [c.segment_ids[a] for a, _ in spans] == list(range(len(spans)))
            assert all(len(set(c.segment_ids[a:b])) == 1 for a, b in spans)
        if c.finish_reason == "length":
            assert len(segs) == 5
    assert n_delim >= 4


@pytest.mark.numerics
def test_final_marker_and_resume_from_thought_prefix(hf):
    be, tok = hf
    reqs = [GenerationRequest(tuple(tok.encode(p, add_special_tokens=False))) for p in PROMPTS]
    base = ThoughtConfig(max_thoughts=6, max_thought_tokens=10, final_marker="")
    sp = SamplingParams(temperature=0.0)
    full = generate_thoughts(be, reqs, sp, base)
    checked = 0
    for r, c in zip(reqs, full):
        if max(c.segment_ids) < 2:
            continue
        end = c.segment_ids.index(2)  # prefix = thoughts 0 and 1, delimiters included
        if c.response_ids[: end].count(D) != 2:
            continue  # a capped thought: delimiter counting would merge it (documented)
        checked += 1
        req = GenerationRequest(r.prompt_ids, c.response_ids[:end])
        [resumed] = generate_thoughts(be, [req], sp, base)
        assert resumed.response_ids == c.response_ids and resumed.segment_ids == c.segment_ids
        assert resumed.prefix_len == end and len(resumed.logprobs) == len(c.response_ids) - end
        n = lm_length(be.model.config, len(c.prompt_ids) + len(c.response_ids))
        assert resumed.entropies == approx_fp(c.entropies[end:], length=n)  # none for the prefix
        # a final marker taken from thought 1 ends the row right after that thought
        marker = tok.decode([t for t, s in zip(c.response_ids, c.segment_ids) if s == 1][:1])
        if marker not in tok.decode(c.response_ids[: c.segment_ids.index(1)]):
            cfg = ThoughtConfig(max_thoughts=6, max_thought_tokens=10, final_marker=marker)
            [m] = generate_thoughts(be, [r], sp, cfg)
            assert m.finish_reason == "stop" and m.response_ids == c.response_ids[:end]
    assert checked >= 2


def test_seeded_thought_sampling_is_deterministic(hf):
    be, tok = hf
    reqs = [GenerationRequest(tuple(tok.encode(p, add_special_tokens=False))) for p in PROMPTS]
    cfg = ThoughtConfig(max_thoughts=3, max_thought_tokens=8)
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=4)
    assert generate_thoughts(be, reqs, sp, cfg) == generate_thoughts(be, reqs, sp, cfg)
