"""Pure parts of data parallelism: prompt shares, metric reduction rules, the launch plan's errors."""

import pytest

from creditlab.distributed import reduce_metrics, reduction, shard
from creditlab.launch import _devices, cpu_cores, plan, threads_per_rank
from creditlab.registry import ConfigError


def test_shards_are_contiguous_cover_everything_and_differ_by_at_most_one():
    items = list(range(7))
    parts = [shard(items, r, 3) for r in range(3)]
    assert parts == [[0, 1, 2], [3, 4], [5, 6]]
    assert shard(items, 0, 1) == items
    with pytest.raises(ValueError):
        shard(items, 3, 3)


@pytest.mark.parametrize("key,op", [
    ("train/response_length/max", "max"), ("train/ratio_max", "max"),
    ("train/advantage/groups", "sum"), ("train/advantage/zero_std_groups", "sum"),
    ("train/verifier/scored", "sum"), ("train/reset_selector/localization_tokens", "sum"),
    ("train/credit/with_negative_mass", "sum"), ("train/oar/probe_s", "sum"),
    ("train/advantage/abs_mean", "mean"), ("train/verifier/correct_rate", "mean"),
    ("train/advantage/divergent_frac", "mean"), ("train/rollout/reset/seeds_per_prompt", "mean"),
    ("train/rollout/reset/oracle_exact", "mean"), ("train/rollout/reset/clean_prefix", "mean"),
    ("train/credit/neg_mass_at", "mean"), ("train/credit/first_wrong_rank", "mean"),
    ("eval/pass@1", "mean"), ("eval/pass@4", "mean"), ("train/backend/tokens_per_s", "mean"),
])
def test_reduction_rules(key, op):
    assert reduction(key) == op


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
