"""The reset buffer (METHODS.md §2) driven by a scripted sampler whose correctness sequence the
test chooses: composition for every split, the fallback, top-ups, prefixes and loss masks."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from creditlab.interfaces import ResetSelector
from creditlab.step.rollout import collate
from creditlab.testing import FakePolicyHandle
from creditlab.types import Completion, GenerationRequest, Problem, ResetPoint, Trajectory
from creditlab_resets.buffer import ResetBuffer, parse_split

from tests.helpers import THOUGHT, char_tokenizer

TOK = char_tokenizer()
DELIM = tuple(TOK.encode(THOUGHT, add_special_tokens=False))
C, W, E = "correct", "wrong", "empty"  # draw outcomes


def ids(text: str) -> tuple[int, ...]:
    return tuple(TOK.encode(text, add_special_tokens=False))


class Script:
    """Samples scripted chains: draw j of prompt p has outcome ``outcomes[p][j]``.

    A correct chain is ``"a</thought>b</thought>ok"``, a wrong one ``"a</thought>X</thought>no"``
    (3 thoughts), an empty one has no tokens. Suffixes append ``"s</thought>"`` to the prefix and
    are correct when ``suffix_correct``.
    """

    def __init__(self, outcomes: dict[str, Sequence[str]], suffix_correct: bool = True) -> None:
        self.outcomes = {k: list(v) for k, v in outcomes.items()}
        self.drawn = {k: 0 for k in outcomes}
        self.calls: list[int] = []
        self.suffix_correct = suffix_correct
        self.suffix_requests: list[GenerationRequest] = []

    def __call__(self, problems: Sequence[Problem], requests: Sequence[GenerationRequest], seed: int):
        self.calls.append(len(requests))
        out = []
        for p, r in zip(problems, requests):
            if r.prefix_ids:
                self.suffix_requests.append(r)
                resp, reward = tuple(r.prefix_ids) + ids("s" + THOUGHT), float(self.suffix_correct)
            else:
                j = self.drawn[p.id]
                self.drawn[p.id] += 1
                kind = self.outcomes[p.id][j] if j < len(self.outcomes[p.id]) else C
                text = {C: f"a{THOUGHT}b{THOUGHT}ok", W: f"a{THOUGHT}X{THOUGHT}no", E: ""}[kind]
                resp, reward = ids(text), float(kind == C)
            comp = Completion(r.prompt_ids, resp, tuple(0.0 for _ in resp[len(r.prefix_ids):]),
                              "stop", "", prefix_len=len(r.prefix_ids))
            out.append(Trajectory(p, comp, reward, -1, len(r.prefix_ids), "base", {"draw": kind_of(reward)}))
        return out


def kind_of(reward: float) -> str:
    return "correct" if reward else "wrong"


class Fixed(ResetSelector):
    """Resets every seed at thought ``k`` (0-based)."""

    def __init__(self, k: int | None) -> None:
        super().__init__()
        self.k = k

    def select(self, trajectory, spans, ctx):  # noqa: ANN001, ANN201
        return ResetPoint(self.k, {"by": "fixed"})


def build(outcomes, split="1x4", budget=8, draws=12, k=1, mask_prefix=True, suffix_correct=True,
          oracle=None, draw_ahead=False):
    """The buffer over scripted outcomes; one-at-a-time rounds unless ``draw_ahead``."""
    problems = [Problem(pid, pid, "1", oracle=oracle) for pid in outcomes]
    script = Script(outcomes, suffix_correct)
    buf = ResetBuffer(budget, split, draws, 1.0, mask_prefix, DELIM, draw_ahead=draw_ahead)
    ctx = FakePolicyHandle(tokenizer=TOK)
    result = buf.build(problems, [ids(p.id) for p in problems], script, Fixed(k), ctx, seed=0)
    return result, script


def roles(trajs: Sequence[Trajectory]) -> list[tuple[int, str]]:
    return [(t.group_id, t.role) for t in trajs]


@pytest.mark.parametrize(
    "split,budget,expected", [("1x4", 8, (4, 1, 4)), ("2x4", 8, (0, 2, 4)), ("1x8", 8, (0, 1, 8)),
                              ("3x2", 8, (2, 3, 2)), ("1x1", 2, (1, 1, 1))],
)
def test_parse_split(split: str, budget: int, expected: tuple[int, int, int]) -> None:
    assert parse_split(split, budget) == expected


@pytest.mark.parametrize("bad", ["4", "1x9", "0x4", "ax4", "1x4x2"])
def test_parse_split_errors(bad: str) -> None:
    with pytest.raises(ValueError, match="RxK|R\\*K"):
        parse_split(bad, 8)


def test_1x4_seed_and_base_group() -> None:
    result, script = build({"p": [C, C, W, C, C, C]})
    # One batched round of exactly 5 draws fills 4 base slots and the seed.
    assert script.calls == [5, 4] and script.drawn["p"] == 5
    assert roles(result.trajectories) == [(0, "base")] * 4 + [(1, "reset")] * 4
    assert [t.reward for t in result.trajectories[:4]] == [1.0] * 4
    assert len(result.seeds) == 1 and result.seeds[0].reward == 0.0
    assert result.stats["fallback"] == 0 and result.stats["discarded"] == 0


def test_failures_fill_base_after_the_seed_and_late_correct_chains_are_discarded() -> None:
    result, script = build({"p": [C, C, C, C, C, W]})
    # Round 1: 4 correct -> base, the 5th correct is discarded; round 2: one draw -> seed.
    assert script.calls == [5, 1, 4]
    assert result.stats["discarded"] == 1 and len(result.discarded) == 1
    assert len(result.trajectories) == 8

    result, _ = build({"p": [W, W, W, W, W]})
    assert [t.reward for t in result.trajectories if t.role == "base"] == [0.0] * 4


def test_fallback_is_the_base_group_topped_up_with_fresh_chains() -> None:
    result, script = build({"p": [C] * 12 + [W, C, W, C]})
    assert script.drawn["p"] == 12 + 4  # the draw limit, then 4 fresh chains
    assert script.calls == [5] + [1] * 7 + [4]
    assert roles(result.trajectories) == [(0, "fallback")] * 8
    # Fresh top-up chains are ordinary draws: failures among them are trained on.
    assert [t.reward for t in result.trajectories] == [1.0] * 4 + [0.0, 1.0, 0.0, 1.0]
    assert result.stats["fallback"] == 1 and not result.seeds


def test_fallback_tops_up_when_the_draw_limit_is_below_the_budget() -> None:
    result, script = build({"p": [C] * 20}, draws=3)
    assert script.drawn["p"] == 8 and len(result.trajectories) == 8


def test_seed_found_but_base_short_is_topped_up() -> None:
    result, script = build({"p": [W, W]}, draws=2)
    assert script.calls == [2, 3 + 4]  # draws, then the base's top-up and the suffixes together
    assert roles(result.trajectories) == [(0, "base")] * 4 + [(1, "reset")] * 4


OUTCOME_TABLE = [
    [C, C, W, C, C, C],
    [C, C, C, C, C, W],
    [C, C, C, C, C, C, C, W, C],
    [C] * 12 + [W, C, W, C],
    [W, W, W, W, W],
    [E, C, C, C, C, E, W],
]


@pytest.mark.parametrize("split", ["1x4", "2x4", "1x8"])
def test_draw_ahead_places_chains_as_one_at_a_time_drawing(split: str) -> None:
    """Same seeds, base chains, discards and fallbacks as drawing one chain at a time; at most
    two draw rounds; chains drawn beyond the stopping point are counted, not used."""
    outcomes = {f"p{i}": o for i, o in enumerate(OUTCOME_TABLE)}
    slow, slow_script = build(outcomes, split=split, draw_ahead=False)
    fast, fast_script = build(outcomes, split=split, draw_ahead=True)
    draw_calls = len(fast_script.calls) - 1  # the last call: top-up + suffixes
    assert draw_calls <= 2 < len(slow_script.calls) - 1
    assert [s.completion.response_ids for s in fast.seeds] == [
        s.completion.response_ids for s in slow.seeds]
    for key in ("fallback", "seeds", "draws", "discarded", "suffixes"):
        assert fast.stats[key] == slow.stats[key], key
    base = lambda r: [(t.group_id, t.role, t.reward) for t in r.trajectories if t.role != "reset"]
    # Base chains up to the stopping point are the same draws; top-up chains are later draws.
    assert roles(fast.trajectories) == roles(slow.trajectories)
    assert base(fast)[:4] == base(slow)[:4]
    assert fast.stats["speculative"] == sum(fast_script.drawn.values()) - sum(
        slow_script.drawn.values())
    assert slow.stats["speculative"] == 0


def test_draw_ahead_second_round_draws_every_remaining_draw() -> None:
    result, script = build({"p": [C, C, C, C, C, C, W], "q": [W, C, C, C, C]}, draw_ahead=True)
    # Round 1: 5 each; q is done, p lacks its seed and draws its remaining 12 - 5 = 7 at once:
    # the 1st is discarded (base full), the 2nd is the seed, the other 5 are speculative.
    assert script.calls == [10, 7, 8]
    assert result.stats["speculative"] == 5 and result.stats["draws"] == 5 + 2 + 5
    assert result.stats["discarded"] == 2  # p's 5th draw and 6th (= its round-2 first) draw


def test_empty_chain_joins_base_with_zero_reward_and_is_never_a_seed() -> None:
    result, _ = build({"p": [E, C, C, C, W]})
    base = [t for t in result.trajectories if t.role == "base"]
    assert base[0].completion.response_ids == () and base[0].reward == 0.0
    assert result.seeds[0].completion.response_ids != ()


def test_2x4_two_seeds_no_base() -> None:
    result, script = build({"p": [W, C, W]}, split="2x4")
    assert script.drawn["p"] == 3 and result.stats["discarded"] == 1
    assert roles(result.trajectories) == [(0, "reset")] * 4 + [(1, "reset")] * 4


def test_2x4_with_one_seed_falls_back_to_a_plain_group() -> None:
    result, script = build({"p": [W] + [C] * 18}, split="2x4")
    assert script.drawn["p"] == 12 + 7  # the seed found joins the plain group
    assert roles(result.trajectories) == [(0, "fallback")] * 8
    assert [t.reward for t in result.trajectories] == [0.0] + [1.0] * 7
    assert not result.seeds and result.stats["fallback"] == 1


def test_1x8_and_several_prompts_get_distinct_groups() -> None:
    result, _ = build({"p": [W], "q": [C, W]}, split="1x8")
    assert roles(result.trajectories) == [(0, "reset")] * 8 + [(1, "reset")] * 8
    assert {t.problem.id for t in result.trajectories[8:]} == {"q"}


def test_prefix_is_the_seeds_token_ids_up_to_the_reset_thought() -> None:
    for k, prefix_text in [(0, ""), (1, f"a{THOUGHT}"), (2, f"a{THOUGHT}X{THOUGHT}"), (9, f"a{THOUGHT}X{THOUGHT}")]:
        result, script = build({"p": [W, C, C, C, C]}, k=k)
        seed = result.seeds[0].completion.response_ids
        for t in result.trajectories[4:]:
            c = t.completion
            assert c.response_ids[: c.prefix_len] == seed[: c.prefix_len] == ids(prefix_text)
            assert t.trainable_from == c.prefix_len
            assert t.info["reset_thought"] == min(k, 2) + 1 and t.info["seed_thoughts"] == 3
        if k > 0:
            assert all(r.prefix_ids == ids(prefix_text) for r in script.suffix_requests)


def test_suffix_loss_mask_and_no_mask_ablation() -> None:
    result, _ = build({"p": [W, C, C, C, C]}, k=1)
    batch = collate(result.trajectories, TOK.pad_token_id)
    plen = len(ids(f"a{THOUGHT}"))
    for row, t in enumerate(result.trajectories):
        n = len(t.completion.response_ids)
        start = plen if t.role == "reset" else 0
        assert batch.loss_mask[row, :start].sum() == 0
        assert batch.loss_mask[row, start:n].sum() == n - start
    result, _ = build({"p": [W, C, C, C, C]}, k=1, mask_prefix=False)
    assert all(t.trainable_from == 0 for t in result.trajectories)


def test_oracle_comparison_counts() -> None:
    # The oracle says thought 1 (0-based) is the first wrong one.
    result, _ = build({"p": [W, C, C, C, C], "q": [W, C, C, C, C]}, k=0, oracle=lambda th: 1)
    s = result.stats
    assert s["oracle_known"] == 2 and s["oracle_early"] == 2 and s["clean_prefix"] == 2
    result, _ = build({"p": [W, C, C, C, C]}, k=2, oracle=lambda th: 1)
    assert result.stats["oracle_late"] == 1 and result.stats["clean_prefix"] == 0
    info = result.trajectories[-1].info
    assert info["oracle_first_wrong"] == 2 and info["oracle_late"] == 1


def test_deterministic_given_the_seed() -> None:
    a, _ = build({"p": [C, W, C, C, C]})
    b, _ = build({"p": [C, W, C, C, C]})
    assert [t.completion for t in a.trajectories] == [t.completion for t in b.trajectories]
