"""The credit controls (creditlab_controls) by hand on scripted batches: where the blame goes,
that the loss normalises exactly as GRPO's, and the known-size reward flip."""

from __future__ import annotations

import math

import pytest
import torch
from creditlab import ConfigError, InputError
from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.losses import LossConfig, policy_loss
from creditlab.step.rollout import collate
from creditlab.testing import FakePolicyHandle
from creditlab.types import Completion, Problem, Trajectory
from creditlab_controls.advantage import (
    AntiCreditAdvantage,
    OracleCreditAdvantage,
    RewardFlipAdvantage,
    ShamCreditAdvantage,
)
from creditlab_grpo.advantage import GRPOAdvantage

from tests.helpers import THOUGHT, char_tokenizer

TOK = char_tokenizer()
#: GRPO's advantage in a group of two right and two wrong chains (sample std sqrt(1/3), eps 1e-6).
A = 0.5 / (math.sqrt(1 / 3) + 1e-6)


def traj(text: str, reward: float, oracle, group: int = 0) -> Trajectory:  # noqa: ANN001
    ids = tuple(TOK.encode(text, add_special_tokens=False))
    comp = Completion((5,), ids, tuple(-0.1 for _ in ids), "stop", text)
    return Trajectory(Problem(f"p{group}", "p", "1", oracle=oracle), comp, reward, group)


def batch(first_wrong_2=lambda th: 1, first_wrong_3=lambda th: 0):  # noqa: ANN001
    """Rows 0-1 right; row 2 three thoughts of 3 tokens, wrong from thought 1 (a right prefix of
    3 tokens); row 3 two thoughts, wrong from thought 0 (no right prefix)."""
    three, two = f"ab{THOUGHT}cd{THOUGHT}ef{THOUGHT}", f"ab{THOUGHT}cd{THOUGHT}"
    return collate([traj("1", 1.0, lambda th: None), traj("2", 1.0, lambda th: None),
                    traj(three, 0.0, first_wrong_2), traj(two, 0.0, first_wrong_3)], TOK.pad_token_id)


def estimate(cls, b, seed: int = 0):  # noqa: ANN001
    return cls().estimate(b, FakePolicyHandle(tokenizer=TOK, seed=seed))


def test_grpo_advantages_by_hand() -> None:
    b = batch()
    values = GRPOAdvantage().estimate(b).values
    assert values[0, 0].item() == pytest.approx(A) and values[2, :9].tolist() == pytest.approx([-A] * 9)


def test_oracle_credit_blames_only_from_the_first_wrong_thought() -> None:
    b = batch()
    out = estimate(OracleCreditAdvantage, b)
    grpo = GRPOAdvantage().estimate(b).values
    assert out.values[2, :9].tolist() == pytest.approx([0.0] * 3 + [-A] * 6)
    assert torch.equal(out.values[3], grpo[3])  # first thought wrong: nothing to spare
    assert torch.equal(out.values[:2], grpo[:2])  # right chains keep GRPO's credit
    m = out.metrics
    assert m["blamed_rows"] == 2 and m["no_error_rows"] == 0
    assert m["removed_share"] == pytest.approx((3 / 9 + 0) / 2)
    assert m["prefix_share"] == pytest.approx((3 / 9 + 0) / 2)


def test_anti_credit_blames_only_the_right_prefix() -> None:
    b = batch()
    out = estimate(AntiCreditAdvantage, b)
    assert out.values[2, :9].tolist() == pytest.approx([-A] * 3 + [0.0] * 6)
    assert (out.values[3] == 0).all()  # no right prefix: no blame at all
    assert out.metrics["removed_share"] == pytest.approx((6 / 9 + 1) / 2)


