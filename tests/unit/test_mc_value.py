"""Monte-Carlo step values (VinePPO-style) on a scripted rollout tree, computed by hand."""

from __future__ import annotations

import pytest
import torch
from creditlab.step.generation import thought_spans
from creditlab.step.rollout import collate, with_segments
from creditlab.testing import FakePolicyHandle, pad_batch
from creditlab.types import Completion, Problem, Segments, Trajectory
from creditlab_resets.mc_value import MCValueAdvantage, boundaries

from tests.helpers import THOUGHT, char_tokenizer

TOK = char_tokenizer()
DELIM = tuple(TOK.encode(THOUGHT, add_special_tokens=False))
PROBLEM = Problem("p", "p", "1")


def ids(text: str) -> tuple[int, ...]:
    return tuple(TOK.encode(text, add_special_tokens=False))


def traj(text: str, reward: float, group: int = 0, prefix: str = "", mask_prefix: bool = True) -> Trajectory:
    resp = ids(text)
    plen = len(ids(prefix))
    comp = Completion(ids("Q"), resp, tuple(0.0 for _ in resp[plen:]), "stop", text, prefix_len=plen)
    return Trajectory(PROBLEM, comp, reward, group, plen if mask_prefix else 0, "reset" if prefix else "base")


class Tree:
    """Continuation rewards scripted per state: the state's number of finished thoughts picks a
    reward list, cycled over the K continuations."""

    def __init__(self, table: dict[int, list[float]]) -> None:
        self.table = table
        self.calls: list[int] = []

    def __call__(self, problems, requests):  # noqa: ANN001, ANN204
        self.calls.append(len(requests))
        out, seen = [], {}
        for p, r in zip(problems, requests):
            depth = len(thought_spans(r.prefix_ids, DELIM)) if r.prefix_ids else 0
            j = seen.get((r.prompt_ids, r.prefix_ids), 0)
            seen[(r.prompt_ids, r.prefix_ids)] = j + 1
            reward = self.table[depth][j % len(self.table[depth])]
            comp = Completion(r.prompt_ids, tuple(r.prefix_ids) + ids("z"), (0.0,), "eos", "", len(r.prefix_ids))
            out.append(Trajectory(p, comp, reward, -1, len(r.prefix_ids)))
        return out


def batch_of(trajs):  # noqa: ANN001, ANN201
    batch = collate(trajs, TOK.pad_token_id)
    spans = tuple(thought_spans(t.completion.response_ids, DELIM) for t in trajs)
    return with_segments(batch, Segments(spans))


def test_boundaries() -> None:
    spans = ((0, 3), (3, 5), (5, 9))
    assert boundaries(spans, 0, 9) == [0, 3, 5]
    assert boundaries(spans, 3, 9) == [3, 5]
    assert boundaries(spans, 9, 9) == []


def test_step_advantages_by_hand() -> None:
    text = f"a{THOUGHT}b{THOUGHT}c"
    trajs = [traj(text, 1.0), traj(f"a{THOUGHT}x", 0.0)]
    tree = Tree({0: [1, 0, 0, 0], 1: [1, 1, 0, 0], 2: [1, 1, 1, 1]})
    est = MCValueAdvantage(MCValueAdvantage.Config(rollouts=4))
    batch = batch_of(trajs)
    out = est.estimate(batch, FakePolicyHandle(tokenizer=TOK, rollout_fn=tree))
    adv = out.values
    # Row 0: V(s0)=.25, V(s1)=.5, V(s2)=1, R=1 -> A = .25, .5, 0 on the three thoughts.
    a, d = len(ids(f"a{THOUGHT}")), len(ids(f"b{THOUGHT}"))
    n0 = len(ids(text))
    assert torch.allclose(adv[0, :a], torch.full((a,), 0.25))
    assert torch.allclose(adv[0, a : a + d], torch.full((d,), 0.5))
    assert torch.allclose(adv[0, a + d : n0], torch.zeros(n0 - a - d))
    # Row 1 shares s0 and s1 with row 0: V(s0)=.25, V(s1)=.5, R=0 -> .25, -.5.
    n1 = len(ids(f"a{THOUGHT}x"))
    assert torch.allclose(adv[1, :a], torch.full((a,), 0.25))
    assert torch.allclose(adv[1, a:n1], torch.full((n1 - a,), -0.5))
    assert (adv * (1 - batch.loss_mask)).abs().sum() == 0
    # Shared states are valued once: s0 and s1 (shared), s2 of row 0 -> 3 states x 4 rollouts.
    assert tree.calls == [12]
    assert {k: out.metrics[k] for k in ("states", "value_rollouts")} == {"states": 3.0, "value_rollouts": 12.0}
    assert est.metrics() == {}  # one channel: the metrics travel with the advantages


def test_suffix_rows_value_only_after_the_prefix() -> None:
    prefix = f"a{THOUGHT}"
    trajs = [traj(f"{prefix}b{THOUGHT}c", 1.0, prefix=prefix), traj(f"{prefix}y", 0.0, prefix=prefix)]
    tree = Tree({1: [0, 1], 2: [1]})
    batch = batch_of(trajs)
    adv = MCValueAdvantage(MCValueAdvantage.Config(rollouts=2)).estimate(
        batch, FakePolicyHandle(tokenizer=TOK, rollout_fn=tree)
    ).values
    p = len(ids(prefix))
    assert adv[:, :p].abs().sum() == 0  # the prefix is not trained
    d = len(ids(f"b{THOUGHT}"))
    assert torch.allclose(adv[0, p : p + d], torch.full((d,), 0.5))  # V(s1)=.5 -> V(s2)=1
    assert torch.allclose(adv[1, p : p + 1], torch.full((1,), -0.5))
    assert tree.calls == [4]  # the shared prefix state and row 0's second state


def test_finite_deterministic_and_padding_invariant() -> None:
    trajs = [traj(f"a{THOUGHT}b", 1.0), traj(f"c{THOUGHT}", 0.0)]
    tree = Tree({0: [0, 1, 1], 1: [1, 0, 0]})
    est = MCValueAdvantage(MCValueAdvantage.Config(rollouts=3))
    batch = batch_of(trajs)
    a = est.estimate(batch, FakePolicyHandle(tokenizer=TOK, rollout_fn=tree)).values
    b = est.estimate(batch, FakePolicyHandle(tokenizer=TOK, rollout_fn=tree)).values
    padded = est.estimate(pad_batch(batch, 5, TOK.pad_token_id), FakePolicyHandle(tokenizer=TOK, rollout_fn=tree)).values
    assert torch.isfinite(a).all() and torch.equal(a, b)
    assert torch.equal(padded[:, : a.shape[1]], a) and padded[:, a.shape[1]:].abs().sum() == 0


def test_bad_config() -> None:
    from creditlab.errors import ConfigError

    with pytest.raises(ConfigError, match="rollouts"):
        MCValueAdvantage.Config(rollouts=0)
