"""The paper presets in conf/experiment/ (``experiment=<name>``; docs/paper-presets.md) compose,
validate and build their parts here, although they need GPUs, vLLM and hub models to run: each
carries the SRPO paper's budget (METHODS.md section 2) and its method's own knobs."""

from __future__ import annotations

import pytest
from creditlab.backends import vllm as vllm_backend
from creditlab.errors import ConfigError
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import PART_KINDS, validate

# The testbed presets (credit_h<H>, docs/methods/horizon.md) are checked with their sweep.
#: Experiments that are not the paper's settings: the credit testbeds and the offline real-model runs.
NOT_PAPER = ("credit_", "smollm2_")
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml") if not p.stem.startswith(NOT_PAPER))
METHODS = ("srpo", "rrpo", "grpo", "oar_g", "rredcot")
MODELS = {"olmo3_7b": ("allenai/Olmo-3-7B-Instruct", 2), "qwen25_14b": ("Qwen/Qwen2.5-14B-Instruct", 4)}


def method_and_model(name: str) -> tuple[str, str]:
    for model in MODELS:
        if name.endswith("_" + model):
            return name.removesuffix("_" + model), model
    raise AssertionError(f"conf/experiment/{name}.yaml: name it <method>_<model>, model in {list(MODELS)}")


@pytest.fixture
def with_vllm(monkeypatch):
    """Validation checks that vLLM is installed (it is not in this venv): pretend it is."""
    monkeypatch.setattr(vllm_backend, "vllm_available", lambda: True)


def test_the_requested_presets_exist():
    assert set(EXPERIMENTS) == {f"{m}_{model}" for m in METHODS for model in MODELS}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_preset_composes_validates_and_builds(name, with_vllm):
    method, model = method_and_model(name)
    cfg = compose([f"experiment={name}"])
    checked = validate(cfg)
    assert method in METHODS and cfg.method == method
    assert method in cfg.tags and model in cfg.tags and "paper" in cfg.tags
    run, rollout, loss, m = checked["run"], checked["rollout"], checked["loss"], checked["model"]
    # The paper's budget (METHODS.md section 2).
    assert (m.name_or_path, cfg.trainer.devices) == MODELS[model]
    assert m.dtype == "bfloat16" and m.hints.get("localization_template", "paper") == "paper"
    assert m.lora.enabled and (m.lora.r, m.lora.alpha, m.lora.target_modules) == (64, 64, "all-linear")
    assert cfg.optim._target_ == "torch.optim.AdamW"
    assert (cfg.optim.lr, cfg.optim.weight_decay, run.grad_clip) == (5e-5, 0.01, 1.0)
    assert (run.prompts_per_step, rollout.group_size) == (32, 8)
    assert (rollout.temperature, rollout.top_p, rollout.top_k) == (0.7, 0.95, 0)
    assert rollout.thoughts and rollout.delimiter == "</thought>" and rollout.final_marker == "\\boxed{"
    assert (rollout.max_thoughts, rollout.max_thought_tokens) == (20, 256)
    assert loss.updates_per_batch == 4 and loss.kl_coef == 0.0
    assert (cfg.task.name, cfg.verifier.name, cfg.backend.name) == ("numina_olympiads", "math_verify", "vllm")
    assert cfg.backend.truncated_logprobs == "renormalized", "top_p < 1 under vLLM needs it"
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"
    assert checked["launch"].world_size == cfg.trainer.devices
    assert cfg.trainer.max_steps * run.prompts_per_step == 2 * 400, "two epochs of the 400 train problems"
    # Every part builds from the validated config.
    from tests.helpers import tiny_model_and_tokenizer

    tiny, tok = tiny_model_and_tokenizer()
    for kind in PART_KINDS:
        cls, config = checked["rollout_strategy" if kind == "rollout" else kind]
        if kind == "backend":
            cls(config, model=tiny, tokenizer=tok)  # the engine would start at the first generate
        elif kind == "segmenter":
            cls(config, tokenizer=None)
        elif kind == "rollout":
            selector_cls, selector_config = checked["reset_selector"]
            cls(config, rollout=rollout, tokenizer=tok, reset_selector=selector_cls(selector_config))
        else:
            getattr(cls(config), "close", lambda: None)()


def checked_and_cfg(*overrides: str):
    cfg = compose(list(overrides))
    return validate(cfg), cfg


