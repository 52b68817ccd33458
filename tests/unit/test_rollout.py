"""Collation masks (TESTING.md trap 3), truncation policies, the sampler and the plain rollout
strategy."""


from creditlab.interfaces import Verifier
from creditlab.step.rollout import PlainRolloutStrategy, RolloutSampler, collate
from creditlab.step.segmenters import ThoughtSegmenter, WholeSegmenter
from creditlab.testing import FakePolicyHandle, FakeSampler, check_part, check_segmenter
from creditlab.types import Completion, Mean, Problem, Rewards, RolloutConfig, Sum, Trajectory

from tests.helpers import char_tokenizer

EOS = 1


def _traj(resp, finish="eos", start=0, reward=1.0, group=0, prompt=(7, 8)):
    c = Completion(prompt, tuple(resp), tuple(-0.5 for _ in resp[start:]), finish, "", prefix_len=start)
    return Trajectory(Problem("p", "q", "1"), c, reward, group, start)


def test_pad_equal_to_eos_keeps_the_eos_token_in_the_mask():
    batch = collate([_traj([5, 6, EOS]), _traj([5, EOS])], pad_id=EOS)
    assert batch.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    # prompt is left-padded, response right-padded; logits column P+t-1 predicts token t
    assert batch.prompt_len == 2 and batch.input_ids[0, 2:].tolist() == [5, 6, EOS]


def test_trainable_from_masks_the_prefix_and_places_logprobs_after_it():
    batch = collate([_traj([5, 6, 7, 8], start=2)], pad_id=0)
    assert batch.loss_mask.tolist() == [[0, 0, 1, 1]]
    assert batch.gen_logprobs.tolist() == [[0, 0, -0.5, -0.5]]


def test_truncation_policies():
    trajs = [_traj([5, 6], finish="length"), _traj([5, EOS])]
    assert collate(trajs, 0, "keep").loss_mask[0].sum() == 2
    assert collate(trajs, 0, "mask").loss_mask[0].sum() == 0
    assert collate(trajs, 0, "mask").loss_mask[1].sum() == 2


class _Always(Verifier):
    def score(self, problems, completions):
        return Rewards(tuple(1.0 for _ in completions), tuple({"parsed": "1", "outcome": "correct"} for _ in completions))


class _Backend:
    def generate(self, requests, sampling):
        return [Completion(r.prompt_ids, (5, 6), (-0.1, -0.1), "length", "56") for r in requests]


def test_plain_groups_and_penalized_truncation():
    cfg = RolloutConfig(group_size=3, truncation="penalize", truncation_reward=-1.0)
    sampler = RolloutSampler(cfg, _Backend(), _Always())
    strategy = PlainRolloutStrategy(rollout=cfg)
    trajs = strategy.collect([Problem("a", "x", "1"), Problem("b", "y", "1")], FakePolicyHandle(), sampler, 0)
    assert [t.group_id for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert all(t.reward == -1.0 and t.info["truncated"] for t in trajs)
    assert sampler.take_generated_tokens() == 12 and sampler.take_generated_tokens() == 0
    metrics = sampler.metrics()
    assert metrics == {"completions": 6.0, "truncated_rate": 1.0}
    assert type(metrics["completions"]) is Sum and type(metrics["truncated_rate"]) is Mean
    assert sampler.metrics() == {"completions": 0.0, "truncated_rate": 0.0}


def test_plain_strategy_contract():
    for g in (1, 4):
        check_part("rollout", PlainRolloutStrategy(rollout=RolloutConfig(group_size=g)))
    # the sampler sees one request per completion, the problem's prompt ids, no prefix
    sampler = FakeSampler()
    strategy = PlainRolloutStrategy(rollout=RolloutConfig(group_size=2))
    out = strategy.collect([Problem("a", "xy", "1")], FakePolicyHandle(), sampler, 3)
    assert sampler.calls == 1 and [t.trainable_from for t in out] == [0, 0]
    assert all(t.completion.prompt_ids == FakePolicyHandle().encode("xy") for t in out)


def test_thought_segmenter_partitions_by_delimiter():
    tok = char_tokenizer()
    delim = tok.convert_tokens_to_ids("</thought>")
    batch = collate([_traj([5, 6, delim, 7, delim, 8]), _traj([5, delim])], 0)
    seg = ThoughtSegmenter(tokenizer=tok)
    assert seg.segment(batch).spans == (((0, 3), (3, 5), (5, 6)), ((0, 2),))
    check_segmenter(seg, batch)
    check_segmenter(WholeSegmenter(), batch)
