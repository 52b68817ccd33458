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

@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("cache")
    mp.setenv("CREDITLAB_CACHE", str(path))
    yield path
    mp.undo()
