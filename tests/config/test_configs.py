"""Every shipped YAML composes, validates and builds."""

import functools

import pytest
import torch
from creditlab.backends.vllm import vllm_available
from creditlab.errors import ConfigError
from creditlab.registry import REGISTRIES
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import PART_KINDS, validate
from hydra.utils import instantiate

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "experiment")
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]


def test_default_composes_and_validates():
    cfg = compose([])
    checked = validate(cfg)
    assert checked["run"].method == "grpo"


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes_and_builds(group, option):
    overrides = [f"{group}={option}"]
    if group == "reset_selector" and option != "none":
        overrides.append("rollout=resets")  # a reset selector needs a strategy that resets
    if (group, option) == ("rollout", "resets"):
        overrides.append("reset_selector=random")
    cfg = compose(overrides)
    if (group, option) == ("backend", "vllm") and not vllm_available():
        # Without vLLM, selecting it fails while validating, with the install command.
        with pytest.raises(ConfigError, match="make setup-vllm"):
            validate(cfg)
        return
    checked = validate(cfg)
    if group in PART_KINDS:
        assert cfg[group]["name"] == option, "entry-point name = YAML stem = name field"
        assert option in REGISTRIES[group]
        cls, config = checked["rollout_strategy" if group == "rollout" else group]
        if group == "backend":
            from tests.helpers import tiny_model_and_tokenizer

            model, tok = tiny_model_and_tokenizer()
            part = cls(config, model=model, tokenizer=tok)  # the vLLM engine starts lazily
        elif group == "segmenter":
            part = cls(config, tokenizer=None)
        elif group == "rollout":
            from creditlab_resets.selectors import RandomResetSelector

            from tests.helpers import char_tokenizer

            part = cls(config, rollout=checked["rollout"], tokenizer=char_tokenizer(),
                       reset_selector=RandomResetSelector())
        else:
            part = cls(config)
        assert part.config == config
        getattr(part, "close", lambda: None)()
    if group == "trainer" and option == "cpu":
        trainer_cfg = dict(cfg.trainer)
        trainer_cfg.update(logger=False, enable_checkpointing=False, enable_progress_bar=False)
        instantiate(trainer_cfg)
    if group == "method":
        assert cfg.method == option


def test_optimizer_builds():
    cfg = compose([])
    opt = instantiate(cfg.optim, _partial_=True)(params=[torch.nn.Parameter(torch.zeros(2))])
    assert isinstance(opt, torch.optim.Optimizer)


def test_every_registered_builtin_has_a_yaml():
    for kind in PART_KINDS:
        for name in REGISTRIES[kind].names():
            if REGISTRIES[kind].entries[name].dist == "creditlab":
                assert (CONF_DIR / kind / f"{name}.yaml").exists(), f"conf/{kind}/{name}.yaml missing"


def test_the_embedded_task_yaml_exposes_every_option():
    """conf/task/arith.yaml lists every ArithTask.Config field, so each is a plain override
    (``task.trap_at=8``) rather than an 'unknown config key' error at a sweep's start."""
    import dataclasses

    import yaml

    listed = set(yaml.safe_load((CONF_DIR / "task" / "arith.yaml").read_text()))
    fields = {f.name for f in dataclasses.fields(REGISTRIES["task"].get("arith").Config)}
    assert fields <= listed, f"conf/task/arith.yaml lacks {sorted(fields - listed)}"


SWEEPS = sorted(p.stem for p in (CONF_DIR.parent / "sweeps").glob("*.yaml"))


def compose_sweep_job(sweep: str, job: list[str]):
    """The config of one job of ``+sweeps=<sweep>``, with its ``hydra`` node (sweep dirs).
    Cached: several tests read the same jobs (do not modify the result)."""
    return _compose_sweep_job(sweep, tuple(job))


@functools.lru_cache(maxsize=None)
def _compose_sweep_job(sweep: str, job: tuple[str, ...]):
    from creditlab.run.compose import searchpath_override
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=[*searchpath_override(), f"+sweeps={sweep}", *job], return_hydra_config=True)


def sweep_jobs(sweep: str) -> list[list[str]]:
    """Every job of the sweep (the full grid of ``hydra.sweeper.params``) as override lists."""
    import itertools

    params = {k: str(v).split(",") for k, v in compose_sweep_job(sweep, []).hydra.sweeper.params.items()}
    assert params, f"sweeps/{sweep}.yaml sets no hydra.sweeper.params"
    return [[f"{k}={v}" for k, v in zip(params, values)] for values in itertools.product(*params.values())]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweeps_compose_and_every_job_validates(sweep):
    """Every sweep in sweeps/ composes (``+sweeps=<name>``), each of its jobs validates and gets
    its own output folder, and its runs share a W&B group and a tag named after the sweep."""
    subdirs = []
    for job in sweep_jobs(sweep):
        cfg = compose_sweep_job(sweep, job)
        validate(cfg)
        subdirs.append(f"{cfg.hydra.sweep.dir}/{cfg.hydra.sweep.subdir}")
        assert cfg.logger.wandb.group == sweep, f"sweeps/{sweep}.yaml: set logger.wandb.group: {sweep}"
        assert sweep in cfg.tags, f"sweeps/{sweep}.yaml: add '{sweep}' to tags"
    assert len(set(subdirs)) == len(subdirs), f"jobs of {sweep} share output folders: {subdirs}"