def test_method_knobs_come_from_the_method_presets(with_vllm):
    rrpo, cfg = checked_and_cfg("experiment=rrpo_olmo3_7b")
    assert rrpo["rollout_strategy"][1].split == "1x4" and cfg.reset_selector.name == "random"
    assert cfg.rollout.name == "resets"
    srpo, cfg = checked_and_cfg("experiment=srpo_qwen25_14b")
    assert srpo["rollout_strategy"][1].split == "1x4" and cfg.reset_selector.name == "self_localize"
    assert (srpo["loss"].mode, srpo["loss"].agg) == ("reinforce", "seq-mean-token-mean")
    selector = srpo["reset_selector"][1]
    assert (selector.temperature, selector.template, selector.max_new_tokens) == (0.3, "paper", 4096)
    assert (srpo["advantage"][1].std, srpo["advantage"][1].eps) == ("population", 0.0)
    grpo, cfg = checked_and_cfg("experiment=grpo_qwen25_14b")
    assert cfg.rollout.name == "plain" and cfg.reset_selector.name == "none"
    assert (grpo["loss"].mode, grpo["loss"].agg, grpo["loss"].dual_clip) == ("clip", "token-mean", 3.0)
    assert grpo["advantage"][1].std == "sample"
    _, cfg = checked_and_cfg("experiment=oar_g_qwen25_14b")
    assert cfg.advantage.name == "oar_g" and cfg.advantage.chunk_size == 1
    _, cfg = checked_and_cfg("experiment=rredcot_qwen25_14b")
    assert (cfg.advantage.name, cfg.segmenter.name) == ("rredcot", "keyword_entropy")


def test_command_line_values_and_methods_override_a_preset(with_vllm):
    checked, cfg = checked_and_cfg(
        "experiment=grpo_olmo3_7b", "method=dr_grpo", "trainer.devices=8", "model.name_or_path=/m"
    )
    assert cfg.method == "dr_grpo" and cfg.advantage.name == "dr_grpo"
    assert checked["run"].prompts_per_step == 32 and cfg.trainer.devices == 8
    assert checked["model"].name_or_path == "/m" and checked["model"].lora.enabled
    checked, _ = checked_and_cfg("experiment=rrpo_qwen25_14b", "rollout.split=2x4")
    assert checked["rollout_strategy"][1].split == "2x4" and checked["rollout"].temperature == 0.7


def test_without_vllm_a_preset_fails_validation_naming_the_install():
    if vllm_backend.vllm_available():
        pytest.skip("vLLM is installed here")
    with pytest.raises(ConfigError, match="vllm"):
        validate(compose(["experiment=srpo_qwen25_14b"]))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_presets_encode_and_reward_as_the_official_code(name, with_vllm):
    """Issue 14: the thought loop of the SRPO code encodes the plain instruction (no chat
    template) for rollouts and evaluation alike; its math rewards are float(is_correct) (0 or 1),
    which math_verify with these settings gives (a truncated chain is scored as it is)."""
    checked, cfg = checked_and_cfg(f"experiment={name}")
    rollout = checked["rollout"]
    assert rollout.chat_template is False
    # and after a thought ending with EOS asks for the next one (until \boxed{ or the budget)
    assert rollout.end_at_eos is False and rollout.thought_config.end_at_eos is False
    assert (rollout.truncation, rollout.success_reward) == ("keep", 1.0)
    assert (cfg.verifier.reward_correct, cfg.verifier.reward_wrong) == (1.0, 0.0)


@pytest.mark.parametrize("model", MODELS)
def test_srpo_localization_as_the_official_code(model, with_vllm):
    """The localization call reuses the rollout sampling (top-p 0.95) at temperature 0.3, shows
    the bare problem, and is chat-templated although the rollouts are not."""
    checked, _ = checked_and_cfg(f"experiment=srpo_{model}")
    selector = checked["reset_selector"][1]
    assert (selector.temperature, selector.top_p, selector.top_k) == (0.3, 0.95, 0)
    assert (selector.problem_field, selector.chat_template, selector.max_new_tokens) == ("problem", "auto", 4096)
    # 1x8 localizes greedily in the official code: one override, the rest unchanged.
    checked, _ = checked_and_cfg(f"experiment=srpo_{model}", "rollout.split=1x8", "reset_selector.temperature=0")
    assert checked["rollout_strategy"][1].split == "1x8"
    assert (checked["reset_selector"][1].temperature, checked["reset_selector"][1].top_p) == (0.0, 0.95)


def test_the_plug_in_default_localizes_with_the_rollout_sampling():
    """``reset_selector=self_localize`` takes top-p/top-k from the rollout (official behaviour):
    unchanged on the default run (top-p 1), 0.95 wherever the rollouts use 0.95."""
    checked, _ = checked_and_cfg("method=srpo")
    assert (checked["reset_selector"][1].top_p, checked["reset_selector"][1].top_k) == (1.0, 0)
    assert checked["reset_selector"][1].problem_field == "" and checked["rollout"].chat_template == "auto"
    assert checked["rollout"].end_at_eos is True  # the default run ends a chain at EOS
    checked, _ = checked_and_cfg("method=srpo", "rollout.top_p=0.9", "rollout.top_k=20")
    assert (checked["reset_selector"][1].top_p, checked["reset_selector"][1].top_k) == (0.9, 20)
