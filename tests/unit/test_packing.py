"""creditlab.step.packing and the update's micro-batches: rows packed by length under a token
budget (by hand), each micro-batch cut to its own longest prompt and response, and the update,
the old log-probs and the loss metrics the same as with the whole mini-batch at once."""

from __future__ import annotations

import functools

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.module import CreditAssignmentModule
from creditlab.step.packing import columns, pack_rows
from creditlab.step.rollout import RolloutConfig

from tests.helpers import tiny_model_and_tokenizer
from tests.numerics import approx_fp, assert_close_fp, lm_length
from tests.unit.test_forward import _rollout

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pack_rows_by_hand():
    rows = torch.tensor([10, 11, 12, 13, 14])
    p = torch.tensor([2, 3, 2, 3, 2])
    r = torch.tensor([1, 6, 4, 2, 9])  # totals 3, 9, 6, 5, 11
    # no token budget: consecutive runs of max_rows, as drawn
    assert [c.tolist() for c in pack_rows(rows, p, r, 2)] == [[10, 11], [12, 13], [14]]
    assert [c.tolist() for c in pack_rows(rows, p, r)] == [[10, 11, 12, 13, 14]]
    # one prompt of 3 tokens for all (MICRO_BATCH_COST = 0), budget 24: longest response first
    # (14: 9, 11: 6, 12: 4, 13: 2, 10: 1). [14] [11, 12] [13, 10] computes (3 + 9) + (3 + 2 x 6) +
    # (3 + 2 x 2) = 34 positions; [14, 11] [12, 13, 10] 21 + 15 = 36, [14, 11] [12, 13] [10] 21 +
    # 11 + 4 = 36, five micro-batches 12 + 9 + 7 + 5 + 4 = 37; [11, 12, 13] needs 3 x 9 > 24.
    same, three = torch.zeros(5, dtype=torch.long), torch.full((5,), 3)
    assert [c.tolist() for c in pack_rows(rows, three, r, 0, 24, same)] == [[14], [11, 12], [13, 10]]
    assert [c.tolist() for c in pack_rows(rows, three, r, 2, 24, same)] == [[14], [11, 12], [13, 10]]
    # one row at most: the longest response first
    assert [c.tolist() for c in pack_rows(rows, three, r, 1, 24, same)] == [[14], [11], [12], [13], [10]]
    # everything that fits at once keeps its order
    assert [c.tolist() for c in pack_rows(rows, three, r, 0, 60, same)] == [[10, 11, 12, 13, 14]]  # 5 x (3 + 9)
    # every prompt distinct (no keys): a row alone computes only its own tokens, so rows go alone
    # unless merging costs nothing (equal lengths: then fewer micro-batches win the tie)
    assert [c.tolist() for c in pack_rows(rows, p, r, 0, 24)] == [[14], [11], [12], [13], [10]]
    twins = pack_rows(rows[:4], torch.full((4,), 2), torch.tensor([5, 5, 3, 3]), 0, 14)
    assert [c.tolist() for c in twins] == [[10, 11], [12, 13]]
    assert pack_rows(rows[:0], p[:0], r[:0], 0, 8) == []
    # shared prompts: four rows of prompt 10, responses 8, 7, 2, 1, at most three a micro-batch
    # (budget 54). a and c share a prompt, b and d another: [a, b, c] runs two prompts, 2 x 10 + 3 x 8
    # = 44, and [d] 11: 55, against four rows alone 58 and [a, b] [c, d] 36 + 24 = 60.
    p4, r4 = torch.full((4,), 10), torch.tensor([8, 7, 2, 1])
    shared = pack_rows(rows[:4], p4, r4, 0, 54, prompt_keys=torch.tensor([0, 1, 0, 1]))
    assert [c.tolist() for c in shared] == [[10, 11, 12], [13]]
    assert [c.tolist() for c in pack_rows(rows[:4], p4, r4, 0, 54)] == [[10], [11], [12], [13]]
    assert columns(6, torch.tensor([2, 4]), torch.tensor([3, 1])) == (2, 3)
    assert columns(6, torch.tensor([2]), torch.tensor([0])) == (4, 1)  # at least one position


def test_loss_config_micro_batch_tokens():
    """``auto`` is the default (the runner sizes it); unresolved it packs as 0, no budget."""
    assert LossConfig().micro_batch_tokens == "auto" and LossConfig().token_budget == 0
    assert LossConfig(micro_batch_tokens=2048).token_budget == 2048 and LossConfig(micro_batch_tokens=0).token_budget == 0
    for bad in (-1, "8k", True, 2.5):
        with pytest.raises(ConfigError, match="micro_batch_tokens must be auto .sized from the memory plan. or an "
                                              "integer >= 0 .0 = no token budget."):
            LossConfig(micro_batch_tokens=bad)


