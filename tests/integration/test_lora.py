"""Short LoRA runs: they train (finite loss, moving weights), checkpoints hold only what trains and
resume exactly, and the peft adapter saved in the run folder reproduces the trained policy."""

import json
import math
from pathlib import Path

import pytest
import torch
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics

from tests.helpers import stable
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

LORA = ["model.lora.enabled=true", "model.lora.r=8", "model.lora.alpha=16",
        "loss.kl_coef=0.05", "loss.kl_estimator=k1", "threads=1"]


def _train(out_dir, *overrides):
    cfg = compose([*SMALL, *LORA, f"run_dir={out_dir}", *overrides])
    return run(cfg, out_dir)



@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    _train(root / "full", "trainer.max_steps=4")
    _train(root / "resumed", "trainer.max_steps=2")
    _train(root / "resumed", "trainer.max_steps=4")
    return root


def test_lora_run_trains_and_resumes_exactly(runs):
    full = read_metrics(runs / "full" / "metrics.jsonl")
    train = [r for r in full if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0 for r in train)
    assert len({r["train/entropy"] for r in train}) == 4, "the adapters move the policy"
    resumed = read_metrics(runs / "resumed" / "metrics.jsonl")
    assert stable(resumed) == stable(full)


# peft 0.21.2's PeftModel.from_pretrained calls transformers 5.24's deprecated is_gradient_checkpointing
# (peft's call, not creditlab's; creditlab.run.models silences the same warning around get_peft_model)
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")
def test_checkpoint_and_peft_adapter_reproduce_the_trained_policy(runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = runs / "full"
    state = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert state and all(".lora_" in k for k in state), "frozen base weights are not checkpointed"
    base_path = json.loads((out / "environment.json").read_text())["model_path"]
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == Path(base_path) and config["r"] == 8
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path), out / "adapter").eval()
    loaded_state = {f"policy.{k}": v for k, v in loaded.state_dict().items() if ".lora_" in k}
    assert loaded_state.keys() == state.keys()
    for key, value in state.items():
        torch.testing.assert_close(loaded_state[key], value, rtol=0, atol=0)
    base = AutoModelForCausalLM.from_pretrained(base_path).eval()
    ids = torch.randint(5, 30, (2, 12))
    with torch.no_grad():
        assert (loaded(input_ids=ids).logits - base(input_ids=ids).logits).abs().max() > 0
