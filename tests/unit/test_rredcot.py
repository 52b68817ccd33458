"""RREDCoT (arXiv 2606.06475): the ``keyword_entropy`` segmenter and the ``rredcot`` estimator."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.registry import build_part
from creditlab.step.rollout import collate, with_segments
from creditlab.testing import (
    FakePolicyHandle,
    check_advantage,
    check_segmenter,
    make_batch,
    pad_batch,
)
from creditlab.types import Completion, Problem, Segments, Trajectory
from creditlab_rredcot.advantage import RREDCoTAdvantage, redistribute, states
from creditlab_rredcot.segmenter import KeywordEntropySegmenter

from tests.helpers import char_tokenizer, tiny_model_and_tokenizer

SPLIT = "Let me check: 7+5=12.\n\nWait, 12*3=36. But Butter. Hmm ok Alternatively"


# ------------------------------------------------------------------------------------ helpers
def _bpe(kind: str):
    """A small BPE tokenizer trained locally: ``byte`` (GPT-2 style) or ``meta`` (SentencePiece
    style ``▁``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "Let me check: the sum. Wait, 7+5=12.\n\nBut then 12*3=36. Hmm, Alternatively we add.",
        "The answer is \\boxed{32}. However, Butter is not But. Let me check again.",
    ] * 20
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    extra = {}
    if kind == "byte":
        core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        core.decoder = decoders.ByteLevel()
        extra["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
    else:
        core.pre_tokenizer = pre_tokenizers.Metaspace()
        core.decoder = decoders.Metaspace()
    specials = ["<pad>", "<eos>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, **extra)
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def _arith_tokenizer():
    from creditlab_arith.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


TOKENIZERS = {
    "char": char_tokenizer,
    "arith_char": _arith_tokenizer,
    "bpe_byte": lambda: _bpe("byte"),
    "bpe_meta": lambda: _bpe("meta"),
}


def _traj(tok, prompt, text, reward=0.0, group=0, parsed=None, tf=0, logprobs=None, entropies=None,
          prefix_len=0, eos=False):
    ids = tuple(tok.encode(text, add_special_tokens=False)) + ((tok.eos_token_id,) if eos else ())
    lp = tuple(logprobs) if logprobs is not None else tuple(-0.5 for _ in ids[prefix_len:])
    prompt_ids = tuple(tok.encode(prompt, add_special_tokens=False))
    c = Completion(prompt_ids, ids, lp, "eos", text, prefix_len=prefix_len,
                   entropies=tuple(entropies) if entropies is not None else None)
    info = {"parsed": parsed, "outcome": "correct" if reward else "wrong"}
    return Trajectory(Problem(f"p{group}", prompt, "36"), c, float(reward), group, tf, "base", info)


def _segmenter(tok, **options):
    return KeywordEntropySegmenter(KeywordEntropySegmenter.Config(**options), tokenizer=tok)


def _batch(tok, trajs, spans=None):
    batch = collate(trajs, tok.pad_token_id)
    return with_segments(batch, Segments(tuple(spans))) if spans is not None else batch


def _texts(batch, tok, spans):
    return [[tok.decode(list(t.completion.response_ids[a:b])) for a, b in s]
            for t, s in zip(batch.trajectories, spans)]


class CountingHandle(FakePolicyHandle):
    """A fake policy that records every ``logprobs`` call's shape."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[int, int]] = []

    def logprobs(self, input_ids, attention_mask):
        self.calls.append(tuple(input_ids.shape))
        return super().logprobs(input_ids, attention_mask)


# ----------------------------------------------------------------------------------- segmenter
@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_keywords_and_delimiters_on_each_tokenizer(name):
    tok = TOKENIZERS[name]()
    seg = _segmenter(tok, min_segment_tokens=1)
    text = SPLIT if name != "char" else SPLIT.replace("\n\n", "</thought>")  # no "\n" in that vocab
    batch = _batch(tok, [_traj(tok, "q", text)])
    spans = seg.segment(batch).spans
    check_segmenter(seg, batch)
    got = [s.strip() for s in _texts(batch, tok, spans)[0]]
    first = "Let me check: 7+5=12." + ("</thought>" if name == "char" else "")
    # a delimiter closes its segment; "Wait", "But", "Hmm", "Alternatively" open one; "Butter"
    # and the leading "Let me check" (position 0) do not split
    assert got == [first, "Wait, 12*3=36.", "But Butter.", "Hmm ok", "Alternatively"]


def test_keyword_needs_whole_word_at_token_start_and_case():
    tok = char_tokenizer()
    seg = _segmenter(tok, min_segment_tokens=1)
    batch = _batch(tok, [_traj(tok, "q", "x Butter, Await, but; Waiting. Wait")])
    got = _texts(batch, tok, seg.segment(batch).spans)[0]
    assert got == ["x Butter, Await, but; Waiting. ", "Wait"]


class PieceTokenizer:
    """A scripted tokenizer: token i is the string ``pieces[i]``; decoding concatenates."""

    all_special_ids: list[int] = []

    def __init__(self, pieces):
        self.pieces = list(pieces)

    def encode(self, text, add_special_tokens=False):
        return [self.pieces.index(text)]

    def decode(self, ids, **kwargs):
        return "".join(self.pieces[i] for i in ids)


def test_keyword_must_start_at_a_token_boundary():
    tok = PieceTokenizer(["a", "x", " ", ",Wait", " Wait", "Wa", "it", "\nWait"])
    seg = KeywordEntropySegmenter(
        KeywordEntropySegmenter.Config(delimiters=[], keywords=["Wait"], min_segment_tokens=1),
        tokenizer=tok,
    )
    assert seg.text_boundaries([1, 3, 1])[1] == []  # "x,Waitx": inside ",Wait" after ","
    assert seg.text_boundaries([1, 4, 1])[1] == []  # "x Waitx": not a whole word
    assert seg.text_boundaries([1, 4, 2])[1] == [1]  # " Wait": only whitespace before it
    assert seg.text_boundaries([1, 2, 5, 6, 2])[1] == [2]  # spans two tokens: its first one
    assert seg.text_boundaries([1, 7])[1] == [1]
    spans, counts = seg.segment_row([1, 2, 5, 6, 2, 3], None)
    assert spans == ((0, 2), (2, 6)) and counts["keyword"] == 1


def test_uncertain_tokens_start_segments_and_surprisal_is_the_fallback():
    tok = char_tokenizer()
    cfg = KeywordEntropySegmenter.Config(delimiters=[], keywords=[], min_segment_tokens=2,
                                         entropy_quantile=0.9)
    seg = KeywordEntropySegmenter(cfg, tokenizer=tok)
    lp = [-0.1] * 12
    lp[7] = -5.0  # the sampled token at 7 was surprising
    batch = _batch(tok, [_traj(tok, "q", "abcdefghijkl", logprobs=lp),
                         _traj(tok, "q", "abcdefghijkl", logprobs=[-0.3] * 12)])
    spans = seg.segment(batch).spans
    assert spans[0] == ((0, 7), (7, 12))
    assert spans[1] == ((0, 12),), "a constant row has no token above its quantile"
    assert seg.metrics()["entropy_score_share"] == 0.0
    # entropies on the completion win over the surprisal
    ent = [0.1] * 12
    ent[3] = 4.0
    batch = _batch(tok, [_traj(tok, "q", "abcdefghijkl", logprobs=lp, entropies=ent)])
    assert seg.segment(batch).spans[0] == ((0, 3), (3, 12))
    assert seg.metrics()["entropy_score_share"] == 1.0
    # score: surprisal ignores the entropies; entropy requires them
    sur = KeywordEntropySegmenter(replace(cfg, score="surprisal"), tokenizer=tok)
    assert sur.segment(batch).spans[0] == ((0, 7), (7, 12))
    assert sur.metrics()["entropy_score_share"] == 0.0
    strict = KeywordEntropySegmenter(replace(cfg, score="entropy"), tokenizer=tok)
    assert strict.segment(batch).spans[0] == ((0, 3), (3, 12))
    with pytest.raises(ValueError, match="no entropies"):
        strict.segment(_batch(tok, [_traj(tok, "q", "abcdefghijkl", logprobs=lp)]))
    with pytest.raises(ConfigError, match="score"):
        KeywordEntropySegmenter.Config(score="logit")
    # quantile null: no uncertainty boundaries
    off = KeywordEntropySegmenter(replace(cfg, entropy_quantile=None), tokenizer=tok)
    batch = _batch(tok, [_traj(tok, "q", "abcdefghijkl", logprobs=lp)])
    assert off.segment(batch).spans[0] == ((0, 12),)


def test_reset_prefix_tokens_are_not_scored():
    tok = char_tokenizer()
    cfg = KeywordEntropySegmenter.Config(delimiters=[], keywords=[], min_segment_tokens=1,
                                         entropy_quantile=0.5)
    seg = KeywordEntropySegmenter(cfg, tokenizer=tok)
    # generated tokens 4..9 carry log-probs; prefix tokens 0..3 have none (0 in gen_logprobs)
    lp = [-0.1, -0.1, -3.0, -0.1, -0.1, -0.1]
    traj = _traj(tok, "q", "abcdefghij", logprobs=lp, prefix_len=4, tf=4)
    scores, from_entropies = seg.token_scores(_batch(tok, [traj]), 0, 10)
    assert not from_entropies and torch.isnan(scores[:4]).all() and scores[6] == 3.0
    assert seg.segment(_batch(tok, [traj])).spans[0] == ((0, 6), (6, 10))


def test_min_length_priorities_cap_and_trailing_eos():
    tok = char_tokenizer()
    text = "ab</thought>cdef</thought>Wait gh</thought>ij"
    mk = lambda **kw: KeywordEntropySegmenter(  # noqa: E731
        KeywordEntropySegmenter.Config(entropy_quantile=None, **kw), tokenizer=tok)
    batch = _batch(tok, [_traj(tok, "q", text, eos=True)])
    # min 1: every delimiter; the keyword right after one coincides with it; EOS joins the tail
    assert _texts(batch, tok, mk(min_segment_tokens=1).segment(batch).spans)[0] == [
        "ab</thought>", "cdef</thought>", "Wait gh</thought>", "ij<eos>"]
    # min 4: "ab</thought>" (3 tokens) is too short, the tail "ij<eos>" (3) too
    assert _texts(batch, tok, mk(min_segment_tokens=4).segment(batch).spans)[0] == [
        "ab</thought>cdef</thought>", "Wait gh</thought>ij<eos>"]
    # cap at 2 segments: the first delimiter wins (delimiters first, by position)
    assert len(mk(min_segment_tokens=1, max_segments=2).segment(batch).spans[0]) == 2
    # a delimiter just before EOS never leaves EOS alone
    batch = _batch(tok, [_traj(tok, "q", "abcd</thought>", eos=True)])
    assert mk(min_segment_tokens=1).segment(batch).spans[0] == ((0, 6),)


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_spans_partition_random_batches_and_ignore_padding(name):
    tok = TOKENIZERS[name]()
    for seed in range(4):
        for m in (1, 3):
            seg = KeywordEntropySegmenter(KeywordEntropySegmenter.Config(min_segment_tokens=m),
                                          tokenizer=tok)
            batch = make_batch(groups=3, group_size=4, vocab=len(tok), max_len=30, seed=seed,
                               pad_id=tok.pad_token_id)
            check_segmenter(seg, batch)
            padded = pad_batch(batch, 7, tok.pad_token_id)
            assert seg.segment(padded).spans == seg.segment(batch).spans
            for spans in seg.segment(batch).spans:
                assert all(b - a >= m for a, b in spans[:-1]) or len(spans) == 1


def test_segmenter_config_errors_and_yaml_build():
    with pytest.raises(ConfigError):
        KeywordEntropySegmenter.Config(entropy_quantile=1.5)
    with pytest.raises(ConfigError):
        KeywordEntropySegmenter.Config(keywords="Wait")
    with pytest.raises(ConfigError):
        KeywordEntropySegmenter.Config(min_segment_tokens=0)
    part = build_part("segmenter", {"name": "keyword_entropy", "keywords": ["Wait"]},
                      tokenizer=char_tokenizer())
    assert isinstance(part, KeywordEntropySegmenter) and part.config.keywords == ["Wait"]
    with pytest.raises(ValueError, match="tokenizer"):
        KeywordEntropySegmenter().segment(make_batch())


# ------------------------------------------------------------------------------------ estimator
def scripted_logits(tok):
    """Logits where after ``{`` the next token is ``3`` with probability q and ``4`` with 1-q,
    q = min(0.2 + 0.2 * #"a" so far, 0.8); after ``3``/``4`` comes ``}`` surely; uniform elsewhere.
    So with U(3)=1, U(4)=0: V(s) = q(s)."""
    v = len(tok)
    a, brace, three, four, close = tok.convert_tokens_to_ids(["a", "{", "3", "4", "}"])

    def fn(ids):
        count = (ids == a).cumsum(1).float()
        q = (0.2 + 0.2 * count).clamp(max=0.8)
        logits = torch.zeros(*ids.shape, v)
        after_brace = torch.full((*ids.shape, v), -1e9)
        after_brace[..., three] = torch.log(q)
        after_brace[..., four] = torch.log1p(-q)
        logits = torch.where((ids == brace)[..., None], after_brace, logits)
        after_answer = torch.full((*ids.shape, v), -1e9)
        after_answer[..., close] = 0.0
        return torch.where(((ids == three) | (ids == four))[..., None], after_answer, logits)

    return fn


def _hand_batch(tok):
    trajs = [
        _traj(tok, "q?", "aazz", reward=1.0, parsed="3"),
        _traj(tok, "q?", "zzzz", reward=0.0, parsed="4"),
        _traj(tok, "q?", "zaz", reward=0.0, parsed=None),
    ]
    return _batch(tok, trajs, [((0, 2), (2, 4)), ((0, 1), (1, 4)), ((0, 3),)])


def test_hand_computed_values_and_one_batched_call():
    tok = char_tokenizer()
    batch = _hand_batch(tok)
    ctx = CountingHandle(logits_fn=scripted_logits(tok), tokenizer=tok)
    est = RREDCoTAdvantage()
    credits, metrics = est.redistribute(batch, ctx)
    flat = lambda xs: [x for row in xs for x in row]  # noqa: E731
    assert [len(c.values) for c in credits] == [2, 2, 1]
    assert flat(c.values for c in credits) == pytest.approx([0.2, 0.6, 0.2, 0.2, 0.2], abs=1e-6)
    assert flat(c.credit for c in credits) == pytest.approx([0.4, 0.4, 0.0, -0.2, -0.2], abs=1e-6)
    # states s_0 (shared by the group), "aa" and "z": 3 states x 2 answers, one call
    assert ctx.calls == [(6, len("q?aa\\boxed{3}"))]  # the widest row: state "aa"
    assert metrics["value_rows"] == 6 and metrics["value_calls"] == 1 and metrics["states"] == 3
    assert metrics["answers_per_group"] == 2 and metrics["value_s0"] == pytest.approx(0.2, abs=1e-6)
    assert metrics["answer_mass"] == pytest.approx(1.0, abs=1e-6)

    out = est.estimate(batch, CountingHandle(logits_fn=scripted_logits(tok), tokenizer=tok))
    std = math.sqrt(1 / 3)  # sample std of rewards (1, 0, 0)
    want = torch.tensor([[0.4, 0.4, 0.4, 0.4], [0.0, -0.2, -0.2, -0.2], [-0.2, -0.2, -0.2, 0.0]])
    assert torch.allclose(out.values, want / (std + 1e-6), atol=1e-5)
    assert out.values[2, 3] == 0, "padding"
    # mix adds lambda x the GRPO advantage
    mixed = RREDCoTAdvantage(RREDCoTAdvantage.Config(mix=0.5)).estimate(batch, ctx).values
    grpo = torch.tensor([2 / 3, -1 / 3, -1 / 3]) / (std + 1e-6)
    assert torch.allclose(mixed, out.values + 0.5 * grpo[:, None] * batch.loss_mask, atol=1e-5)


def test_max_rows_chunks_give_the_same_values():
    tok = char_tokenizer()
    batch = _hand_batch(tok)
    ctx = CountingHandle(logits_fn=scripted_logits(tok), tokenizer=tok)
    one = RREDCoTAdvantage().estimate(batch, ctx).values
    chunked = RREDCoTAdvantage(RREDCoTAdvantage.Config(max_rows=4)).estimate(batch, ctx)
    assert [r for r, _ in ctx.calls] == [6, 4, 2] and chunked.metrics["value_calls"] == 2
    assert torch.allclose(one, chunked.values, atol=1e-6)


def test_single_outcome_groups():
    """All-correct group: zero by default (as GRPO); ``single_outcome=raw`` keeps the credit,
    which is positive where a segment raised pi(correct answer). All-wrong group: U = 0 for every
    answer, so V = 0 and the credit is 0 either way (the estimator cannot see success)."""
    tok = char_tokenizer()
    trajs = [_traj(tok, "q?", "aazz", 1.0, 0, "3"), _traj(tok, "q?", "zazz", 1.0, 0, "3"),
             _traj(tok, "q?", "aazz", 0.0, 1, "4"), _traj(tok, "q?", "zzzz", 0.0, 1, None)]
    spans = [((0, 2), (2, 4)), ((0, 2), (2, 4)), ((0, 2), (2, 4)), ((0, 4),)]
    batch = _batch(tok, trajs, spans)
    ctx = FakePolicyHandle(logits_fn=scripted_logits(tok), tokenizer=tok)
    out = RREDCoTAdvantage().estimate(batch, ctx)
    assert (out.values == 0).all() and out.metrics["single_outcome_groups"] == 2
    raw_est = RREDCoTAdvantage(RREDCoTAdvantage.Config(single_outcome="raw"))
    raw = raw_est.estimate(batch, ctx).values
    want = torch.tensor([[0.4, 0.4, 0.4, 0.4], [0.2, 0.2, 0.6, 0.6], [0.0] * 4, [0.0] * 4])
    assert torch.allclose(raw, want, atol=1e-5)


def test_renormalize_and_problem_pool():
    tok = char_tokenizer()
    # the pool's answers are "3" (U=1) and "5" (U=0); the policy puts 1-q on "4", nobody's answer
    trajs = [_traj(tok, "q?", "aazz", 1.0, 0, "3"), _traj(tok, "q?", "zzzz", 0.0, 0, "5")]
    batch = _batch(tok, trajs, [((0, 2), (2, 4)), ((0, 4),)])
    ctx = FakePolicyHandle(logits_fn=scripted_logits(tok), tokenizer=tok)
    credits, m = RREDCoTAdvantage().redistribute(batch, ctx)
    assert credits[0].values == pytest.approx([0.2, 0.6], abs=1e-6)
    assert m["answer_mass"] == pytest.approx((0.2 + 0.6) / 2, abs=1e-6)  # states s_0 and "aa"
    renorm = RREDCoTAdvantage(RREDCoTAdvantage.Config(renormalize=True)).redistribute(batch, ctx)[0]
    assert renorm[0].values == pytest.approx([1.0, 1.0], abs=1e-6)
    # answer_pool=problem: rows of other groups of the same problem lend their answers
    trajs = [_traj(tok, "q?", "aazz", 1.0, 0, "3"), _traj(tok, "q?", "zzzz", 1.0, 0, "3"),
             replace(_traj(tok, "q?", "zzz", 0.0, 1, "4"), problem=trajs[0].problem)]
    batch = _batch(tok, trajs, [((0, 4),)] * 2 + [((0, 3),)])
    group = RREDCoTAdvantage().redistribute(batch, ctx)[0]
    pooled_est = RREDCoTAdvantage(RREDCoTAdvantage.Config(answer_pool="problem"))
    pooled = pooled_est.redistribute(batch, ctx)[0]
    assert group[2].values == [0.0] and pooled[2].values == pytest.approx([0.2], abs=1e-6)


def test_reset_suffix_credit_starts_at_trainable_from():
    tok = char_tokenizer()
    # a suffix whose first 2 tokens are a reset prefix; its segmenter spans straddle the prefix
    trajs = [_traj(tok, "q?", "azaz", 1.0, 0, "3", tf=2, prefix_len=2),
             _traj(tok, "q?", "azzz", 0.0, 0, "4", tf=2, prefix_len=2)]
    batch = _batch(tok, trajs, [((0, 3), (3, 4)), ((0, 4),)])
    assert states(((0, 3), (3, 4)), 2, 4) == [0, 2, 3]
    ctx = FakePolicyHandle(logits_fn=scripted_logits(tok), tokenizer=tok)
    credits, _ = RREDCoTAdvantage().redistribute(batch, ctx)
    assert credits[0].values == pytest.approx([0.2, 0.4, 0.6], abs=1e-6)  # "", "az", "aza"
    assert credits[0].trained == [False, True, True]
    out = RREDCoTAdvantage(RREDCoTAdvantage.Config(norm="none")).estimate(batch, ctx).values
    assert torch.allclose(out, torch.tensor([[0, 0, 0.2, 0.4], [0, 0, -0.4, -0.4]]), atol=1e-5)


def _model_batch(tok, seed):
    gen = torch.Generator().manual_seed(seed)
    pieces = ["7+5=12</thought>", "Wait, ", "12*3=", "\\boxed{36}", "\\boxed{35}", "But 3-1=2. ",
              "Hmm</thought>", "x"]
    answers = ["36", "35", None, "12"]
    trajs = []
    for i in range(8):
        n = int(torch.randint(1, 6, (1,), generator=gen))
        text = "".join(pieces[int(j)] for j in torch.randint(0, len(pieces), (n,), generator=gen))
        parsed = answers[int(torch.randint(0, 4, (1,), generator=gen))]
        ids = tok.encode(text, add_special_tokens=False)
        lp = (-torch.rand(len(ids), generator=gen) * 3).tolist()
        tf = 2 if i % 4 == 3 and len(ids) > 2 else 0
        trajs.append(_traj(tok, f"q{i // 4}: 3*12?", text, float(parsed == "36"), i // 4, parsed,
                           tf=tf, logprobs=lp))
    return collate(trajs, tok.pad_token_id)


def test_real_model_sum_range_batching_padding_determinism(one_thread):
    model, tok = tiny_model_and_tokenizer(seed=1)
    ctx = CountingHandle(logits_fn=lambda ids: model(ids).logits, tokenizer=tok)
    seg = _segmenter(tok, min_segment_tokens=2)
    est = RREDCoTAdvantage(RREDCoTAdvantage.Config(single_outcome="raw"))
    single = FakePolicyHandle(logits_fn=lambda x: model(x).logits)
    for seed in range(3):
        batch = _model_batch(tok, seed)
        batch = with_segments(batch, seg.segment(batch))
        ctx.calls.clear()
        credits, metrics = est.redistribute(batch, ctx)
        assert len(ctx.calls) == (1 if metrics["value_rows"] else 0)
        for traj, cr in zip(batch.trajectories, credits):
            assert sum(cr.credit) == pytest.approx(traj.reward - cr.values[0], abs=1e-9)
            assert all(-1e-6 <= v <= 1 + 1e-6 for v in cr.values)
        # one batched pass equals separate unpadded passes
        cr, traj = credits[0], batch.trajectories[0]
        cue = tok.encode("\\boxed{", add_special_tokens=False)
        for s, v in zip(cr.starts, cr.values):
            total, pool = 0.0, {}
            for other in batch.trajectories:
                if other.group_id == traj.group_id and other.info["parsed"] is not None:
                    pool.setdefault(other.info["parsed"], []).append(other.reward)
            for ans, rs in pool.items():
                a = tok.encode(ans + "}", add_special_tokens=False)
                c = traj.completion
                ids = torch.tensor([[*c.prompt_ids, *c.response_ids[:s], *cue, *a]])
                lp = single.logprobs(ids, torch.ones_like(ids))  # one unpadded row
                total += math.exp(float(lp[0, -len(a):].sum())) * sum(rs) / len(rs)
            assert v == pytest.approx(total, abs=1e-5)
        out = est.estimate(batch, ctx)
        assert torch.isfinite(out.values).all() and (out.values[batch.loss_mask == 0] == 0).all()
        assert (out.values[3, :2] == 0).all() or batch.trajectories[3].trainable_from == 0
        assert torch.equal(out.values, est.estimate(batch, ctx).values), "deterministic"
        padded = pad_batch(batch, 5, tok.pad_token_id)
        padded = with_segments(padded, seg.segment(padded))
        again = est.estimate(padded, ctx).values
        assert torch.allclose(again[:, : out.values.shape[1]], out.values, atol=1e-6)
        assert (again[:, out.values.shape[1]:] == 0).all()
        for key, value in out.metrics.items():
            assert math.isfinite(value), key


def test_redistribute_telescopes():
    assert redistribute([0.2, 0.5, 0.1], 1.0) == pytest.approx([0.3, -0.4, 0.9])
    assert sum(redistribute([0.3, 0.7], 0.0)) == pytest.approx(-0.3)
    assert states(((0, 3), (3, 5)), 0, 5) == [0, 3] and states(((0, 5),), 5, 5) == []


@pytest.mark.parametrize("norm", ["reward_std", "segment_std", "none"])
def test_contract_and_norms(norm):
    est = RREDCoTAdvantage(RREDCoTAdvantage.Config(norm=norm, mix=0.3))
    check_advantage(est)  # no parsed answers there: V = 0, credit = R on the last segment
    tok = char_tokenizer()
    check_advantage(est, ctx=FakePolicyHandle(logits_fn=scripted_logits(tok), tokenizer=tok))
    batch = _hand_batch(tok)
    out = est.estimate(batch, FakePolicyHandle(logits_fn=scripted_logits(tok), tokenizer=tok))
    assert torch.isfinite(out.values).all()
    assert out.metrics["value_rows"] > 0 and est.metrics() == {}  # one channel


def test_estimator_config_errors():
    for bad in ({"norm": "x"}, {"answer_pool": "x"}, {"std": "none"}, {"single_outcome": "x"},
                {"eps": -1.0}, {"max_rows": -1}, {"mix": float("nan")}):
        with pytest.raises(ConfigError):
            RREDCoTAdvantage.Config(**bad)
    part = build_part("advantage", {"name": "rredcot", "norm": "segment_std"})
    assert isinstance(part, RREDCoTAdvantage) and part.config.norm == "segment_std"


def test_model_handle_values_equal_full_forwards(one_thread):
    """The model handle values every state from its response's KV cache (each trunk runs once);
    the values equal those of full forwards over every ``state + cue + answer`` sequence."""
    from creditlab.step.policy import ModelPolicyHandle

    model, tok = tiny_model_and_tokenizer(seed=2)
    seg = _segmenter(tok, min_segment_tokens=2)
    est = RREDCoTAdvantage(RREDCoTAdvantage.Config(single_outcome="raw"))
    cached = ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(0))
    full = FakePolicyHandle(logits_fn=lambda x: model(x).logits, tokenizer=tok)
    for seed in range(2):
        batch = _model_batch(tok, seed)
        batch = with_segments(batch, seg.segment(batch))
        fast, metrics = est.redistribute(batch, cached)
        slow, _ = est.redistribute(batch, full)
        assert metrics["value_rows"] > 0
        for a, b in zip(fast, slow):
            assert a.starts == b.starts and a.values == pytest.approx(b.values, abs=1e-5)
