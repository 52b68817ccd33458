"""creditlab.run.memory and `creditlab train --dry-run`: the formulas against hand-computed numbers and
against what torch and peft build, the recipe's shape against a built checkpoint, and the dry run
exits 0 quickly, prints the peak and writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from creditlab.cli import main
from creditlab.errors import ConfigError
from creditlab.run.compose import compose
from creditlab.run.config import validate
from creditlab.run.memory import estimate, lora_linears, prompt_tokens, shape_of
from creditlab.run.models import LoraConfig, apply_lora
from creditlab.types import Problem
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

from tests.helpers import tiny_model_and_tokenizer

#: A small Qwen2 (tied embeddings, q/k/v biases, grouped-query attention) with hand-countable sizes.
QWEN = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
#: Its parameters by hand: embedding 1000·64 (tied head); per layer q 64·64+64, k and v 64·32+32
#: (2 KV heads of 16), o 64·64, MLP 3·64·128, two norms 2·64; the final norm 64.
QWEN_PARAMS = 1000 * 64 + 2 * (64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64) + 64


def _plan(tmp_path, *overrides, prompt=10):
    Qwen2Config(**QWEN).save_pretrained(tmp_path)
    cfg = compose([f"model.name_or_path={tmp_path}", "prompts_per_step=2", "rollout.group_size=4",
                   "rollout.max_new_tokens=8", "rollout.temperature=1.0", "eval.every=0", *overrides])
    checked = validate(cfg)
    return estimate(cfg, checked, shape_of(AutoConfig.from_pretrained(tmp_path)), prompt, prompt, 8)


def test_shape_counts_what_the_model_holds():
    assert QWEN_PARAMS == 138_304
    shape = shape_of(Qwen2Config(**QWEN))
    assert shape.params == QWEN_PARAMS == sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**QWEN)).parameters())
    assert (shape.layers, shape.hidden, shape.intermediate, shape.kv_heads, shape.head_dim, shape.vocab) == (
        2, 64, 128, 2, 16, 1000)
    model, _ = tiny_model_and_tokenizer()  # untied head: counted once more
    assert shape_of(model.config).params == sum(p.numel() for p in model.parameters())


def test_weights_kv_cache_optimizer_by_hand(tmp_path):
    plan = _plan(tmp_path, "model.dtype=bfloat16")  # trainer=cpu: 32-true keeps the model's dtype
    assert plan.parts["weights"] == QWEN_PARAMS * 2
    assert plan.parts["gradients"] == QWEN_PARAMS * 2
    assert plan.parts["optimizer"] == 2 * QWEN_PARAMS * 2  # AdamW: two moments in the weights' dtype
    # 2 (K, V) x 2 layers x 2 KV heads x 16 dims x 2 bytes per token, 8 rows x (10 + 8) tokens
    assert plan.parts["kv cache"] == 2 * 2 * 2 * 16 * 2 * 8 * 18
    # the HF backend's prefix store: every decoded row's keys/values, within prefix_cache_mb
    assert plan.parts["prefix store"] == plan.parts["kv cache"]
    assert _plan(tmp_path, "+backend.prefix_cache_mb=0").parts["prefix store"] == 0
    assert plan.parts["reference"] == 0 and plan.parts["autocast copies"] == 0
    # fp32 logits of 8 rows x 8 tokens x 1000 entries: the logits, two gradients and a temporary;
    # bf16 logits at temperature 0.7 add their fp32 copy and the scaled logits
    assert _plan(tmp_path).parts["logits"] == 8 * 8 * 1000 * 16
    assert _plan(tmp_path, "model.dtype=bfloat16", "rollout.temperature=0.7").parts["logits"] == 8 * 8 * 1000 * 22
    # the fused head (a 1,000-token vocabulary is below auto's 1,024): three fp32 tiles of the
    # 64 response tokens, their hidden states and fp32 gradient, the head's fp32 gradient
    assert shape_of(Qwen2Config(**QWEN)).fusable_head
    fused = 12 * 64 * 1000 + 64 * 64 * (4 + 4) + 4 * 1000 * 64
    assert _plan(tmp_path, "loss.fused_head=on").parts["logits"] == fused
    assert _plan(tmp_path, "loss.fused_head=off").parts["logits"] == 8 * 8 * 1000 * 16
    fp32 = _plan(tmp_path, "loss.kl_coef=0.1", "trainer.precision=bf16-mixed")
    assert fp32.parts["weights"] == fp32.parts["reference"] == QWEN_PARAMS * 4
    assert fp32.parts["autocast copies"] == QWEN_PARAMS * 2
    assert _plan(tmp_path, "trainer.precision=bf16-true").parts["weights"] == QWEN_PARAMS * 2
    sgd = _plan(tmp_path, "optim._target_=torch.optim.SGD", "~optim.betas", "~optim.fused", "+optim.momentum=0.9")
    assert sgd.parts["optimizer"] == QWEN_PARAMS * 4


def test_activations_by_hand_and_with_checkpointing(tmp_path):
    # fp32; per layer 2 norms (12H) + attention 16H + MLP 16I; top: norm + 4H. 8 rows of 2 prompts:
    # the shared-prompt forward runs 2 x 10 prompt tokens and 8 x 8 response tokens, and the 6 other
    # rows keep their prompt's keys and values (2 x 4 bytes x H per token and layer)
    per_token = 2 * (2 * 12 * 64 + 16 * 64 + 16 * 128) + 12 * 64 + 4 * 64
    assert _plan(tmp_path).parts["activations"] == (2 * 10 + 8 * 8) * per_token + 6 * 10 * 2 * (2 * 4 * 64)
    ckpt = _plan(tmp_path, "model.gradient_checkpointing=true").parts["activations"]
    layer = 2 * 12 * 64 + 16 * 64 + 16 * 128
    assert ckpt == 8 * 18 * (2 * 4 * 64 + layer + 12 * 64 + 4 * 64)  # each layer's input + one layer, no sharing
    assert _plan(tmp_path, "loss.micro_batch_size=2").parts["activations"] == 2 * 18 * per_token  # 2 prompts


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]], ids=["all-linear", "q-v"])
def test_lora_parameters_equal_peft(targets, tmp_path):
    model, _ = tiny_model_and_tokenizer()
    shape = shape_of(model.config)
    peft_model = apply_lora(model, LoraConfig(enabled=True, r=4, target_modules=targets))
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert trained == sum(4 * (i + o) for _, i, o in lora_linears(shape, targets)) > 0
    plan = _plan(tmp_path, "model.lora.enabled=true", "model.lora.r=4")
    adapters = sum(4 * (i + o) for _, i, o in lora_linears(shape_of(Qwen2Config(**QWEN)), "all-linear"))
    assert plan.parts["gradients"] == adapters * 4 and plan.parts["optimizer"] == 2 * adapters * 4
    assert plan.parts["weights"] == QWEN_PARAMS * 4 + adapters * 4


def test_recipe_shape_equals_the_built_checkpoint(tmp_path, monkeypatch):
    """arith_tiny's registered shape is the config the recipe saves (trained for 0 steps here)."""
    import creditlab_arith.model as recipe
    from creditlab_arith.shape import tiny_model_shape

    monkeypatch.setattr(recipe, "warm_start", lambda *a, **k: {})
    args = {"layers": 2, "hidden_size": 32, "heads": 2, "intermediate_size": 64, "sft_problems": 4}
    recipe._train(recipe.resolve_args(args), tmp_path)
    config, tok = tiny_model_shape(args)
    built = AutoConfig.from_pretrained(tmp_path).to_dict()
    for key in ("_name_or_path", "architectures", "dtype", "transformers_version"):
        built.pop(key, None)
    assert {k: v for k, v in config.to_dict().items() if k in built} == built
    assert len(tok) == config.vocab_size


