"""benchmarks/grpo_step_vs_trl.py --model: a real checkpoint's copy can only stop at the budget."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from tests.helpers import tiny_model_and_tokenizer

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    sys.path.insert(0, str(_BENCH))  # the script imports bench_common from its folder
    try:
        spec = importlib.util.spec_from_file_location("grpo_step_vs_trl", _BENCH / "grpo_step_vs_trl.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(_BENCH))


def test_adopted_checkpoint_has_an_unreachable_eos_and_the_same_weights(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny_model_and_tokenizer(tmp_path / "src")
    assert tok.eos_token_id < model.config.vocab_size  # a real model can stop early
    vocab = _bench().adopt_checkpoint(str(tmp_path / "src"), tmp_path / "copy")
    copy = AutoModelForCausalLM.from_pretrained(tmp_path / "copy")
    copy_tok = AutoTokenizer.from_pretrained(tmp_path / "copy")
    assert vocab == model.config.vocab_size == copy.config.vocab_size
    assert copy_tok.eos_token == "<bench-eos>" and copy_tok.eos_token_id >= vocab
    assert copy.config.eos_token_id is None and copy.generation_config.eos_token_id is None
    assert copy_tok.pad_token_id == tok.pad_token_id
    for (name, a), (_, b) in zip(model.state_dict().items(), copy.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    prompt = copy_tok("ab", return_tensors="pt")
    out = copy.generate(**prompt, max_new_tokens=12, do_sample=True, pad_token_id=copy_tok.pad_token_id)
    assert out.shape[1] - prompt["input_ids"].shape[1] == 12  # nothing stops it before the budget