def test_sham_removes_as_much_blame_as_the_oracle_at_a_uniform_random_place() -> None:
    b = batch()
    starts = set()
    for seed in range(60):
        row = estimate(ShamCreditAdvantage, b, seed).values[2, :9]
        zeros = (row == 0).nonzero().flatten().tolist()
        assert len(zeros) == 3 and zeros == list(range(zeros[0], zeros[0] + 3))  # one window of m = 3
        assert row.sum().item() == pytest.approx(-6 * A)  # the oracle's amount of blame kept
        starts.add(zeros[0])
        # its first draw decides row 2's window: start ~ U{0, ..., 9 - 3}
        expect = int(torch.randint(0, 7, (1,), generator=torch.Generator().manual_seed(seed)))
        assert zeros[0] == expect
    assert starts == set(range(7))
    out = estimate(ShamCreditAdvantage, b)
    assert out.metrics["removed_share"] == pytest.approx(out.metrics["prefix_share"])


def test_rows_the_oracle_finds_right_keep_grpo_and_are_counted() -> None:
    b = batch(first_wrong_2=lambda th: None)
    out = estimate(OracleCreditAdvantage, b)
    assert out.values[2, :9].tolist() == pytest.approx([-A] * 9)
    assert out.metrics["no_error_rows"] == 1


def test_oracle_past_the_last_thought_is_clamped() -> None:
    b = batch(first_wrong_2=lambda th: 7)  # e.g. a missing answer blamed after the operations
    out = estimate(OracleCreditAdvantage, b)
    assert out.values[2, :9].tolist() == pytest.approx([0.0] * 6 + [-A] * 3)


@pytest.mark.parametrize("cls", [OracleCreditAdvantage, ShamCreditAdvantage, AntiCreditAdvantage])
def test_the_loss_normalises_exactly_as_grpo(cls) -> None:  # noqa: ANN001
    """Same trained tokens and denominators: on every token that keeps its blame the gradient
    of the loss is GRPO's exactly; elsewhere it is 0 (seq-mean-token-mean and token-mean)."""
    b = batch()
    grpo = GRPOAdvantage().estimate(b).values
    control = estimate(cls, b).values
    for agg in ("seq-mean-token-mean", "token-mean"):
        cfg = LossConfig(mode="reinforce", agg=agg)
        stats = MiniBatchStats.from_mask(b.loss_mask, cfg)
        grads = []
        for adv in (grpo, control):
            logp = torch.zeros_like(b.loss_mask, requires_grad=True)
            loss, _ = policy_loss(logp, None, adv, b.loss_mask, cfg, stats)
            loss.backward()
            grads.append(logp.grad)
        kept = (control != 0) & (b.loss_mask > 0)
        assert torch.equal(grads[1][kept], grads[0][kept])
        assert (grads[1][(control == 0)] == 0).all()


def test_the_controls_need_an_oracle_and_a_tokenizer() -> None:
    b = collate([traj("1", 1.0, None), traj(f"ab{THOUGHT}", 0.0, None)], TOK.pad_token_id)
    with pytest.raises(InputError, match="step oracle"):
        estimate(OracleCreditAdvantage, b)
    with pytest.raises(InputError, match="tokenizer"):
        OracleCreditAdvantage().estimate(batch(), FakePolicyHandle())
    with pytest.raises(ConfigError, match="delimiter"):
        OracleCreditAdvantage.Config(delimiter="")