def _module(micro_rows=0, micro_tokens=0, fused="auto"):
    model, tok = tiny_model_and_tokenizer(seed=2)
    module = CreditAssignmentModule(
        model, tok, None, None, [],
        LossConfig(micro_batch_size=micro_rows, micro_batch_tokens=micro_tokens, fused_head=fused),
        RolloutConfig(temperature=0.8), EvalConfig(every=0), functools.partial(torch.optim.SGD, lr=0.1), seed=0,
    )
    module.manual_backward = lambda loss: loss.backward()
    return module


@pytest.mark.numerics
@pytest.mark.parametrize("fused", ["off", "on"])
def test_packed_micro_batches_give_the_whole_batch_update(fused):
    """Rows packed under a token budget and cut to their own columns: the summed gradients, loss
    shares, entropy and the old log-probs equal the whole mini-batch's (float rounding)."""
    batch = _rollout(prompt_lens=(2, 7, 4), group=4, seed=11)
    adv = torch.linspace(-1.0, 1.0, batch.size)[:, None].expand_as(batch.response_mask).contiguous()
    out = {}
    for name, kw in (("whole", {}), ("packed", {"micro_tokens": 30}), ("rows", {"micro_rows": 5})):
        module = _module(fused=fused, **kw)
        rows = torch.arange(batch.size)
        chunks = module.micro_batches(batch, rows)
        if name == "packed":
            widths = [batch.prompt_len - module.columns(batch, c)[0] + module.columns(batch, c)[1] for c in chunks]
            assert len(chunks) > 2 and all(len(c) * w <= 30 or len(c) == 1 for c, w in zip(chunks, widths))
            assert sorted(torch.cat(chunks).tolist()) == rows.tolist()
        stats = MiniBatchStats.from_mask(batch.loss_mask, module.loss_cfg)
        with torch.no_grad():
            old = module.old_logprobs(batch)
        parts: dict[str, float] = {}
        for c in chunks:
            for k, v in module.backward_rows(batch, adv, c, stats, old, None).items():
                parts[k] = max(parts.get(k, 0.0), v) if k.endswith("_max") else parts.get(k, 0.0) + v
        grads = {n: q.grad.clone() for n, q in module.policy.named_parameters()}
        out[name] = old, parts, grads
    old_w, parts_w, g_w = out["whole"]
    config, seq = module.policy.config, batch.input_ids.shape[1]
    n, tokens = lm_length(config, seq), int(batch.loss_mask.sum())
    n_grad = lm_length(config, seq, backward=True, tokens=int(batch.attention_mask.sum()))
    for name in ("packed", "rows"):
        old, parts, g = out[name]
        assert_close_fp(old, old_w, length=n)
        assert parts.keys() == parts_w.keys()
        for k in parts:  # sums of `tokens` per-token values of scale >= 1 (see test_token_logprobs)
            want = float(parts_w[k])
            assert parts[k] == approx_fp(want, length=tokens + n, scale=max(1.0, abs(want)), where=k), (name, k)
        for p in g:
            assert_close_fp(g[p], g_w[p], length=n_grad, msg=f"{name} {p}")


def test_micro_batch_columns_cut_only_padding():
    batch = _rollout(prompt_lens=(2, 7, 4), group=4, seed=11)
    module = _module(micro_tokens=30)
    for c in module.micro_batches(batch, torch.arange(batch.size)):
        start, t = module.columns(batch, c)
        p = batch.prompt_len
        assert (batch.attention_mask[c, :start] == 0).all() and (batch.response_mask[c, t:] == 0).all()
        assert batch.attention_mask[c, start].any() and batch.response_mask[c, t - 1].any()
        assert (batch.attention_mask[c, p + t :] == 0).all()


def test_partition_is_the_best_contiguous_cut_by_brute_force():
    """Random small mini-batches: the cut equals the best of every cut of the sorted rows into
    contiguous runs that fit (fewest positions computed, each distinct prompt once a run, plus
    MICRO_BATCH_COST a run; then fewest micro-batches)."""
    import itertools

    from creditlab.step.packing import MICRO_BATCH_COST, _partition

    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 8, (1,), generator=g))
        r = sorted(torch.randint(0, 40, (n,), generator=g).tolist(), reverse=True)
        p = torch.randint(1, 30, (n,), generator=g).tolist()
        keys = torch.randint(0, 3, (n,), generator=g).tolist()
        budget, max_rows = int(torch.randint(20, 300, (1,), generator=g)), int(torch.randint(0, 4, (1,), generator=g))

        def fits(a, b):
            size = b - a
            return size == 1 or (size * (max(p[a:b]) + r[a]) <= budget and not 0 < max_rows < size)

        def cost(cuts):
            runs = list(zip(cuts, cuts[1:]))
            positions = sum(len(set(keys[a:b])) * max(p[a:b]) + (b - a) * r[a] + MICRO_BATCH_COST for a, b in runs)
            return positions, len(runs)

        best = min(cost([0, *inner, n]) for k in range(n) for inner in itertools.combinations(range(1, n), k)
                   if all(fits(a, b) for a, b in zip([0, *inner], [*inner, n])))
        got = _partition(p, r, keys, max_rows, budget)
        assert got[0] == 0 and got[-1] == n
        assert cost(got) == best