def test_smollm2_shape_equals_the_gguf_files_config(tmp_path, monkeypatch):
    """smollm2_135m's registered config is the one the conversion builds: transformers' reading of
    the GGUF metadata (the recipe saves exactly that config; converting takes 20-40 s and 540 MB,
    so the metadata stands for it). 134,515,008 parameters: 49,152 x 576 tied embeddings + 30
    layers of q 576², k and v 576 x 192, o 576², MLP 3 x 576 x 1536, two norms 2 x 576 + the final norm."""
    pytest.importorskip("gguf")
    from creditlab_smollm2 import convert
    from creditlab_smollm2.shape import smollm2_sft_shape, smollm2_shape

    try:
        source = convert.gguf_path()
    except ValueError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv("CREDITLAB_CACHE", str(tmp_path))  # no converted checkpoint: the GGUF tokenizer
    config, tok = smollm2_shape({})
    gguf = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name).to_dict()
    for key in ("_name_or_path", "_model_name_or_path", "architectures", "dtype", "transformers_version"):
        gguf.pop(key, None)
    assert {k: v for k, v in config.to_dict().items() if k in gguf} == gguf
    layer = 576 * 576 * 2 + 2 * 576 * 192 + 3 * 576 * 1536 + 2 * 576
    assert shape_of(config).params == 49152 * 576 + 30 * layer + 576 == 134_515_008
    assert len(tok) == config.vocab_size and tok.eos_token == "<|im_end|>" and tok.chat_template
    sft_config, _ = smollm2_sft_shape({"stop_at_pass1": 0.3})
    assert sft_config.to_dict() == config.to_dict()
    with pytest.raises(ValueError, match="unknown smollm2_135m argument"):
        smollm2_shape({"dtyp": "float32"})


