"""One small warm-started model cache shared by the integration tests."""

import pytest

#: A tiny recipe (2 layers, hidden 64, 40 warm-start steps) and a small, fast run.
SMALL = [
    "logger=none",
    "prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=32",
    "eval.every=2",
    "eval.problems=8",
    "checkpoint_every=1",
    "task.num_train=64",
    "task.num_test=16",
    "+model.recipe_args={layers: 2, hidden_size: 64, heads: 2, intermediate_size: 128, steps: 40, sft_problems: 640}",
]

#: Metrics that measure time, not training: dropped before comparing runs for equality.
VOLATILE_PREFIXES = ("wall", "time/")
DURATION_SUFFIXES = ("_s", "seconds", "per_s")  # e.g. train/backend/seconds, .../tokens_per_s


def stable(rows: list[dict]) -> list[dict]:
    """``rows`` of metrics.jsonl without wall-clock metrics, for run-equality checks."""
    return [
        {k: v for k, v in r.items() if not k.startswith(VOLATILE_PREFIXES) and not k.endswith(DURATION_SUFFIXES)}
        for r in rows
    ]


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("cache")
    mp.setenv("CREDITLAB_CACHE", str(path))
    yield path
    mp.undo()
