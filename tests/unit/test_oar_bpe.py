"""OAR's answer marker on a real byte-level BPE tokenizer (issue 14): ``\\boxed{`` merged by BPE
with the space or ``$`` before it is found on the decoded text, mapped back to the rollout's own
tokens; its own encoding is not a subsequence of such a response.

The tokenizer is trained here, in the test, with the ``tokenizers`` library (GPT-2's byte-level
pre-tokenizer and regex, nothing downloaded): as in GPT-2 / Qwen vocabularies, ``" \\\\"`` and
``" $\\\\"`` become single tokens.
"""

from __future__ import annotations

import pytest
import torch
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import collate
from creditlab.types import Completion, Problem, Trajectory
from creditlab_oar.advantage import OARGAdvantage, OARPAdvantage
from creditlab_oar.probe import build_probe, find_marker, last_occurrence

MARKER = "\\boxed{"


@pytest.fixture(scope="module")
def bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = (
        [f"so the answer is \\boxed{{{i}}}." for i in range(60)]
        + [f"we get $\\boxed{{{i}}}$ now" for i in range(60)]
        + ["2*7=14 and 14+5=19 then x ≥ 3, so"] * 20
    )
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    core.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   clean_up_tokenization_spaces=False)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _decode(tok, ids):
    return tok.decode(list(ids), clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("text,reasoning,marker,answer", [
    ("so the answer is \\boxed{19}.", "so the answer is", " \\boxed{", "19}."),
    ("we get $\\boxed{19}$ now", "we get", " $\\boxed{", "19}$ now"),
    # the last of two markers; a multi-byte character before it
    ("x ≥ 3, so \\boxed{3} no, so the answer is \\boxed{19}.", "x ≥ 3, so \\boxed{3} no, so the answer is",
     " \\boxed{", "19}."),
    ("x ≥ 3,$\\boxed{3}$", "x ≥ 3,", "$\\boxed{", "3}$"),
])
def test_a_merged_marker_is_found_on_the_text(bpe, text, reasoning, marker, answer):
    body = _ids(bpe, text)
    marker_ids = _ids(bpe, MARKER)
    assert last_occurrence(body, marker_ids) is None  # BPE merged the marker: the old match fails
    start, end = find_marker(body, marker_ids, MARKER, bpe)
    assert _decode(bpe, body[:start]) == reasoning
    assert _decode(bpe, body[start:end]) == marker
    assert _decode(bpe, body[end:]) == answer
    assert find_marker(body, marker_ids) is None  # no tokenizer: the token-sequence match


def test_no_marker_and_a_marker_encoded_alone(bpe):
    body = _ids(bpe, "2*7=14 and 14+5=19 then")
    assert find_marker(body, _ids(bpe, MARKER), MARKER, bpe) is None
    alone = _ids(bpe, "\\boxed{19}")  # at the start nothing merges: both matches agree
    assert find_marker(alone, _ids(bpe, MARKER), MARKER, bpe) == (0, len(_ids(bpe, MARKER)))
    assert last_occurrence(alone, _ids(bpe, MARKER)) == 0


def _batch(tok):
    prompt = _ids(tok, "Q: 2*7+5? ")
    trajs = []
    for i, (text, reward) in enumerate([
        ("2*7=14 and 14+5=19 then so the answer is \\boxed{19}.", 1.0),
        ("2*7=14 and 14+5=19 then we get $\\boxed{20}$ now", 0.0),
    ]):
        ids = [*_ids(tok, text), tok.eos_token_id]
        c = Completion(tuple(prompt), tuple(ids), tuple([-0.1] * len(ids)), "eos", text)
        trajs.append(Trajectory(Problem(f"p{i}", "Q", "19"), c, reward, 0, 0))
    return collate(trajs, tok.pad_token_id)


def test_probe_is_the_rollouts_own_sequence(bpe):
    batch = _batch(bpe)
    marker = tuple(_ids(bpe, MARKER))
    rows = ((0, "2*7=14 and 14+5=19 then so the answer is", "19}."),
            (1, "2*7=14 and 14+5=19 then we get", "20}$ now"))
    for row, reasoning, answer in rows:
        p = build_probe(batch, row, marker, marker, "answer_joint", bpe.eos_token_id, MARKER, bpe,
                        cue_is_marker=True)
        n = int(batch.response_mask[row].sum()) - 1  # without EOS
        own = batch.input_ids[row, : batch.prompt_len].tolist() + batch.response_ids[row, :n].tolist()
        assert p.marker_found and p.ids.tolist() == own
        assert _decode(bpe, p.ids[p.cue_end :]) == answer and p.answer_len == len(_ids(bpe, answer))
        assert _decode(bpe, batch.response_ids[row, : p.n_reasoning]) == reasoning
        old = build_probe(batch, row, marker, marker, "answer_joint", bpe.eos_token_id)
        assert not old.marker_found and old.fallback  # the token-sequence match: the whole response


@pytest.mark.parametrize("cls", [OARPAdvantage, OARGAdvantage])
def test_estimators_find_the_merged_marker(bpe, cls):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(bpe), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, pad_token_id=bpe.pad_token_id,
                         eos_token_id=bpe.eos_token_id, max_position_embeddings=256)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    ctx = ModelPolicyHandle(model, bpe, None, torch.Generator().manual_seed(0))
    batch = _batch(bpe)
    out = cls(cls.Config(mode="answer_mean")).estimate(batch, ctx)
    assert out.metrics["probed_rows"] == 2
    assert out.metrics["marker_missing"] == 0 and out.metrics["answer_fallback"] == 0
    # the marker, the answer and EOS keep the row's advantage; only the reasoning is reshaped
    for row in range(2):
        n = int(batch.response_mask[row].sum())
        span = find_marker(batch.response_ids[row, : n - 1].tolist(), (), MARKER, bpe)
        v = out.values[row, :n]
        torch.testing.assert_close(v[span[0] :], torch.full((n - span[0],), float(v[-1])))
        assert not torch.allclose(v[: span[0]], torch.full((span[0],), float(v[-1])))
