"""Pure parts of data parallelism: prompt shares, typed metric reductions, the launch plan's
errors."""

import creditlab.step.distributed as distributed
import pytest
from creditlab.errors import ConfigError
from creditlab.run.layout import _devices, cpu_cores, plan, threads_per_rank
from creditlab.step.distributed import reduce_metrics, shard
from creditlab.types import Max, Mean, Min, Sum, reduction


def test_shards_are_contiguous_cover_everything_and_differ_by_at_most_one():
    items = list(range(7))
    parts = [shard(items, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard(items, 0, 1) == items
    with pytest.raises(ValueError):
        shard(items, 3, 3)


def test_reduction_is_the_value_type_not_the_key():
    assert [reduction(v) for v in (Sum(1), Mean(1), Max(1), Min(1), 1.0)] == [
        "sum", "mean", "max", "min", "mean"]
    assert Sum(2) + Sum(3) == 5.0 and repr(Sum(2)) == "Sum(2.0)"


def test_reduce_metrics_over_simulated_ranks(monkeypatch):
    """Two ranks: sums add, means weigh by rows, maxima take the largest; a key named like a
    count (or a loss) combines as its type says; a key on one rank only keeps its value."""
    ranks = [
        ({"loss": Mean(1.0), "groups": Sum(2), "ratio_max": Max(3.0), "lo": Min(4.0), "plain": 0.5,
          "only0": Sum(7)}, 1.0),
        ({"loss": Mean(3.0), "groups": Sum(5), "ratio_max": Max(1.0), "lo": Min(2.0), "plain": 1.0}, 3.0),
    ]
    monkeypatch.setattr(distributed, "_gather_objects", lambda obj: ranks)
    out = reduce_metrics(ranks[0][0], weight=1.0)
    assert out == {"loss": 2.5, "groups": 7.0, "ratio_max": 3.0, "lo": 2.0, "plain": 0.875, "only0": 7.0}
    assert type(out["groups"]) is Sum and type(out["loss"]) is Mean and type(out["plain"]) is float


def test_reduce_metrics_is_the_identity_in_one_process():
    m = {"a/groups": 3.0, "a/rate": 0.5}
    assert reduce_metrics(m, weight=4) == m


def test_launch_plan_errors_name_the_fix():
    ddp = {"_target_": "lightning.pytorch.strategies.DDPStrategy", "process_group_backend": "gloo"}
    cores = cpu_cores()
    assert plan({"accelerator": "cpu", "devices": cores, "strategy": ddp}, 8).world_size == cores
    with pytest.raises(ConfigError, match=rf"trainer.devices={cores + 1} .* has {cores} cores"):
        plan({"accelerator": "cpu", "devices": cores + 1, "strategy": ddp}, 8)
    with pytest.raises(ConfigError, match="use trainer=ddp"):
        plan({"accelerator": "cpu", "devices": 2, "strategy": "ddp_spawn"}, 8)
    with pytest.raises(ConfigError, match="use trainer=ddp"):
        plan({"devices": 2, "strategy": {**ddp, "start_method": "spawn"}}, 8)
    with pytest.raises(ConfigError, match="prompts_per_step=1 .* prompts_per_step>=2"):
        plan({"accelerator": "cpu", "devices": 2, "strategy": ddp}, 1)
    assert plan({"accelerator": "cpu", "devices": 1}, 1).strategy == "single"
    gpu = plan({"accelerator": "gpu", "devices": 8, "num_nodes": 2, "strategy": "fsdp"}, 16)
    assert (gpu.strategy, gpu.world_size) == ("fsdp", 16)  # no GPU check at validation time
    assert [_devices(v, "gpu") for v in (4, "4", [0, 1], "0,1,2")] == [4, 4, 2, 3]
    assert _devices("auto", "cpu") == 1
    with pytest.raises(ConfigError, match="trainer.devices must be >= 1"):
        _devices(0, "cpu")
    assert threads_per_rank(3, 2) == 3 and threads_per_rank(0, cores) == 1
