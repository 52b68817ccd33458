"""Thoughts decoded in one pass (``rollout.thought_decoding=one_pass``): the watch ends thoughts
and rows by the rules of the rounds, so greedy decoding gives the rounds' tokens, thoughts and
finish reasons exactly, and sampling gives the same distribution (different draws); the fused
decoder's room for generated tokens grows without changing a token; bad settings are refused."""

from __future__ import annotations

import dataclasses

import creditlab.accel.fused_decode as fused_decode
import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.interfaces import GenerationBackend
from creditlab.step.generation import ThoughtConfig, generate_thoughts
from creditlab.step.stops import ThoughtWatch, completes
from creditlab.types import GenerationRequest, RolloutConfig, SamplingParams
from scipy.stats import chi2_contingency

from tests.helpers import THOUGHT, char_tokenizer, tiny_model_and_tokenizer, with_token_bias
from tests.numerics import assert_close_fp, lm_length

TOK = char_tokenizer()
D = TOK.convert_tokens_to_ids(THOUGHT)
EOS = TOK.eos_token_id

pytestmark = pytest.mark.usefixtures("one_thread")


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


# --- the watch alone ----------------------------------------------------------------------------
def feed(watch: ThoughtWatch, row: int, ids: list[int]) -> list[str | None]:
    return [watch.observe(row, t) for t in ids]


def test_watch_ends_thoughts_at_the_delimiter_token_and_at_the_cap():
    cfg = ThoughtConfig(max_thoughts=3, max_thought_tokens=4, final_marker="")
    w = ThoughtWatch(TOK, cfg, [(0, [])])
    ids = [*enc("ab"), D, *enc("cdef"), *enc("g"), D]
    said = feed(w, 0, ids)
    assert said == [None] * 7 + [None, "length"]  # thoughts: "ab</thought>", "cdef" (capped), "g</thought>"
    assert w.segment_ids(0, 0, len(ids)) == [0, 0, 0, 1, 1, 1, 1, 2, 2]


def test_watch_matches_a_text_delimiter_in_the_thought_only():
    cfg = ThoughtConfig(delimiter="x\n", max_thoughts=5, max_thought_tokens=50, final_marker="")
    w = ThoughtWatch(TOK, cfg, [(2, enc("abx"))])  # the prefix's unfinished thought ends with "x"
    # as in a round, whose stop string is matched in its new tokens only: "\n" alone ends nothing
    assert feed(w, 0, enc("\nyx\n")) == [None, None, None, None]
    assert w.rows[0].thought == 3 and w.segment_ids(0, 2, 4) == [2, 2, 2, 2]


def test_watch_reads_the_final_marker_with_the_prefix_thought_it_continues():
    cfg = ThoughtConfig(delimiter="x\n", max_thoughts=5, max_thought_tokens=50, final_marker="ANS")
    w = ThoughtWatch(TOK, cfg, [(2, enc("so AN")), (0, [])])
    assert feed(w, 0, enc("S 1x\n")) == [None, None, None, None, "stop"]  # "so AN" + "S 1x\n" holds "ANS"
    assert feed(w, 1, enc("ab x\nc")) == [None] * 6  # no marker: thought 0 ended, thought 1 goes on
    assert w.segment_ids(1, 0, 7) == [0] * 5 + [1, 1]  # an EOS after the last token joins thought 1
    assert completes("ab x\n", "ab x", ("x\n",)) and not completes("x\nab", "x\na", ("x\n",))


def test_one_pass_needs_end_at_eos_and_a_watching_backend():
    with pytest.raises(ValueError, match="end_at_eos"):
        ThoughtWatch(TOK, ThoughtConfig(end_at_eos=False), [])
    with pytest.raises(ValueError, match="rollout.end_at_eos=true"):
        RolloutConfig(thought_decoding="one_pass", end_at_eos=False)
    with pytest.raises(ValueError, match="rounds or one_pass"):
        RolloutConfig(thought_decoding="single")

    class Plain(GenerationBackend):
        def generate(self, requests, sampling):  # pragma: no cover - never reached
            raise AssertionError

    with pytest.raises(ValueError, match="thought_decoding=rounds"):
        generate_thoughts(Plain(model=None, tokenizer=TOK), [GenerationRequest((5,))], SamplingParams(),
                          ThoughtConfig(decoding="one_pass"))


# --- against the rounds, on the HF backend --------------------------------------------------------
@pytest.fixture(scope="module")
def hf():
    model, tok = tiny_model_and_tokenizer(seed=0)
    biased = with_token_bias(model, {D: 1.2, 0: -1e4, 2: -1e4, 3: -1e4})  # short thoughts
    return HFBackend(model=biased, tokenizer=tok), tok


def _requests(tok) -> list[GenerationRequest]:
    p = [tuple(tok.encode(s, add_special_tokens=False)) for s in ("1+2=", "hello world", "x", "abc def ghi")]
    return [
        *(GenerationRequest(q) for q in p),
        GenerationRequest(p[0], (*enc("ab"), D)),  # a finished prefix thought
        GenerationRequest(p[1], tuple(enc("abc"))),  # a prefix ending mid-thought: continued
        GenerationRequest(p[2], tuple(enc("abcdefgh")), (0,) * 8),  # a capped prefix thought (segment ids)
        GenerationRequest(p[3], (*enc("a"), D, *enc("b"), D, *enc("c"), D)),  # max_thoughts reached
    ]


