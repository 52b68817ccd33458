"""IBPO (arXiv 2605.16302): alignment, contrast weights by hand, mass preservation, GRPO fallback,
repair mode with a scripted policy, and the estimator contract."""

from __future__ import annotations

import math

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.registry import build_part
from creditlab.step.rollout import collate, with_segments
from creditlab.testing import FakePolicyHandle, check_part, make_batch, pad_batch
from creditlab.types import Completion, Problem, Segments, Trajectory
from creditlab_grpo.advantage import GRPOAdvantage
from creditlab_ibpo.advantage import IBPOAdvantage, repair_prompt
from creditlab_ibpo.align import align, segment_matches, similarity, token_matches

PROBLEM = Problem("p0", "Start 2, *7, +5. ", "19")


def _traj(ids, reward, group=0, tf=0, text=""):
    c = Completion((7, 8), tuple(ids), tuple(-0.1 for _ in ids), "eos", text)
    return Trajectory(PROBLEM, c, float(reward), group, tf)


def _batch(rows, segments=None):
    """``rows``: (ids, reward, group[, trainable_from[, text]]) tuples."""
    batch = collate([_traj(*r) for r in rows], pad_id=0)
    return with_segments(batch, Segments(tuple(segments))) if segments is not None else batch


def _ibpo(**kw):
    return IBPOAdvantage(IBPOAdvantage.Config(**kw))


def _chunks(batch, size=3):
    """Segments of ``size`` tokens over each row's response."""
    spans = []
    for n in batch.response_mask.sum(1).long().tolist():
        spans.append(tuple((s, min(s + size, n)) for s in range(0, n, size)))
    return with_segments(batch, Segments(tuple(spans)))


A = 0.5 / math.sqrt(0.5)  # GRPO advantage of a 1/0 pair (sample std), up to eps


# -- alignment --------------------------------------------------------------------------------
def test_token_alignment_by_hand():
    ma, mb = token_matches([1, 2, 9, 4], [1, 2, 3, 4])
    assert ma == [True, True, False, True] and mb == [True, True, False, True]
    # [1,2,3] matches first, then [5] on the right; min_match=2 drops that single-token block.
    assert token_matches([1, 2, 3, 9, 5], [1, 2, 3, 8, 5])[0] == [True, True, True, False, True]
    kept, _ = token_matches([1, 2, 3, 9, 5], [1, 2, 3, 8, 5], min_match=2)
    assert kept == [True, True, True, False, False]
    assert token_matches([], [1, 2]) == ([], [False, False])
    assert similarity(ma, mb) == pytest.approx(6 / 8)


def test_segment_alignment_within_differing_segments_by_hand():
    # thoughts ending in 0: [1,2,0][3,4,0][5,6,0] vs [1,2,0][3,5,0][7,6,0]
    a, b = [1, 2, 0, 3, 4, 0, 5, 6, 0], [1, 2, 0, 3, 5, 0, 7, 6, 0]
    spans = ((0, 3), (3, 6), (6, 9))
    ma, mb = segment_matches(a, spans, b, spans)
    # first thoughts equal; in [3,4,0,5,6,0] vs [3,5,0,7,6,0]: [6,0], then [3], then [0] match
    assert ma == [True, True, True, True, False, True, False, True, True]
    assert mb == [True, True, True, True, False, True, False, True, True]


def test_segment_alignment_matches_whole_thoughts_first():
    a, b = [1, 2, 0, 5, 0], [5, 0, 8, 1, 2, 0]
    # tokens: the longest block [1,2,0] wins; segments: the identical thought [5,0] wins
    assert align(a, b)[0] == [True, True, True, False, False]
    seg = align(a, b, ((0, 3), (3, 5)), ((0, 2), (2, 6)))
    assert seg == ([False, False, False, True, True], [True, True, False, False, False, False])
    with pytest.raises(ValueError, match="partition"):
        segment_matches(a, ((0, 3),), b, ((0, 6),))