def test_reward_flip_by_hand_and_its_rate() -> None:
    b = batch()
    seed = 3
    flip = torch.rand(4, generator=torch.Generator().manual_seed(seed)) < 0.25
    flipped = torch.where(flip, 1 - b.rewards, b.rewards)
    out = RewardFlipAdvantage().estimate(b, FakePolicyHandle(seed=seed))
    expect = GRPOAdvantage().from_rewards(b, flipped).values
    assert torch.equal(out.values, expect) and out.metrics["flipped"] == int(flip.sum())
    # the share flipped over many rows is the rate; rate 0 is GRPO
    many = collate([traj("1", float(i % 2), None, group=i // 8) for i in range(4000)], TOK.pad_token_id)
    out = RewardFlipAdvantage(RewardFlipAdvantage.Config(rate=0.3)).estimate(many, FakePolicyHandle(seed=1))
    assert abs(out.metrics["flipped"] / 4000 - 0.3) < 0.03
    zero = RewardFlipAdvantage(RewardFlipAdvantage.Config(rate=0.0)).estimate(b, FakePolicyHandle())
    assert torch.equal(zero.values, GRPOAdvantage().estimate(b).values)


def test_reward_flip_shrinks_the_expected_centred_signal_to_one_minus_two_rate() -> None:
    """Dr. GRPO centring (std none): E[advantage | reward] = (1 - 2 rate) x GRPO's."""
    rows = [traj("1", float(i % 4 == 0), None, group=i // 4) for i in range(40000)]
    many = collate(rows, TOK.pad_token_id)
    cfg = RewardFlipAdvantage.Config(rate=0.2, std="none")
    flip = RewardFlipAdvantage(cfg).estimate(many, FakePolicyHandle(seed=0)).values[:, 0]
    plain = GRPOAdvantage(GRPOAdvantage.Config(std="none")).estimate(many).values[:, 0]
    right = many.rewards == 1
    assert flip[right].mean().item() == pytest.approx((1 - 2 * 0.2) * plain[right].mean().item(), rel=0.05)


def test_reward_flip_refuses_rewards_outside_0_1_and_rates_from_half() -> None:
    b = collate([traj("1", 2.0, None), traj("2", 0.0, None)], TOK.pad_token_id)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        RewardFlipAdvantage().estimate(b, FakePolicyHandle())
    with pytest.raises(ConfigError, match="0.5"):
        RewardFlipAdvantage.Config(rate=0.5)


def test_oracle_credit_on_a_real_word_problem_blames_from_its_first_wrong_line() -> None:
    """The word-problem task's own oracle (GSM8K's gold steps) through oracle_credit with lines as
    thoughts (``delimiter="\\n"``, experiment=smollm2_word_problems_grpo): the wrong chain's first
    line is right (48/2 = 24), its second is an arithmetic slip, so only the first line's tokens
    lose their blame; with ``</thought>`` the whole solution would be one thought and nothing would."""
    import functools
    import string

    from creditlab_wordproblems.arithmetic import to_number
    from creditlab_wordproblems.steps import first_wrong_step, gsm8k_steps

    tok = char_tokenizer(string.ascii_letters + string.digits + " .,$*/+-=#\n")
    question = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
                "May. How many clips did Natalia sell altogether in April and May?")
    gold = gsm8k_steps("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                       "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
    oracle = functools.partial(first_wrong_step, question, gold, to_number("72"))
    right = "She sold 48/2 = 24 in May.\nSo 48+24 = 72 in all.\n#### 72"
    wrong = "She sold 48/2 = 24 in May.\nSo 48+24 = 73 in all.\n#### 73"
    assert oracle(right.split("\n")) is None and oracle([line + "\n" for line in wrong.split("\n")]) == 1

    def row(text: str, reward: float) -> Trajectory:
        ids = tuple(tok.encode(text, add_special_tokens=False))
        comp = Completion((5,), ids, tuple(-0.1 for _ in ids), "stop", text)
        return Trajectory(Problem("natalia", question, "72", oracle=oracle), comp, reward, 0)

    b = collate([row(right, 1.0), row(right, 1.0), row(wrong, 0.0), row(wrong, 0.0)], tok.pad_token_id)
    handle = FakePolicyHandle(tokenizer=tok, seed=0)
    lines = OracleCreditAdvantage(OracleCreditAdvantage.Config(delimiter="\n")).estimate(b, handle)
    grpo = GRPOAdvantage().estimate(b).values
    first = len("She sold 48/2 = 24 in May.\n")  # the right line's tokens, one a character
    n = len(wrong)
    assert lines.values[2, :first].tolist() == [0.0] * first
    assert lines.values[2, first:n].tolist() == pytest.approx(grpo[2, first:n].tolist())
    assert torch.equal(lines.values[:2], grpo[:2]) and lines.metrics["no_error_rows"] == 0
    whole = OracleCreditAdvantage(OracleCreditAdvantage.Config(delimiter=THOUGHT)).estimate(b, handle)
    assert torch.equal(whole.values, grpo)  # one thought: the oracle's line 1 clamps to thought 0
