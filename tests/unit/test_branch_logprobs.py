"""PolicyHandle.branch_logprobs: continuations branching off shared trunks, each trunk run once
(KV cache) on a real model, equal to the plain default that runs every ``trunk[:at] + branch``."""

import pytest
import torch
from creditlab.interfaces import PolicyHandle
from creditlab.step.forward import branch_logits
from creditlab.step.policy import ModelPolicyHandle

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import assert_close_fp, lm_length

pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def handle():
    model, tok = tiny_model_and_tokenizer()
    model.eval()
    return ModelPolicyHandle(model, tok, None, torch.Generator().manual_seed(0), temperature=0.7)


def _case(vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = [9, 5, 12]
    ids = torch.zeros((3, 12), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, n in enumerate(lengths):
        ids[b, :n] = torch.randint(3, vocab, (n,), generator=g)
        mask[b, :n] = 1
    rows = torch.tensor([0, 0, 1, 2, 2, 2, 1])
    at = torch.tensor([1, 9, 5, 3, 12, 7, 2])  # from the first token to the whole trunk
    branch_ids = torch.randint(3, vocab, (7, 4), generator=g)
    branch_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0],
                                [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    return ids, mask, rows, at, branch_ids * branch_mask, branch_mask


def _length(handle, case):
    """Rounded terms behind one branch log-prob: a trunk and its branch, one sequence."""
    return lm_length(handle.model.config, case[0].shape[1] + case[4].shape[1])


def test_cached_branches_equal_full_sequences(handle):
    case = _case(handle.model.config.vocab_size)
    assert branch_logits(handle.model, *case) is not None  # the cached path runs for a Llama
    fast = handle.branch_logprobs(*case)
    plain = PolicyHandle.branch_logprobs(handle, *case)  # the default: one full forward per branch
    assert fast.shape == plain.shape == case[4].shape
    assert_close_fp(fast, plain, length=_length(handle, case))
    assert (fast[case[5] == 0] == 0).all() and (fast[case[5] > 0] < 0).all()


def test_chunked_branches_and_no_branches(handle):
    case = _case(handle.model.config.vocab_size, seed=1)
    whole = handle.branch_logprobs(*case)
    handle.micro_batch_size = 2
    try:
        assert_close_fp(handle.branch_logprobs(*case), whole, length=_length(handle, case))
    finally:
        handle.micro_batch_size = 0
    empty = handle.branch_logprobs(case[0], case[1], torch.zeros(0, dtype=torch.long),
                                   torch.zeros(0, dtype=torch.long), torch.zeros((0, 4), dtype=torch.long),
                                   torch.zeros((0, 4), dtype=torch.long))
    assert empty.shape == (0, 4)