#: (thought settings, the finish reasons the rounds reach with them on ``hf``; ``hf_eos`` adds "eos")
CONFIGS = {
    "id-delimiter": (ThoughtConfig(max_thoughts=3, max_thought_tokens=8, final_marker=""), {"length"}),
    "final-marker": (ThoughtConfig(max_thoughts=5, max_thought_tokens=6, final_marker="e"), {"length", "stop"}),
    "text-delimiter": (ThoughtConfig(delimiter=THOUGHT * 2, max_thoughts=4, max_thought_tokens=9, final_marker=""),
                       {"length"}),  # two tokens: matched in the text
}


@pytest.fixture(scope="module")
def hf_eos():
    model, tok = tiny_model_and_tokenizer(seed=0)
    biased = with_token_bias(model, {D: 1.2, EOS: 1.6, 0: -1e4, 2: -1e4, 3: -1e4})  # some chains end at EOS
    return HFBackend(model=biased, tokenizer=tok), tok


@pytest.mark.numerics
@pytest.mark.parametrize("backend", ["hf", "hf_eos"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_one_pass_equals_the_rounds(request, backend, name):
    be, tok = request.getfixturevalue(backend)
    cfg, finishes = CONFIGS[name]
    reqs = _requests(tok)
    greedy = SamplingParams(temperature=0.0)
    rounds = generate_thoughts(be, reqs, greedy, cfg)
    one = generate_thoughts(be, reqs, greedy, dataclasses.replace(cfg, decoding="one_pass"))
    for r, o in zip(rounds, one):
        assert (o.response_ids, o.segment_ids, o.finish_reason, o.prefix_len) == (
            r.response_ids, r.segment_ids, r.finish_reason, r.prefix_len)
        assert o.text == r.text and len(o.logprobs) == len(r.logprobs) == len(o.entropies)
        n = lm_length(be.model.config, len(r.prompt_ids) + len(r.response_ids))
        assert_close_fp(torch.tensor(o.logprobs), torch.tensor(r.logprobs), length=n)
    seen = {r.finish_reason for r in rounds}
    assert seen >= finishes | ({"eos"} if backend == "hf_eos" else set())
    assert max(max(r.segment_ids) for r in rounds) >= 2  # several thoughts were decoded


def _shape(c, cap: int) -> tuple:
    """What the thought rules decide for a chain: its thoughts' lengths (capped at the cap) and
    how each ended, and the chain's finish reason."""
    ends = []
    for j in sorted(set(c.segment_ids)):
        ids = [t for t, s in zip(c.response_ids, c.segment_ids) if s == j]
        ends.append((len(ids), "delim" if ids[-1] == D else "eos" if ids[-1] == EOS else "cap"))
    return (tuple(ends), c.finish_reason)


def test_sampled_one_pass_has_the_rounds_distribution(hf):
    """600 chains each way from one prompt: the joint distribution of the first two thoughts'
    lengths and endings and the finish reason is the same (chi-square, exact draws per seed)."""
    be, tok = hf
    cfg = ThoughtConfig(max_thoughts=3, max_thought_tokens=5, final_marker="")
    req = [GenerationRequest(tuple(tok.encode("abc", add_special_tokens=False)))] * 600
    sp = SamplingParams(temperature=1.0, seed=11)
    counts: dict[tuple, list[int]] = {}
    for k, decoding in enumerate(("rounds", "one_pass")):
        for c in generate_thoughts(be, req, sp, dataclasses.replace(cfg, decoding=decoding)):
            ends, finish = _shape(c, cfg.max_thought_tokens)
            key = (ends[0], ends[1][0] if len(ends) > 1 else None, finish)
            counts.setdefault(key, [0, 0])[k] += 1
    common = [v for v in counts.values() if sum(v) >= 10]
    rare = [sum(v[i] for v in counts.values() if sum(v) < 10) for i in (0, 1)]
    table = common + ([rare] if sum(rare) else [])
    assert len(table) >= 6
    assert chi2_contingency(table).pvalue > 0.001


def test_fused_room_grows_without_changing_a_token(monkeypatch):
    model, tok = tiny_model_and_tokenizer(seed=0)
    be = HFBackend(model=with_token_bias(model, {EOS: -1e4}), tokenizer=tok)  # rows run to the budget
    assert be.accelerator.path == "fused"
    reqs = [GenerationRequest(tuple(tok.encode(s, add_special_tokens=False))) for s in ("ab", "ab", "cde")]
    sp = SamplingParams(temperature=1.0, seed=3, max_new_tokens=40)
    before = be.generate(reqs, sp)
    monkeypatch.setattr(fused_decode, "FIRST_ROOM", 3)  # grows 3 -> 6 -> 12 -> 24 -> 40
    after = be.generate(reqs, sp)
    assert [c.response_ids for c in after] == [c.response_ids for c in before]
    assert all(len(c.logprobs) == 40 for c in before)
    for a, b in zip(after, before):
        assert_close_fp(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                        length=lm_length(be.model.config, len(b.prompt_ids) + len(b.response_ids)))
