"""Credit-quality metrics (METHODS.md §7) by hand on a two-row batch."""

from __future__ import annotations

import pytest
import torch
from creditlab.step.credit import CreditMetrics
from creditlab.step.rollout import collate
from creditlab.types import Completion, Problem, Trajectory

from tests.helpers import THOUGHT, char_tokenizer

TOK = char_tokenizer()


def traj(text: str, reward: float, oracle) -> Trajectory:  # noqa: ANN001
    ids = tuple(TOK.encode(text, add_special_tokens=False))
    comp = Completion((5,), ids, tuple(0.0 for _ in ids), "stop", text)
    return Trajectory(Problem("p", "p", "1", oracle=oracle), comp, reward, 0)


def test_mass_shares_and_rank_by_hand() -> None:
    # Three thoughts "ab</thought>" (3 tokens each); the oracle blames thought 1 (0-based).
    text = f"ab{THOUGHT}cd{THOUGHT}ef{THOUGHT}"
    batch = collate([traj(text, 0.0, lambda th: 1), traj(text, 1.0, lambda th: 1)], TOK.pad_token_id)
    adv = torch.zeros_like(batch.loss_mask)
    adv[0, 0:3] = -1.0  # thought 0: mass 3
    adv[0, 3:6] = -2.0  # thought 1: mass 6, the strongest
    adv[0, 6:9] = 0.5   # thought 2: positive, no negative mass
    adv[1] = 5.0        # a correct row is not scored
    m = CreditMetrics(TOK, THOUGHT)(batch, adv)
    assert m["scored"] == 1 and m["with_negative_mass"] == 1
    assert m["neg_mass_before"] == pytest.approx(3 / 9)
    assert m["neg_mass_at"] == pytest.approx(6 / 9)
    assert m["neg_mass_after"] == pytest.approx(0.0)
    assert m["first_wrong_rank"] == 1 and m["first_wrong_rank_relative"] == 0.0


def test_uniform_advantage_spreads_mass_by_length_and_no_oracle_gives_nothing() -> None:
    text = f"a{THOUGHT}bcd{THOUGHT}"
    batch = collate([traj(text, 0.0, lambda th: 0)], TOK.pad_token_id)
    adv = -batch.loss_mask
    m = CreditMetrics(TOK, THOUGHT)(batch, adv)
    assert m["neg_mass_at"] == pytest.approx(2 / 6) and m["neg_mass_after"] == pytest.approx(4 / 6)
    assert m["first_wrong_rank"] == 1  # ties: equal |A| everywhere
    no_oracle = collate([traj(text, 0.0, None)], TOK.pad_token_id)
    assert CreditMetrics(TOK, THOUGHT)(no_oracle, adv) == {}