def _qwen2_params(H, I, n, kv, hd, V, tied):
    """Qwen2 by hand: q (with bias) and o H², k and v H x kv·hd (with bias), MLP 3HI, two norms."""
    layer = 2 * H * H + H + 2 * (H * kv * hd + kv * hd) + 3 * H * I + 2 * H
    return n * layer + V * H * (1 if tied else 2) + H


#: The hub presets' models by hand, and the sizes their model cards state (0.49B, 7.61B, 14.7B).
HUB = {
    "qwen2.5-0.5b-instruct": (_qwen2_params(896, 4864, 24, 2, 64, 151936, True), 494_032_768),
    "qwen2.5-7b-instruct": (_qwen2_params(3584, 18944, 28, 4, 128, 152064, False), 7_615_616_512),
    "qwen2.5-14b-instruct": (_qwen2_params(5120, 13824, 48, 8, 128, 152064, False), 14_770_033_664),
    # OLMo 3: q, k, v, o 4096² (32 KV heads), MLP 3 x 4096 x 11008, q/k norms and two post-norms
    # of 4096 per layer, an untied head, the final norm
    "olmo-3-7b-instruct": (32 * (4 * 4096**2 + 3 * 4096 * 11008 + 4 * 4096) + 2 * 100278 * 4096 + 4096,
                           7_298_011_136),
}


@pytest.fixture
def no_hub(monkeypatch):
    """A machine that reaches no hub and has nothing cached: every AutoConfig / AutoTokenizer read
    of memory_shape fails as it does offline."""
    from creditlab.run import memory_shape

    class Offline:
        for_model = staticmethod(AutoConfig.for_model)

        @staticmethod
        def from_pretrained(path, **kw):
            raise OSError(f"We couldn't connect to 'https://huggingface.co' to load {path} (offline)")

    monkeypatch.setattr(memory_shape, "AutoConfig", Offline)
    monkeypatch.setattr(memory_shape, "AutoTokenizer", Offline)


@pytest.mark.parametrize("preset", sorted(HUB))
def test_hub_presets_plan_offline_from_their_shipped_config(preset, no_hub):
    """Each hub preset's shape comes from its shipped config when the hub is out of reach: the
    parameters counted by hand, equal to its model card's; no tokenizer (prompts in characters)."""
    from creditlab.run.memory_shape import load_shape

    checked = validate(compose([f"model={preset}"]))
    shape, tokenizer, source = load_shape(checked["model"])
    by_hand, card = HUB[preset]
    assert shape.params == by_hand == card
    assert tokenizer is None and "shipped with creditlab" in source and "--" in source
    assert shape.fusable_head  # Qwen2 and OLMo 3 heads go through the fused path


