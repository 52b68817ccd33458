"""``PolicyHandle.read_logits``, ``branch_read_logits`` and ``input_gradients(read=...)``: the
logits of the read positions only, equal to the full logits there (fused head on and off, KV-cached
branches against whole sequences, every gradient), and OAR-P / OAR-G give the same importance
through them with the head fused or not. No (rows, tokens, V) tensor is built on the fused path."""

from __future__ import annotations

import pytest
import torch
from creditlab.interfaces import PolicyHandle
from creditlab.step.policy import ModelPolicyHandle, forward_logits
from creditlab_oar.advantage import OARGAdvantage, OARPAdvantage

from tests.unit.test_accel import MODELS
from tests.unit.test_branch_logprobs import _case
from tests.unit.test_fused_head import _Largest
from tests.unit.test_oar import _batch
from tests.numerics import assert_close_fp, lm_length

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.numerics]


def _handle(model, fused, tok=None, seed=0):
    return ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(seed), fused_head=fused)


def _input_grad_length(model, ids, mask):
    """Rounded terms behind one input gradient: the forward and backward chains (an embedding's
    gradient sums no positions)."""
    return lm_length(model.config, ids.shape[1], backward=True)


def _read(mask, seed=0):
    """(B, L) bool: a few real positions per row, one row with none."""
    g = torch.Generator().manual_seed(seed)
    read = (torch.rand(mask.shape, generator=g) < 0.3) & (mask > 0)
    read[0] = False
    read[1, int(mask[1].sum()) - 1] = True  # a row's last real token
    return read


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-tied"])
@pytest.mark.parametrize("fused", ["on", "off"])
def test_read_logits_are_the_full_logits_at_the_read_positions(name, fused):
    model, _ = MODELS[name]()
    ids, mask, *_ = _case(model.config.vocab_size)
    read = _read(mask)
    with torch.no_grad():
        full = forward_logits(model, ids, mask)  # (B, L, V)
    got = _handle(model, fused).read_logits(ids, mask, read)
    assert got.shape == (int(read.sum()), model.config.vocab_size) and got.dtype == torch.float32
    n = lm_length(model.config, ids.shape[1])
    assert_close_fp(got, full[read], length=n)
    chunked = _handle(model, fused)
    chunked.micro_batch_size = 2
    assert_close_fp(chunked.read_logits(ids, mask, read), got, length=n)
    default = PolicyHandle.read_logits(_handle(model, fused), ids, mask, read)  # via input_gradients
    assert_close_fp(default, got, length=n)


@pytest.mark.parametrize("fused", ["on", "off"])
def test_cached_branch_reads_equal_whole_sequences(fused):
    model, _ = MODELS["llama-gqa"]()
    ids, mask, rows, at, branch_ids, branch_mask = _case(model.config.vocab_size, seed=2)
    read = branch_mask.bool().clone()
    read[1, 0] = False  # not every branch token
    handle = _handle(model, fused)
    fast = handle.branch_read_logits(ids, mask, rows, at, branch_ids, branch_mask, read)
    plain = PolicyHandle.branch_read_logits(handle, ids, mask, rows, at, branch_ids, branch_mask, read)
    assert fast.shape == plain.shape == (int(read.sum()), model.config.vocab_size)
    n = lm_length(model.config, ids.shape[1] + branch_ids.shape[1])
    assert_close_fp(fast, plain, length=n)
    # two branches a forward, longest first, each chunk cut to its own width: the same, in order
    chunked = handle.branch_read_logits(ids, mask, rows, at, branch_ids, branch_mask, read, chunk=2)
    assert_close_fp(chunked, plain, length=n)


@pytest.mark.parametrize("fused", ["on", "off"])
def test_input_gradients_with_read_positions_equal_the_full_logits(fused):
    model, _ = MODELS["llama-gqa"]()
    ids, mask, *_ = _case(model.config.vocab_size, seed=3)
    read = _read(mask, seed=3)
    weights = torch.randn((int(read.sum()), model.config.vocab_size), generator=torch.Generator().manual_seed(0))
    offset = 1e-2 * torch.randn((*ids.shape, model.config.hidden_size), generator=torch.Generator().manual_seed(1))
    handle = _handle(model, fused)
    emb, grad = handle.input_gradients(ids, mask, lambda e, z: (z.log_softmax(-1) * weights).sum(),
                                       embedding_offset=offset, read=read)
    emb_ref, grad_ref = handle.input_gradients(
        ids, mask, lambda e, z: (z[read].log_softmax(-1) * weights).sum(), embedding_offset=offset)
    assert torch.equal(emb, emb_ref)  # the same lookup by construction
    assert grad.abs().max() > 0
    assert_close_fp(grad, grad_ref, length=_input_grad_length(model, ids, mask))


def test_fused_read_builds_no_tensor_of_rows_by_tokens_by_vocab():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    ids, mask, *_ = _case(model.config.vocab_size, seed=4)
    read = _read(mask, seed=4)
    full = ids.numel() * model.config.vocab_size
    for fused, below in (("on", True), ("off", False)):
        with _Largest() as seen:
            _handle(model, fused).read_logits(ids, mask, read)
        assert (seen.largest < full) is below, (fused, seen.largest, full)