# -- contrast ---------------------------------------------------------------------------------
def test_contrast_pair_by_hand_mass_and_floor():
    batch = _batch([([1, 2, 3, 4], 1.0, 0), ([1, 2, 9, 4], 0.0, 0)])
    est = _ibpo(w_min=0.1, granularity="token")
    out = est.estimate(batch, FakePolicyHandle())
    grpo = GRPOAdvantage().estimate(batch).values
    a = grpo[:, 0].double()
    assert a[0] == pytest.approx(A, rel=1e-5) and a[1] == pytest.approx(-A, rel=1e-5)
    w = torch.tensor([0.1, 0.1, 1.0, 0.1], dtype=torch.float64) * 4 / 1.3  # position 2 diverges
    torch.testing.assert_close(out.values.double(), a[:, None] * w, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(out.values.double().sum(1), 4 * a, rtol=1e-6, atol=1e-7)
    ratio = out.values[:, 0] / out.values[:, 2]
    torch.testing.assert_close(ratio, torch.full((2,), 0.1), rtol=1e-5, atol=0)
    m = out.metrics
    assert m["divergent_frac"] == pytest.approx(2 / 8)
    assert m["divergent_mass_frac"] == pytest.approx(4 / 5.2)
    assert (m["mixed_groups"], m["fallback_groups"], m["aligned_pairs"]) == (1, 0, 1)
    assert est.metrics() == {}  # one channel: the metrics travel with the advantages
    again = est.estimate(batch, FakePolicyHandle()).metrics  # per call, not accumulated
    assert again["divergent_frac"] == pytest.approx(0.25) and again["weighted_tokens"] == m["weighted_tokens"]


def test_shared_fraction_over_several_opposite_rows():
    rows = [([1, 2, 3, 4], 1.0, 0), ([1, 2, 9, 4], 0.0, 0), ([1, 7, 3, 4], 0.0, 0)]
    batch = _batch(rows)
    grpo = GRPOAdvantage().estimate(batch).values
    # the correct row matches i1 on [T,T,F,T] and i2 on [T,F,T,T]: hits [2,1,1,2] of 2
    half = _ibpo(shared_fraction=0.5, granularity="token").estimate(batch, None).values
    torch.testing.assert_close(half[0], grpo[0])  # every token shared with half: uniform
    full = _ibpo(shared_fraction=1.0, w_min=0.0, granularity="token").estimate(batch, None).values
    a0 = float(grpo[0, 0])
    torch.testing.assert_close(full[0], torch.tensor([0.0, 2 * a0, 2 * a0, 0.0]))
    # incorrect rows have one opposite row: i1 diverges at position 2 only
    torch.testing.assert_close(full[1], torch.tensor([0.0, 0.0, 4 * float(grpo[1, 0]), 0.0]))


def test_single_outcome_groups_are_exactly_grpo_and_w_min_one_is_grpo():
    rewards = [1, 1, 1, 1, 0, 0, 0, 0, 0.5, 0, 0.2, 0]  # third group: all below success_reward
    batch = _chunks(make_batch(groups=3, group_size=4, seed=3, rewards=rewards))
    est = _ibpo()
    out = est.estimate(batch, None)
    assert torch.equal(out.values, GRPOAdvantage().estimate(batch).values)
    assert out.metrics["fallback_groups"] == 3 and out.metrics["weighted_tokens"] == 0
    assert out.values[8:].abs().sum() > 0  # non-zero GRPO advantages kept uniform
    mixed = make_batch(groups=3, group_size=4, seed=5, trainable_from=[0, 2, 0, 1] * 3)
    one = _ibpo(w_min=1.0).estimate(mixed, None).values
    torch.testing.assert_close(one, GRPOAdvantage().estimate(mixed).values)


@pytest.mark.parametrize("granularity", ["segment", "token"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mass_preserved_masked_zero_finite_deterministic_padding(granularity, seed):
    batch = make_batch(groups=3, group_size=4, seed=seed, trainable_from=[0, 2, 0, 3] * 3)
    batch = _chunks(batch)
    est = _ibpo(granularity=granularity, w_min=0.05)
    values = est.estimate(batch, None).values
    grpo = GRPOAdvantage().estimate(batch).values
    a = grpo.double().sum(1) / batch.loss_mask.double().sum(1).clamp(min=1)  # A_i
    torch.testing.assert_close(values.double().sum(1), a * batch.loss_mask.double().sum(1),
                               rtol=1e-5, atol=1e-6)
    assert (values[batch.loss_mask == 0] == 0).all() and torch.isfinite(values).all()
    assert torch.equal(values, est.estimate(batch, None).values)
    padded = est.estimate(pad_batch(batch, 7), None).values
    assert torch.equal(padded[:, : values.shape[1]], values)
    assert (padded[:, values.shape[1]:] == 0).all()
    # sign of every trained token follows A_i
    assert (values * grpo >= 0).all()


def test_shared_tokens_get_w_min_relative_to_divergent_on_random_batches():
    batch = make_batch(groups=2, group_size=4, seed=7, max_len=10)
    est = _ibpo(w_min=0.25, granularity="token")
    v = est.estimate(batch, None).values
    for row in range(batch.size):
        vals = v[row][batch.loss_mask[row] > 0].abs().unique()
        if vals.numel() == 2:  # shared and divergent tokens present
            torch.testing.assert_close(vals[0] / vals[1], torch.tensor(0.25), rtol=1e-5, atol=0)
        assert vals.numel() <= 2


def test_contract_in_every_mode():
    check_part("advantage", _ibpo())
    check_part("advantage", _ibpo(granularity="token", min_match=2))
    check_part("advantage", _ibpo(mode="repair"))  # the fake handle's default rollouts
    part = build_part("advantage", {"name": "ibpo", "mode": "repair", "w_min": 0.2})
    assert isinstance(part, IBPOAdvantage) and part.config.w_min == 0.2


def test_config_errors():
    for bad in ({"mode": "oracle"}, {"w_min": 1.5}, {"shared_fraction": 0.0},
                {"granularity": "line"}, {"min_match": 0}, {"std": "mad"}):
        with pytest.raises(ConfigError):
            IBPOAdvantage.Config(**bad)


# -- repair -----------------------------------------------------------------------------------
GOOD, BAD = [1, 2, 3, 4, 5], [1, 2, 9, 9, 5]
PAIR = [(GOOD, 1.0, 0, 0, "good text"), (BAD, 0.0, 0, 0, "bad text")]


def _scripted(repair, reward=1.0, calls=None):
    def rollout_fn(problems, requests):
        if calls is not None:
            calls.append((list(problems), list(requests)))
        if isinstance(repair, Exception):
            raise repair
        out = []
        for p, r in zip(problems, requests):
            c = Completion(r.prompt_ids, tuple(repair), tuple(-0.1 for _ in repair), "eos", "")
            out.append(Trajectory(p, c, reward, -1, 0))
        return out

    return FakePolicyHandle(rollout_fn=rollout_fn)


def test_repair_marks_replaced_tokens_of_the_incorrect_row():
    batch = _batch(PAIR)
    calls = []
    ctx = _scripted([1, 2, 3, 9, 5], calls=calls)
    est = _ibpo(mode="repair", w_min=0.1)
    out = est.estimate(batch, ctx)
    grpo = GRPOAdvantage().estimate(batch).values
    torch.testing.assert_close(out.values[0], grpo[0])  # the correct row stays uniform
    # BAD vs repair: [1,2] and [9,5] kept, position 2 replaced (contrast would also flag 3)
    w = torch.tensor([0.1, 0.1, 1.0, 0.1, 0.1]) * 5 / 1.4
    torch.testing.assert_close(out.values[1], grpo[1] * w)
    (problems, requests), = calls
    assert problems == [PROBLEM]
    want = FakePolicyHandle().encode(repair_prompt(PROBLEM.prompt, "bad text", "good text"))
    assert requests[0].prompt_ids == want and requests[0].prefix_ids == ()
    m = out.metrics
    assert (m["repair_requests"], m["repair_failures"], m["repair_tokens"]) == (1, 0, 5)
    assert m["repair_correct_rate"] == 1.0


@pytest.mark.parametrize("case", ["raises", "empty", "eos_only", "rejected", "unchanged"])
def test_repair_failures_fall_back_to_contrast(case):
    from tests.helpers import char_tokenizer

    batch = _batch(PAIR)
    repair, reward, kw = [1, 2, 3, 9, 5], 1.0, {}
    if case == "raises":
        repair = RuntimeError("backend down")
    elif case == "empty":
        repair = []
    elif case == "eos_only":
        repair = [1]  # <eos> of the char tokenizer
    elif case == "rejected":
        reward, kw = 0.0, {"require_correct": True}
    else:
        repair = BAD
    ctx = _scripted(repair, reward)
    if case == "eos_only":
        ctx._tokenizer = char_tokenizer()
    out = _ibpo(mode="repair", **kw).estimate(batch, ctx)
    contrast = _ibpo(mode="contrast").estimate(batch, None).values
    grpo = GRPOAdvantage().estimate(batch).values
    torch.testing.assert_close(out.values[1], contrast[1])
    torch.testing.assert_close(out.values[0], grpo[0])
    key = "repair_unchanged" if case == "unchanged" else "repair_failures"
    assert out.metrics[key] == 1
    assert torch.isfinite(out.values).all()


def test_repair_skips_groups_without_both_outcomes_and_needs_no_policy_there():
    batch = _batch([(GOOD, 0.0, 0), (BAD, 0.0, 0), (GOOD, 1.0, 1)])
    ctx = _scripted(RuntimeError("must not be called"))
    out = _ibpo(mode="repair").estimate(batch, ctx)
    assert out.metrics["repair_requests"] == 0 and out.metrics["fallback_groups"] == 2
    assert torch.equal(out.values, GRPOAdvantage().estimate(batch).values)


@pytest.mark.usefixtures("one_thread")
def test_repair_through_the_real_policy_handle_and_sampler():
    """A tiny random model repairs through ``ModelPolicyHandle.rollouts`` (HF backend, arith
    verifier, the run's sampler): counted, deterministic, mass preserved."""
    from creditlab.backends.hf import HFBackend
    from creditlab.step.policy import ModelPolicyHandle
    from creditlab.step.rollout import RolloutConfig, RolloutSampler
    from creditlab_arith.task import ArithTask
    from creditlab_arith.verifier import ArithVerifier

    from tests.helpers import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer()
    problem = ArithTask(ArithTask.Config(num_train=1, num_test=1)).load("test")[0]
    good = problem.metadata["solution"]
    bad = good.replace("\\boxed{", "\\boxed{1")
    trajs = []
    for text, reward in ((good, 1.0), (bad, 0.0), (bad + " ", 0.0)):
        ids = tuple(tok.encode(text, add_special_tokens=False)) + (tok.eos_token_id,)
        c = Completion(tuple(tok.encode(problem.prompt)), ids, (0.0,) * len(ids), "eos", text)
        trajs.append(Trajectory(problem, c, reward, 0, 0))
    batch = collate(trajs, tok.pad_token_id)
    backend = HFBackend(model=model, tokenizer=tok)
    sampler = RolloutSampler(RolloutConfig(max_new_tokens=6), backend, ArithVerifier())

    def run():
        ctx = ModelPolicyHandle(model, tok, backend, torch.Generator().manual_seed(3),
                                rollout_fn=sampler)
        return _ibpo(mode="repair").estimate(batch, ctx)

    out = run()
    assert out.metrics["repair_requests"] == 2
    assert sampler.take_generated_tokens() == out.metrics["repair_tokens"] > 0
    assert torch.equal(out.values, run().values)
    grpo = GRPOAdvantage().estimate(batch).values
    torch.testing.assert_close(out.values.sum(1), grpo.sum(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.values[0], grpo[0])
    assert torch.isfinite(out.values).all() and (out.values[batch.loss_mask == 0] == 0).all()