def test_a_hub_id_without_a_shipped_config_names_the_fix(no_hub):
    from creditlab.run.memory_shape import load_shape

    checked = validate(compose(["model=qwen2.5-0.5b-instruct", "model.name_or_path=someone/Unknown-1B"]))
    with pytest.raises(ConfigError, match="cannot read the config of model.name_or_path=someone/Unknown-1B.*"
                                          "configs ship for the presets' hub models only .*Qwen/Qwen2.5-0.5B-Instruct"):
        load_shape(checked["model"])


def test_dry_run_of_a_hub_preset_works_offline(tmp_path):
    """`creditlab train model=qwen2.5-0.5b-instruct --dry-run` on a machine with an empty hub cache
    and HF_HUB_OFFLINE=1: the shipped shape, prompts in characters, both said plainly."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "creditlab.cli", "train", "--dry-run", "model=qwen2.5-0.5b-instruct",
                           "--memory-gib", "24"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "model_configs/Qwen--Qwen2.5-0.5B-Instruct.json" in out and "494,032,768" in out
    assert "characters (no tokenizer)" in out and "a chat template's own tokens are not counted" in out
    assert "loss.micro_batch_tokens" in out and "24.0 GiB (--memory-gib)" in out and "peak:" in out


def test_dry_run_of_a_smollm2_recipe_works_offline(tmp_path):
    """model=smollm2_135m_arith: the warm start's shape is its base's, registered; nothing built."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CREDITLAB_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "creditlab.cli", "train", "--dry-run", "model=smollm2_135m_arith"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "recipe smollm2_135m_sft" in out and "134,515,008" in out and "peak:" in out
    assert not (tmp_path / "cache" / "models").exists()


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    tiny_model_and_tokenizer(tmp_path / "model")
    run_dir = tmp_path / "run"
    main(["train", "--dry-run", f"model.name_or_path={tmp_path / 'model'}", f"run_dir={run_dir}",
          "model.gradient_checkpointing=true", "model.lora.enabled=true"])
    out = capsys.readouterr().out
    assert "peak:" in out and "GiB" in out and "kv cache" in out and "gradient checkpointing" in out
    assert not run_dir.exists()
    # a plan for another machine: trainer=gpu needs no GPU here, the checkpoint buffer is host memory
    main(["train", "--dry-run", f"model.name_or_path={tmp_path / 'model'}", "trainer=gpu", "--prompt-tokens", "40"])
    out = capsys.readouterr().out
    assert "peak:" in out and "of host memory" in out and "bf16-mixed" in out and "prompt <= 40 tokens" in out


def test_dry_run_names_a_folder_without_config(tmp_path, capsys):
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(SystemExit) as exc:
        main(["train", "--dry-run", f"model.name_or_path={tmp_path}"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "without config.json" in err and "weights.bin" in err and "save_pretrained" in err
    with pytest.raises(SystemExit):
        main(["train", "--prompt-tokens", "12"])  # only with --dry-run
    assert "goes with --dry-run" in capsys.readouterr().err


def test_dry_run_command_exits_0_quickly_for_the_default_recipe(tmp_path):
    """The embedded default (a recipe model) is estimated from the recipe's config: nothing built."""
    env = {**os.environ, "CREDITLAB_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "creditlab.cli", "train", "--dry-run", f"run_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - start < 120
    assert "peak:" in done.stdout and "arith_tiny" in done.stdout
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache" / "models").exists()


def test_an_empty_tokenizer_is_a_clear_error():
    """A tokenizer that encodes text to nothing stops the plan with what is wrong, not 'prompt <= 0'."""
    class Empty:
        name_or_path = "some/empty-tokenizer"
        chat_template = None

        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": []}

    problems = [Problem("1", "What is 2 + 3?", "5"), Problem("2", "7 - 4?", "3")]
    with pytest.raises(ConfigError, match="some/empty-tokenizer encodes every prompt to no token"):
        prompt_tokens(problems, Empty(), "auto")
    assert prompt_tokens(problems, None, "auto") == (14, "characters (no tokenizer)")
