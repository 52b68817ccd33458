"""GRPO / Dr. GRPO advantage estimators on a hand-built RolloutBatch."""

from __future__ import annotations

import math

import pytest
import torch
from creditlab.errors import ConfigError
from creditlab.registry import build_part, registry
from creditlab.types import RolloutBatch
from creditlab_grpo.advantage import DrGRPOAdvantage, GRPOAdvantage


def _batch(rewards, group_ids, spans, t=6):
    b, p = len(rewards), 3
    loss_mask = torch.zeros(b, t)
    for i, (s, e) in enumerate(spans):
        loss_mask[i, s:e] = 1
    response_mask = (torch.arange(t)[None, :] < torch.tensor([e for _, e in spans])[:, None])
    return RolloutBatch(
        input_ids=torch.zeros(b, p + t, dtype=torch.long),
        attention_mask=torch.ones(b, p + t, dtype=torch.long),
        prompt_len=p,
        response_ids=torch.zeros(b, t, dtype=torch.long),
        response_mask=response_mask.float(),
        loss_mask=loss_mask,
        group_ids=torch.tensor(group_ids, dtype=torch.long),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        gen_logprobs=torch.zeros(b, t),
        trajectories=(),
    )


# group 0: [1, 0, 0, 1]; group 1: [1, 1] (all equal); group 2: [0] (singleton). Row 3 has a reset
# prefix (trainable_from = 2), row 5 has no trained token.
BATCH = _batch(
    [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0],
    [0, 0, 0, 0, 1, 1, 2],
    [(0, 6), (0, 3), (0, 1), (2, 5), (0, 4), (0, 0), (0, 2)],
)


@pytest.mark.parametrize(
    "cls,options,per_row",
    [
        (GRPOAdvantage, {}, 0.5 / (math.sqrt(1 / 3) + 1e-6)),
        (GRPOAdvantage, {"std": "population", "eps": 0.0}, 1.0),
        (DrGRPOAdvantage, {}, 0.5),
    ],
)
def test_estimate_broadcasts_and_is_zero_on_masked_positions(cls, options, per_row):
    est = cls(cls.Config(**options))
    out = est.estimate(BATCH, None)
    signs = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0, 0.0])
    want = (signs * per_row)[:, None] * BATCH.loss_mask
    torch.testing.assert_close(out.values, want)
    assert out.values.shape == BATCH.loss_mask.shape and out.values.dtype == torch.float32
    assert torch.all(out.values[BATCH.loss_mask == 0] == 0)
    assert out.metrics["groups"] == 3 and out.metrics["zero_std_groups"] == 1
    assert out.metrics["singleton_groups"] == 1
    assert {k: type(v).__name__ for k, v in out.metrics.items()} == {
        "groups": "Sum", "zero_std_groups": "Sum", "singleton_groups": "Sum", "abs_mean": "Mean"}
    assert est.metrics() == {}  # one channel: the metrics travel with the advantages


def test_defaults_and_registry():
    assert GRPOAdvantage.Config().std == "sample" and DrGRPOAdvantage.Config().std == "none"
    assert registry("advantage").get("grpo") is GRPOAdvantage
    assert registry("advantage").get("dr_grpo") is DrGRPOAdvantage
    part = build_part("advantage", {"name": "grpo", "std": "population", "eps": 0})
    assert isinstance(part, GRPOAdvantage) and part.config.std == "population"
    assert part.config.eps == 0.0


def test_config_errors():
    with pytest.raises(ConfigError, match="advantage.std"):
        build_part("advantage", {"name": "dr_grpo", "std": "ddof0"})
    with pytest.raises(ConfigError, match="advantage.eps"):
        GRPOAdvantage.Config(eps=-1.0)
    with pytest.raises(ConfigError, match="unknown key"):
        build_part("advantage", {"name": "grpo", "sdt": "sample"})