@pytest.mark.parametrize("cls,options", [
    (OARPAdvantage, {"mode": "last", "chunk_size": 5}),
    (OARPAdvantage, {"mode": "answer_mean"}),
    (OARPAdvantage, {"mode": "answer_joint", "chunk_size": 7}),
    (OARGAdvantage, {"mode": "answer_mean"}),
    (OARGAdvantage, {"mode": "answer_joint", "chunk_size": 2}),
])
def test_oar_importance_is_the_same_with_the_head_fused(cls, options):
    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=3)
    batch = _batch(tok)
    got = [cls(cls.Config(**options)).importance(batch, _handle(model, fused, tok, seed=7), rows=[0, 1, 2, 3])
           for fused in ("on", "off")]
    assert got[0][1].equal(got[1][1]) and got[0][1].any()
    # importance: gradients of read log-probs against the input embeddings, summed over each span
    ids = batch.input_ids
    n = _input_grad_length(model, ids, batch.attention_mask) + ids.shape[1]
    assert_close_fp(got[0][0], got[1][0], length=n)


@pytest.mark.parametrize("fused", ["on", "off"])
def test_the_no_grad_methods_keep_no_graph_under_a_trainable_model(fused):
    """logprobs, branch_logprobs, read_logits and branch_read_logits are no-grad whatever the
    caller's grad mode: a graph over every branch would keep the activations of a training step
    (credit-bench's RREDCoT once did, through branch_logprobs)."""
    model, _ = MODELS["llama-gqa"]()
    assert all(p.requires_grad for p in model.parameters())
    ids, mask, rows, at, branch_ids, branch_mask = _case(model.config.vocab_size, seed=2)
    handle = _handle(model, fused)
    with torch.enable_grad():
        outs = [handle.logprobs(ids, mask), handle.branch_logprobs(ids, mask, rows, at, branch_ids, branch_mask),
                handle.read_logits(ids, mask, _read(mask)),
                handle.branch_read_logits(ids, mask, rows, at, branch_ids, branch_mask, branch_mask.bool())]
    assert [o.requires_grad for o in outs] == [False] * 4


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-tied"])
@pytest.mark.parametrize("fused", ["on", "off"])
def test_input_gradients_with_a_frozen_prefix_run_it_once_and_agree(name, fused):
    """``frozen``: rows whose first columns repeat (a shared prompt) run them once without grad
    and continue from the cache; the gradient elsewhere and the read logits equal the plain pass,
    the frozen columns' gradient is 0, and a bad ``frozen`` is a clear error. ``read_logits`` with
    ``frozen`` runs each prefix once too, and gives the same logits."""
    from creditlab.step.forward import prefix_cache

    model, _ = MODELS[name]()
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, model.config.vocab_size, (2, 4), generator=g)  # two prompts, 4 tokens
    ids = torch.randint(3, model.config.vocab_size, (5, 11), generator=g)
    ids[:, :4] = prompt[torch.tensor([0, 0, 1, 0, 1])]
    mask = torch.ones_like(ids)
    mask[1, 8:], mask[4, 6:] = 0, 0  # right padding
    read = torch.zeros_like(mask, dtype=torch.bool)
    read[:, 5], read[0, 9], read[2, 10] = True, True, True
    offset = 1e-2 * torch.randn((*ids.shape, model.config.hidden_size), generator=torch.Generator().manual_seed(1))
    offset[:, :4] = 0
    weights = torch.randn((int(read.sum()), model.config.vocab_size), generator=torch.Generator().manual_seed(0))
    handle = _handle(model, fused)
    assert prefix_cache(model, ids[:, :4], mask[:, :4]) is not None  # the cached path runs here
    seen = []

    def objective(e, z):
        seen.append(z.detach())
        return (z.log_softmax(-1) * weights).sum()

    emb, grad = handle.input_gradients(ids, mask, objective, embedding_offset=offset, read=read, frozen=4)
    emb_ref, grad_ref = handle.input_gradients(ids, mask, objective, embedding_offset=offset, read=read)
    assert torch.equal(emb, emb_ref)  # the same lookup by construction
    n = lm_length(model.config, ids.shape[1])
    assert_close_fp(seen[0], seen[1], length=n)
    assert (grad[:, :4] == 0).all() and grad[:, 4:].abs().max() > 0
    assert_close_fp(grad[:, 4:], grad_ref[:, 4:], length=_input_grad_length(model, ids, mask))
    bad_offset = offset.clone()
    bad_offset[0, 1] = 1.0
    for kwargs, message in (({"frozen": 12}, "frozen must be in"), ({"frozen": 7}, "must be real tokens"),
                            ({"frozen": 6, "embedding_offset": None}, "nothing may be read"),
                            ({"frozen": 4, "embedding_offset": bad_offset}, "embedding_offset must be 0")):
        kwargs = {"embedding_offset": offset, "read": read, **kwargs}
        with pytest.raises(ValueError, match=message):
            handle.input_gradients(ids, mask, objective, **kwargs)

    # read_logits: the same logits, each distinct prefix embedded (so run) once: 2 x 4 + 5 x 7 tokens
    fed = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, inp, out: fed.append(inp[0].numel()))
    try:
        shared = handle.read_logits(ids, mask, read, frozen=4)
        assert sum(fed) == 2 * 4 + 5 * 7, fed
    finally:
        hook.remove()
    assert_close_fp(shared, handle.read_logits(ids, mask, read), length=n)
    with pytest.raises(ValueError, match="nothing may be read"):
        handle.read_logits(ids, mask, read, frozen=6)
