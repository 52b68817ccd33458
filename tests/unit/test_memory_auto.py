"""``loss.micro_batch_tokens=auto``: the memory a run has (creditlab.run.memory_budget), the budget
search against hand-checkable numbers, and every shipped model preset's default run planned for a
24 GiB CPU machine and 24 / 80 GiB GPUs (mocked)."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from creditlab.run import memory, memory_budget
from creditlab.run.memory_budget import BATCH_SHARE, batch_bytes
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import validate
from creditlab.run.memory import (
    GIB, auto_token_budget, available_memory, estimate, load_shape, prompt_tokens, resolve_token_budget, shape_of,
    sized_plan, usable,
)
from transformers import Qwen2Config

from tests.helpers import tiny_model_and_tokenizer
from tests.unit.test_memory_plan import QWEN, no_hub  # noqa: F401 - a fixture

MIB = 2**20


def test_usable_keeps_a_tenth_and_2_gib():
    assert usable(24 * GIB) == 24 * GIB * 0.9 - 2 * GIB == 19.6 * GIB
    assert usable(80 * GIB) == 70 * GIB


class _Update:
    """A plan whose update is 10 GiB plus 1 MiB per token of its micro-batch: 128 rows of 100 tokens."""

    def __init__(self, budget):
        rows = 128 if not budget else min(128, budget // 100)
        self.parts = {"activations": rows * 100 * MIB, "logits": 0}
        self.phases = {"update": 10 * GIB + rows * 100 * MIB}


def test_budget_search_by_hand():
    # the whole mini-batch: 10 GiB + 12,800 MiB = 22.5 GiB
    assert resolve_token_budget(_Update, 100, 128 * 100, 23 * GIB)[0] == 0
    # 12 GiB: 2,048 MiB for tokens, 20 rows of 100; 2,048 // 100 = 20, 2,304 // 100 = 23 rows too many
    budget, why = resolve_token_budget(_Update, 100, 128 * 100, 12 * GIB)
    assert (budget, why) == (2048, "the largest budget whose update fits")
    # 10.05 GiB: not one row (100 MiB) fits: the smallest budget, one row, said so
    budget, why = resolve_token_budget(_Update, 100, 128 * 100, 10 * GIB + 50 * MIB)
    assert budget == 256 and "not even one row" in why
    # the whole mini-batch fits, but its 12,800 MiB of micro-batch tensors exceed a 3 GiB share:
    # 3,072 MiB hold 30 rows of 100 (3,072 // 100 = 30; 3,328 // 100 = 33 rows too many)
    budget, why = resolve_token_budget(_Update, 100, 128 * 100, 23 * GIB, 3 * GIB)
    assert budget == 3072 and "would fit, at no gain in speed" in why
    # one row's 100 MiB already exceed a 50 MiB share, though its update fits: said so, not "nothing fits"
    budget, why = resolve_token_budget(_Update, 100, 128 * 100, 23 * GIB, 50 * MIB)
    assert budget == 256 and "exceed 0.125 of the memory, but its update fits" in why


def test_auto_budget_on_a_real_plan(tmp_path):
    """The small Qwen2 with a 250-token prompt: rows of 258 tokens; room between the update of 4
    and 5 rows gives 1,280 tokens (1,280 // 258 = 4; 1,536 // 258 = 5)."""
    Qwen2Config(**QWEN).save_pretrained(tmp_path)
    cfg = compose([f"model.name_or_path={tmp_path}", "prompts_per_step=2", "rollout.group_size=4",
                   "rollout.max_new_tokens=8", "eval.every=0"])
    checked = validate(cfg)
    shape = shape_of(Qwen2Config(**QWEN))

    def update(rows):
        return estimate(cfg, checked, shape, 250, 250, 8, rows * 258).phases["update"]

    room = (update(4) + update(5)) / 2
    memory_bytes = int((room + 2 * GIB) / 0.9) + 1
    plan, budget, how = sized_plan(cfg, checked, shape, 250, 250, 8, (memory_bytes, "mock"))
    assert budget == 1280 and plan.facts["update micro-batch rows"] == 4 and "largest budget" in how
    assert plan.phases["update"] <= usable(memory_bytes) < update(5)
    assert "1280 tokens (auto: the largest budget whose update fits)" == plan.facts["loss.micro_batch_tokens"]
    # a set budget is kept as it is
    fixed = validate(compose([f"model.name_or_path={tmp_path}", "loss.micro_batch_tokens=512"]))
    assert sized_plan(cfg, fixed, shape, 250, 250, 8, (memory_bytes, "mock"))[1:] == (512, "set")


def test_available_memory_cpu_and_mocked_cuda(monkeypatch):
    ram, what = available_memory("cpu")
    assert ram > GIB and ("RAM" in what or "cgroup" in what)
    assert available_memory("mps") is None
    monkeypatch.setattr(memory_budget.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory_budget.torch.cuda, "mem_get_info", lambda i: (23 * GIB, 24 * GIB))
    monkeypatch.setattr(memory_budget.torch.cuda, "get_device_name", lambda i: "Mock 24GB")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert available_memory("gpu") == (23 * GIB, "free memory of CUDA device 1 (Mock 24GB)")


def test_auto_at_run_start_records_what_it_chose(monkeypatch):
    """The runner's call: the loaded model's config and tokenizer; the tiny default fits (0, off:
    the update a run without a budget does, so results do not change)."""
    model, tok = tiny_model_and_tokenizer()
    cfg = compose([])
    checked = validate(cfg)
    task = checked["task"][0](checked["task"][1])
    train, test = list(task.load("train")), list(task.load("test"))
    monkeypatch.setattr(memory, "available_memory", lambda accelerator: (24 * GIB, "mock RAM"))
    rng = torch.get_rng_state()
    budget, record = auto_token_budget(cfg, checked, model.config, tok, train, test)
    assert torch.equal(torch.get_rng_state(), rng)  # the run draws what it drew before auto existed
    assert budget == 0 and record["resolved"] == 0 and record["configured"] == "auto"
    assert record["memory_gib"] == 24 and record["does_not_fit"] == [] and "whole mini-batch fits" in record["how"]
    # too little memory for the whole mini-batch: a budget that is a multiple of 256
    monkeypatch.setattr(memory, "available_memory", lambda accelerator: (int(2.3 * GIB), "mock RAM"))
    budget, record = auto_token_budget(cfg, checked, model.config, tok, train, test)
    assert budget > 0 and budget % 256 == 0 and record["update_gib"] <= usable(2.3 * GIB) / GIB + 1e-3  # rounded
    # a set value is the run's, nothing recorded
    assert auto_token_budget(cfg, validate(compose(["loss.micro_batch_tokens=0"])), model.config, tok, train, test) == (0, {})


PRESETS = sorted(os.path.basename(p)[:-5] for p in glob.glob(str(CONF_DIR / "model" / "*.yaml")))
MACHINES = {"cpu-24GiB": ("cpu", 24), "gpu-24GiB": ("gpu", 24), "gpu-80GiB": ("gpu", 80)}
#: What does not fit, by design: full fine-tuning of a 7B model in bf16 holds weights, gradients and
#: AdamW's two moments, 8 bytes a parameter (57 GiB for Qwen2.5-7B, 54 GiB for OLMo 3 7B; 110 GiB
#: for Qwen2.5-14B), more than 24 GiB can hold, and for the 14B more than 80. The plan says so and
#: names the fix (the paper presets, conf/experiment/, train them with LoRA).
TOO_LARGE = {("qwen2.5-7b-instruct", "cpu-24GiB"), ("qwen2.5-7b-instruct", "gpu-24GiB"),
             ("olmo-3-7b-instruct", "cpu-24GiB"), ("olmo-3-7b-instruct", "gpu-24GiB"),
             ("qwen2.5-14b-instruct", "cpu-24GiB"), ("qwen2.5-14b-instruct", "gpu-24GiB"),
             ("qwen2.5-14b-instruct", "gpu-80GiB")}


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_plans_to_fit_or_says_why_not(preset, no_hub):  # noqa: F811 - the fixture
    """model=<preset> with the default method, offline: auto sizes the update to fit each machine;
    where the model's state alone is too large, every phase that does not fit is named with it."""
    assert len(PRESETS) == 10
    for machine, (trainer, gib) in MACHINES.items():
        cfg = compose([f"model={preset}", f"trainer={trainer}"])
        checked = validate(cfg)
        shape, tokenizer, _ = load_shape(checked["model"])
        task = checked["task"][0](checked["task"][1])
        train, test = list(task.load("train")), list(task.load("test"))
        chat = checked["rollout"].chat_template
        prompt, eval_prompt = prompt_tokens(train, tokenizer, chat)[0], prompt_tokens(test, tokenizer, chat)[0]
        plan, budget, how = sized_plan(cfg, checked, shape, prompt, eval_prompt, len(test), (gib * GIB, machine))
        misfits = [n for n in plan.notes if n.startswith("does not fit")]
        if (preset, machine) in TOO_LARGE:
            assert misfits and all("the model's state alone" in n for n in misfits), (preset, machine, plan.notes)
            assert "update" in misfits[0] and "model.lora.enabled=true" in misfits[0]
            continue
        assert not misfits and plan.peak[1] <= usable(gib * GIB), (preset, machine, plan.notes)
        if budget:  # the largest: 256 tokens more would not fit, or hold more than its share
            bigger = estimate(cfg, checked, shape, prompt, eval_prompt, len(test), budget + 256)
            assert (bigger.phases["update"] > usable(gib * GIB)
                    or batch_bytes(bigger) > gib * GIB * BATCH_SHARE) and "largest budget" in how
            assert batch_bytes(plan) <= gib * GIB * BATCH_SHARE
        else:
            assert "whole mini-batch fits" in how


def test_cpu_ranks_share_the_ram(tmp_path):
    """trainer=ddp (2 CPU ranks): each rank plans for half of the RAM."""
    Qwen2Config(**QWEN).save_pretrained(tmp_path)
    cfg = compose([f"model.name_or_path={tmp_path}", "trainer=ddp", "eval.every=0"])
    plan, _, _ = sized_plan(cfg, validate(cfg), shape_of(Qwen2Config(**QWEN)), 10, 10, 8, (24 * GIB, "mock"))
    assert plan.facts["memory"].startswith("12.0 GiB (mock, shared by 2 ranks), 8.8 GiB usable")


def test_vllm_weight_sync_by_file_holds_the_weights_in_memory_all_run(tmp_path):
    """``backend=vllm``: ``weight_sync=file`` keeps a weights file on /dev/shm for the whole run,
    so every phase of a CPU plan holds it and a GPU plan notes it as host memory;
    ``memory`` (``auto`` for one worker) holds none; ``auto`` with tensor parallelism goes by file."""
    from omegaconf import OmegaConf

    Qwen2Config(**QWEN).save_pretrained(tmp_path)
    cfg = compose([f"model.name_or_path={tmp_path}", "eval.every=0"])
    checked, shape = validate(cfg), shape_of(Qwen2Config(**QWEN))

    def plan(accelerator="cpu", **backend):
        c = OmegaConf.create(OmegaConf.to_container(cfg))
        c.backend = {"name": "vllm", "kv_cache_gib": 0.5, **backend}
        c.trainer.accelerator = accelerator
        return estimate(c, checked, shape, 50, 50, 8)

    by_memory, by_file, auto_tp = plan(), plan(weight_sync="file"), plan(engine_kwargs={"tensor_parallel_size": 2})
    weights = by_memory.parts["weights"]
    assert "weight sync file" not in by_memory.parts and by_file.parts["weight sync file"] == weights > 0
    assert {p: by_file.phases[p] - v for p, v in by_memory.phases.items()} == dict.fromkeys(by_memory.phases, weights)
    assert auto_tp.phases == by_file.phases
    on_gpu = plan("gpu", weight_sync="file")
    assert on_gpu.phases == plan("gpu").phases
    assert any("weights file in host memory" in n for n in on_gpu.notes)
