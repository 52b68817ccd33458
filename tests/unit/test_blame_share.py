"""sweeps/blame_share.py: the shares and the logit-gradient norm it reports, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import load_script


@pytest.fixture(scope="module")
def blame_share():
    return load_script("sweeps/blame_share.py")


def test_shares_split_the_weight_around_the_first_wrong_thought(blame_share):
    spans = ((0, 1), (1, 2), (2, 4))
    assert blame_share.shares([1, 1, 2, 4], spans, 1) == (0.125, 0.125, 0.75)
    assert blame_share.shares([1, 1, 2, 4], spans, 0) == (0.0, 0.125, 0.875)
    assert blame_share.shares([0, 0, 0, 0], spans, 2) == (0.0, 0.0, 0.0)  # no weight: no share, no error


def test_logit_gradient_norm_vanishes_on_a_certain_token(blame_share):
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.5, 0.25, 0.25]])
    norms = blame_share.logit_gradient_norms(probs, torch.tensor([0, 1, 0])).tolist()
    # (1 - p_y)^2 + sum of the other p_j^2, square-rooted
    assert norms[0] == pytest.approx(0.0)
    assert norms[1] == pytest.approx(math.sqrt(0.9**2 + 0.9**2))
    assert norms[2] == pytest.approx(math.sqrt(0.5**2 + 0.25**2 + 0.25**2))


def test_free_word_mask_marks_the_words_that_open_a_thought(blame_share):
    pieces = list("1:so ok 9+4=13</t>2:then 13*2=26")
    spans = ((0, 18), (18, len(pieces)))
    mask = blame_share.free_word_mask(pieces, spans)
    assert "".join(c for c, f in zip(pieces, mask) if f) == "so ok then "
    assert blame_share.free_word_mask(list("1:9+4=13"), ((0, 8),)) == [False] * 8  # no free words


def test_trap_report_by_hand(blame_share):
    """Four chains with the trap at step 2 (0-based) and one without a trap (left out):
    correct; wrong at the trap; wrong at step 0; wrong after the trap. The trap is reached by 3
    chains and passed by 2; the steps before it are reached 7 times (2 + 2 + 1 + 2) and passed 6."""
    firsts = [(None, 2), (2, 2), (0, 2), (3, 2), (1, None)]
    report = blame_share.trap_report(firsts)
    assert "4 chains, 3 failed" in report
    assert "the trap in 0.333 of failed chains" in report
    assert "right at the trap 0.667 of 3 reached" in report
    assert "at each step before it 0.857" in report
    assert blame_share.task_overrides(["trap=1", "numbered=true"]) == {"trap": 1, "numbered": True}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        blame_share.task_overrides(["trap"])


def test_traps_report_by_hand(blame_share):
    """Chains of problems with traps at steps 1 and 3 (0-based): correct; wrong at trap 1 (step 1);
    wrong at trap 2 (step 3); wrong at step 2. Trap 1 is reached 4 times and passed 3; trap 2 is
    reached by the correct chain and the chain wrong there: passed 1 of 2. The other steps up to
    the last trap (0 and 2) are reached 4 + 3 = 7 times and passed 4 + 2 = 6."""
    rows = [(None, (1, 3)), (1, (1, 3)), (3, (1, 3)), (2, (1, 3)), (0, ())]
    report = blame_share.traps_report(rows)
    assert "4 chains, 3 failed" in report
    assert "first wrong step is a trap in 0.667 of failed chains" in report
    assert "(given a right prefix): 0.750 of 4, 0.500 of 2" in report
    assert "at the other steps up to the last trap 0.857" in report
    # right through trap 1 (step 1) and failed later: the chains wrong at step 3 and at step 2 (2 of
    # 4); right through trap 2 (step 3) and failed later: none of 4 (only the correct chain passes it)
    assert "and failed later (oracle credit's extra push there, relative to GRPO's): 0.500, 0.000" in report
