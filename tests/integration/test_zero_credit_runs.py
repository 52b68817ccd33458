"""Contract (issue 55, item 7), the run half: every estimator with its credit weight at zero
trains exactly as GRPO does. ``tests/unit/test_zero_credit_is_grpo.py`` shows the advantages are
equal; here the same seed gives the same ``metrics.jsonl`` (wall-clock keys aside): every metric a
GRPO run logs has GRPO's value, to the last bit. An estimator may log more keys of its own
(``train/advantage/probed_rows`` ...), never a different value for one of GRPO's.

Runs with a learning signal (the tiny model's shipped warm start: mixed groups at steps 1 and 3),
so the credit machinery runs and is weighted away; a run without one would make equality trivial.
IBPO's ``repair`` mode is the documented exception: its repairs are sampled and scored, so the
step's sampling and verifier counters include them (docs/data.md); everything else is GRPO's.
"""

from __future__ import annotations

from functools import cache

import pytest
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics

from tests.helpers import stable
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

#: SMALL without its tiny recipe: the shipped warm start answers some problems (a signal).
BASE = [o for o in SMALL if not o.startswith(("+model.recipe_args", "rollout.max_new_tokens"))]
STEPS = 3

#: The zero-credit settings of tests/unit/test_zero_credit_is_grpo.py's exact cases.
ZERO = {
    "oar_p": ["advantage=oar_p", "advantage.beta=0", "advantage.w_floor=1"],
    "oar_g": ["advantage=oar_g", "advantage.beta=0", "advantage.w_floor=1"],
    "ibpo": ["advantage=ibpo", "advantage.w_min=1"],
    "ibpo_repair": ["advantage=ibpo", "advantage.mode=repair", "advantage.w_min=1"],
    "reward_flip": ["advantage=reward_flip", "advantage.rate=0"],
}
#: What ran, per case: the credit machinery saw rows it would reweigh.
RAN = {"oar_p": "train/advantage/probed_rows", "oar_g": "train/advantage/probed_rows",
       "ibpo": "train/advantage/mixed_groups", "ibpo_repair": "train/advantage/repair_requests"}
#: IBPO repair's repairs are sampled and scored within the step (the module docstring).
REPAIR_COUNTED = ("tokens/generated", "train/tokens_generated", "train/backend/", "train/rollout/completions",
                  "train/verifier/")


@cache
def metrics(case: str, root: str) -> list[dict]:
    out = f"{root}/{case}"
    run(compose([*BASE, f"run_dir={out}", f"trainer.max_steps={STEPS}", *ZERO.get(case, [])]), out)
    return stable(read_metrics(f"{out}/metrics.jsonl"))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("zero_credit"))


@pytest.mark.parametrize("case", list(ZERO))
def test_credit_weight_zero_trains_as_grpo(case: str, root: str):
    grpo, other = metrics("grpo", root), metrics(case, root)
    train = [r for r in grpo if "train/reward/mean" in r]
    assert len(train) == STEPS and any(r["train/reward/mean"] > 0 for r in train), "no signal: a vacuous check"
    assert any(r["train/advantage/zero_std_groups"] < r["train/advantage/groups"] for r in train)
    assert [r["step"] for r in other] == [r["step"] for r in grpo]
    skip = REPAIR_COUNTED if case == "ibpo_repair" else ()
    differ = [(g["step"], k, g[k], o.get(k)) for g, o in zip(grpo, other) for k in g
              if not k.startswith(skip) and o.get(k) != g[k]]
    assert not differ, f"{case} with its credit off logs other values than GRPO: {differ[:5]}"
    if case in RAN:
        assert any(o.get(RAN[case], 0) > 0 for o in other), f"{case}'s credit machinery never ran"