def test_localization_budget_follows_the_model():
    """``self_localize`` gets the model's localization budget unless the command line sets one."""
    budget = lambda *o: validate(compose(["method=srpo", *o]))["reset_selector"][1].max_new_tokens  # noqa: E731
    assert budget() == 64
    assert budget("model=tiny_localize") == 160
    assert budget("model=tiny_localize", "reset_selector.max_new_tokens=32") == 32
    cfg = compose(["model=tiny_localize"])
    assert dict(cfg.model.recipe_args) == {
        "stop_at_pass1": None, "localization": 0.5, "localization_answer": "resolve", "steps": 2000,
    }  # tiny's early stop switched off: localization is learned late


@pytest.mark.parametrize("method", ["grpo", "srpo", "oar_g"])
def test_the_real_model_experiment_composes_with_any_preset(method):
    """experiment=smollm2_arith_grpo (docs/real-model.md): the warm-started SmolLM2 on arith, its
    held-out greedy score on 500 problems; the method stays a free choice."""
    cfg = compose(["experiment=smollm2_arith_grpo", f"method={method}"])
    checked = validate(cfg)
    m = checked["model"]
    assert (m.name_or_path, m.recipe, m.recipe_args["stop_at_pass1"]) == (None, "smollm2_135m_sft", 0.3)
    assert m.hints["localization_template"] == "paper" and cfg.method == method
    assert (cfg.prompts_per_step, cfg.rollout.group_size, cfg.trainer.max_steps) == (8, 8, 40)
    assert (cfg.eval.problems, cfg.eval.samples, cfg.task.name) == (500, 0, "arith")


def test_the_word_problem_experiment_trains_on_the_task_its_warm_start_learned():
    """experiment=smollm2_words_grpo: the run's task and the warm start's recipe task are both the
    word-problem rendering, with room for its longer chains."""
    cfg = compose(["experiment=smollm2_words_grpo"])
    checked = validate(cfg)
    m = checked["model"]
    assert (m.recipe, dict(m.recipe_args["task"])) == ("smollm2_135m_sft", {"render": "words"})
    assert cfg.task.render == "words" and cfg.rollout.max_new_tokens == m.recipe_args["max_new_tokens"] == 128
    assert m.recipe_args["localization"] == 0 and cfg.eval.problems == 500


@pytest.mark.parametrize("method", ["grpo", "srpo"])
def test_the_real_problem_experiment_trains_the_shipped_warm_start_on_real_problems(method):
    """experiment=smollm2_word_problems_grpo (docs/real-problems.md): the word-problem warm start on
    the word_problems task, its lines as thoughts, the gsm8k verifier, and the headline's sampled
    accuracy on a fixed held-out subset; the method stays a free choice."""
    cfg = compose(["experiment=smollm2_word_problems_grpo", f"method={method}"])
    checked = validate(cfg)
    m = checked["model"]
    assert (m.name_or_path, m.recipe, dict(m.recipe_args)) == (None, "smollm2_135m_word_problems", {})
    assert (cfg.task.name, cfg.task.test_set, cfg.segmenter.name, cfg.verifier.name) == (
        "word_problems", "gsm8k_test", "newline", "gsm8k")
    assert (cfg.prompts_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (8, 8, 192)
    assert (cfg.eval.every, cfg.eval.problems, cfg.eval.samples, cfg.trainer.max_steps) == (10, 300, 4, 60)
    assert cfg.method == method
    assert cfg.rollout.delimiter == "\n"  # thought spans are lines for every part that reads them
    assert (cfg.rollout.max_thoughts, cfg.rollout.max_thought_tokens) == (8, 64)  # credit-bench fits in memory


@pytest.mark.parametrize("control", ["oracle_credit", "sham_credit", "anti_credit"])
def test_the_credit_controls_read_lines_on_the_real_problem_experiment(control):
    """The controls' thought spans come from ``advantage.delimiter``: on word problems they must be
    the lines the newline segmenter and the step oracle read, or a solution is one thought and
    oracle_credit silently equals GRPO (it did, before the experiment set the delimiter)."""
    cfg = compose(["experiment=smollm2_word_problems_grpo", f"method={control}"])
    validate(cfg)
    assert cfg.advantage.name == control and cfg.advantage.delimiter == "\n"


def test_one_pass_thought_decoding_is_checked_before_the_model_loads(monkeypatch):
    from creditlab.backends.hf import HFBackend

    assert validate(compose(["rollout.thought_decoding=one_pass"]))["rollout"].thought_config.decoding == "one_pass"
    with pytest.raises(ConfigError, match="end_at_eos=true"):
        validate(compose(["rollout.thought_decoding=one_pass", "rollout.end_at_eos=false"]))
    with pytest.raises(ConfigError, match="rounds or one_pass"):
        validate(compose(["rollout.thought_decoding=single"]))
    monkeypatch.setattr(HFBackend, "watches", False)  # a backend without generate_watched
    with pytest.raises(ConfigError, match="use rollout.thought_decoding=rounds"):
        validate(compose(["rollout.thought_decoding=one_pass"]))
