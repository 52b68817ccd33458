"""Ready sweeps: the method comparison covers every preset on equal budgets, the W&B sweep file
is valid and runs the same config, and a sweep's group and tags reach the loggers."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import validate
from creditlab_resets.buffer import parse_split
from omegaconf import OmegaConf

from tests.config.test_configs import compose_sweep_job, sweep_jobs

SWEEPS_DIR = CONF_DIR.parent / "sweeps"
#: The controls (docs/methods/controls.md) are instruments, not methods: they need a task with a
#: step oracle and run in the decomposition sweeps, not in compare_methods.
CONTROLS = {"oracle_credit", "sham_credit", "anti_credit", "reward_flip"}
PRESETS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml") if p.stem not in CONTROLS)


def test_compare_methods_covers_every_preset_on_equal_budgets():
    """Same steps, prompts per step, trained completions per prompt (reset methods split them
    inside rollout.group_size), response budget, optimizer steps and learning rate."""
    jobs = sweep_jobs("compare_methods")
    budgets, methods, seeds = set(), set(), set()
    for job in jobs:
        cfg = compose_sweep_job("compare_methods", job)
        checked = validate(cfg)
        run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
        methods.add(run.method)
        seeds.add(run.seed)
        if cfg.rollout.name == "resets":
            base, r, k = parse_split(checked["rollout_strategy"][1].split, rollout.group_size)
            assert base + r * k == rollout.group_size and base >= 0
        budgets.add((int(cfg.trainer.max_steps), run.prompts_per_step, rollout.group_size,
                     rollout.max_new_tokens, loss.updates_per_batch, float(cfg.optim.lr)))
    assert methods == set(PRESETS), f"compare_methods misses presets: {set(PRESETS) - methods}"
    assert seeds == {0, 1, 2} and len(jobs) == len(PRESETS) * 3
    assert budgets == {(80, 8, 8, 64, 1, 2e-5)}, f"unequal budgets across methods: {budgets}"


def _hydra_params(sweep: str) -> dict[str, list[str]]:
    params = compose_sweep_job(sweep, []).hydra.sweeper.params
    return {k: str(v).split(",") for k, v in params.items()}


def _wandb_args(parameters: dict[str, dict]) -> list[list[str]]:
    """Every run's ``${args_no_hyphens}``, formatted as the W&B agent does (``f"{key}={value}"``)."""
    grid = {k: spec["values"] if "values" in spec else [spec["value"]] for k, spec in parameters.items()}
    return [[f"{k}={v}" for k, v in zip(grid, values)] for values in itertools.product(*grid.values())]


def test_wandb_sweep_parses_and_its_parameters_are_valid_overrides():
    path = SWEEPS_DIR / "wandb" / "compare_methods.yaml"
    spec = yaml.safe_load(path.read_text())
    assert spec["method"] in ("grid", "random", "bayes")
    assert spec["program"] == "creditlab"
    command = spec["command"]
    assert command[:3] == ["${env}", "${program}", "train"] and "${args_no_hyphens}" in command
    fixed = [c for c in command[3:] if not c.startswith("${")]
    for name, param in spec["parameters"].items():
        assert set(param) & {"value", "values", "distribution"}, f"parameter {name}: no value(s)"
    # Same methods and seeds as the Hydra sweep it mirrors.
    hydra = _hydra_params("compare_methods")
    params = spec["parameters"]
    assert sorted(params["method"]["values"]) == sorted(hydra["method"])
    assert [str(s) for s in params["seed"]["values"]] == hydra["seed"]
    run_dirs = set()
    for args in _wandb_args(params):
        cfg = compose([*fixed, *args])  # an unknown key or value fails here
        validate(cfg)
        run_dirs.add(cfg.run_dir)
        assert cfg.logger.wandb.offline is False and cfg.logger.wandb.group == "compare_methods"
    assert len(run_dirs) == len(PRESETS) * 3, "every run needs its own run_dir"


@pytest.mark.parametrize("logger", ["wandb", "none"])
def test_sweep_group_and_tags_reach_the_loggers(logger, tmp_path, monkeypatch):
    """With W&B, runs of a sweep share its group and carry its tag (plus the method); with
    ``logger=none`` the group merged in by the sweep does not create a logger."""
    import creditlab.run.runner as runner

    made = []

    def fake_instantiate(node, **kwargs):
        made.append({**dict(node), **kwargs})
        return SimpleNamespace(log_hyperparams=lambda params: None)

    monkeypatch.setattr(runner, "instantiate", fake_instantiate)
    cfg = compose(["+sweeps=srpo_splits", f"logger={logger}", "rollout.split=2x4"])
    checked = validate(cfg)
    loggers = runner._loggers(cfg, Path(tmp_path), None, checked["run"])
    if logger == "none":
        assert made == [] and len(loggers) == 1  # metrics.jsonl only
        return
    [wandb] = made
    assert wandb["group"] == "srpo_splits"
    assert "srpo_splits" in wandb["tags"] and "srpo" in wandb["tags"]


def test_horizon_sweep_runs_the_reset_methods_at_every_horizon_on_equal_budgets():
    """Every method x horizon x 5 seeds; within a horizon the same budgets and warm start for every
    method; every run scores the same held-out problems (paired per-problem tests)."""
    jobs = sweep_jobs("horizon")
    cells, budgets, models, evals, horizons = set(), {}, {}, set(), set()
    for job in jobs:
        cfg = compose_sweep_job("horizon", job)
        checked = validate(cfg)
        run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
        h = int(cfg.task.max_steps)
        assert cfg.task.min_steps == h and cfg.task.numbered, "a horizon preset fixes the number of steps"
        cells.add((h, run.method, run.seed))
        if cfg.rollout.name == "resets":
            base, r, k = parse_split(checked["rollout_strategy"][1].split, rollout.group_size)
            assert base + r * k == rollout.group_size and base >= 0
        budgets.setdefault(h, set()).add((int(cfg.trainer.max_steps), run.prompts_per_step, rollout.group_size,
                                          rollout.max_new_tokens, loss.updates_per_batch, float(cfg.optim.lr)))
        models.setdefault(h, set()).add(str(cfg.model.recipe_args))
        horizons.add(h)
        assert cfg.model.recipe_args.task.max_steps == h, "the warm start is trained on the preset's horizon"
        evals.add((cfg.eval.problems, cfg.eval.every, cfg.eval.samples))
    assert cells == set(itertools.product(horizons, ["grpo", "rrpo", "srpo", "srpo_oracle"], range(5)))
    assert all(len(b) == 1 for b in budgets.values()), f"unequal budgets within a horizon: {budgets}"
    assert all(len(m) == 1 for m in models.values()) and len(evals) == 1, (models, evals)


def test_free_words_sweep_places_every_method_at_each_knob_on_equal_budgets():
    """The positive control's grid: every method x free_words x 5 seeds; within a knob setting the
    same budgets and a warm start trained on the run's own task (its free words included)."""
    cells, budgets, models, knobs = set(), {}, {}, set()
    for job in sweep_jobs("free_words"):
        cfg = compose_sweep_job("free_words", job)
        checked = validate(cfg)
        run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
        k = int(cfg.task.free_words)
        knobs.add(k)
        cells.add((k, run.method, run.seed))
        recipe_task = cfg.model.recipe_args.task
        assert (recipe_task.free_words, recipe_task.max_steps) == (k, cfg.task.max_steps) == (k, 8)
        assert rollout.max_new_tokens >= 260, "8 thoughts with free words run to ~194 tokens"
        budgets.setdefault(k, set()).add((int(cfg.trainer.max_steps), run.prompts_per_step, rollout.group_size,
                                          rollout.max_new_tokens, loss.updates_per_batch, float(cfg.optim.lr),
                                          cfg.eval.problems, cfg.eval.every, cfg.eval.samples))
        models.setdefault(k, set()).add(str(cfg.model.recipe_args))
    methods = ["grpo", "srpo_oracle", "rrpo", "srpo", "vineppo", "oar_g", "ibpo", "rredcot"]
    assert knobs == {0, 2} and cells == set(itertools.product(knobs, methods, range(5)))
    assert all(len(b) == 1 for b in budgets.values()), f"unequal budgets within a knob setting: {budgets}"
    assert all(len(m) == 1 for m in models.values()), models


def test_trap_sweep_places_every_method_on_the_trap_preset_on_equal_budgets():
    """The second lever's grid: every method x 5 seeds on experiment=credit_trap, with one budget,
    one warm start that saw the trap in only a small share of its problems, and a trap in every
    RL and held-out problem."""
    cells, budgets, models = set(), set(), set()
    for job in sweep_jobs("trap"):
        cfg = compose_sweep_job("trap", job)
        checked = validate(cfg)
        run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
        cells.add((run.method, run.seed))
        assert cfg.task.trap == 1 and (cfg.task.min_steps, cfg.task.max_steps) == (8, 8)
        assert 0 < cfg.model.recipe_args.task.trap < 0.5, "the warm start must see the trap rarely"
        budgets.add((int(cfg.trainer.max_steps), run.prompts_per_step, rollout.group_size, rollout.max_new_tokens,
                     loss.updates_per_batch, float(cfg.optim.lr), cfg.eval.problems, cfg.eval.every, cfg.eval.samples))
        models.add(str(cfg.model.recipe_args))
    methods = ["grpo", "srpo_oracle", "rrpo", "srpo", "vineppo", "oar_g", "ibpo", "rredcot"]
    assert cells == set(itertools.product(methods, range(5)))
    assert len(budgets) == 1 and len(models) == 1, (budgets, models)


def test_trap_last_is_the_trap_sweep_with_every_trap_on_the_last_step():
    """experiment=credit_trap_last over the trap sweep: the same jobs, budgets and warm start as
    credit_trap's (its cache key unchanged), every trap on step 8 of 8."""
    for job in sweep_jobs("trap"):
        base = compose_sweep_job("trap", job)
        last = compose_sweep_job("trap", [o.replace("experiment=credit_trap", "experiment=credit_trap_last") for o in job])
        assert (last.task.trap, last.task.trap_at, base.task.trap_at) == (1, 8, 0)
        for key in ("trainer", "rollout", "loss", "optim", "eval", "method", "seed", "prompts_per_step"):
            assert last[key] == base[key], key
        assert last.model == base.model
        assert {k: v for k, v in last.task.items() if k != "trap_at"} == {k: v for k, v in base.task.items() if k != "trap_at"}


@pytest.mark.parametrize(("sweep", "traps"), [("decompose_multi", 3), ("decompose_trap", 1)])
def test_decompose_sweeps_run_the_controls_on_equal_budgets_and_declare_their_comparison(sweep, traps):
    """Issue 38's decomposition: grpo, the oracle reset and the four controls x 8 seeds on one warm
    start and one budget; the pre-registered contrasts are groups of the sweep, tested against
    grpo on sampled accuracy, and every control trains GRPO's tokens with GRPO's loss."""
    from creditlab.analysis.preregistration import parse

    cells, budgets, models, declared = set(), set(), set(), set()
    for job in sweep_jobs(sweep):
        cfg = compose_sweep_job(sweep, job)
        checked = validate(cfg)
        run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
        cells.add((run.method, run.seed))
        assert cfg.task.traps == traps and cfg.task.trap == 1
        budgets.add((int(cfg.trainer.max_steps), run.prompts_per_step, rollout.group_size, rollout.max_new_tokens,
                     loss.updates_per_batch, float(cfg.optim.lr), cfg.eval.problems, cfg.eval.every, cfg.eval.samples))
        models.add(str(cfg.model.recipe_args))
        if run.method in CONTROLS:
            assert (loss.mode, loss.agg, cfg.advantage.std, cfg.advantage.eps) == ("clip", "seq-mean-token-mean", "sample", 1e-6)
            assert cfg.rollout.group_size == 8 and cfg.reset_selector.name == "none"
        declared.add(yaml.safe_dump(OmegaConf.to_container(cfg.preregistration)))
    methods = ["grpo", "oracle_credit", "sham_credit", "anti_credit", "reward_flip", "srpo_oracle"]
    assert cells == set(itertools.product(methods, range(8)))
    assert len(budgets) == 1 and len(models) == 1 and len(declared) == 1, (budgets, models)
    prereg = parse(yaml.safe_load(next(iter(declared))))
    assert prereg.baseline == "grpo" and prereg.metric == "eval/sample_accuracy" and prereg.min_seeds == 8
    assert {c.group for c in prereg.contrasts} == set(methods) - {"grpo"}


def _same_eval_but_cadence(a, b) -> bool:
    """The same evaluation except how often: a run's randomness is a function of (seed, step,
    stream) (creditlab.step.module), so the cadence changes neither training nor the declared metric,
    step 100's evaluation, only the points of the curve."""
    strip = lambda cfg: {k: v for k, v in OmegaConf.to_container(cfg.eval).items() if k != "every"}  # noqa: E731
    return strip(a) == strip(b) and a.trainer.max_steps % a.eval.every == 0


def test_place_multi_is_the_decomposition_budget_for_every_other_method():
    """sweeps/place_multi.yaml: the six other methods x 8 seeds on credit_multi with the budgets
    and warm start of decompose_multi (whose grpo runs are its baseline), each a declared contrast."""
    from creditlab.analysis.preregistration import load

    base = compose_sweep_job("decompose_multi", next(iter(sweep_jobs("decompose_multi"))))
    cells = set()
    for job in sweep_jobs("place_multi"):
        cfg = compose_sweep_job("place_multi", job)
        run = validate(cfg)["run"]
        cells.add((run.method, run.seed))
        for key in ("trainer", "prompts_per_step", "model", "task", "optim"):
            assert cfg[key] == base[key], key
        assert _same_eval_but_cadence(cfg, base) and cfg.eval.every == 50
        assert cfg.rollout.group_size == base.rollout.group_size
        assert cfg.rollout.max_new_tokens == base.rollout.max_new_tokens
    methods = ["rrpo", "srpo", "vineppo", "oar_g", "ibpo", "rredcot"]
    assert cells == set(itertools.product(methods, range(8)))
    assert [c.group for c in load(SWEEPS_DIR / "place_multi.yaml").contrasts] == methods


def _cells_like_decompose_multi(sweep: str) -> set[tuple[str, int]]:
    """The (method, seed) cells of a follow-up sweep, after checking that each job's config is
    decompose_multi's for its method (the evaluation's cadence aside: every 50 steps)."""
    base = {run: compose_sweep_job("decompose_multi", job) for job in sweep_jobs("decompose_multi")
            for run in [(dict(o.split("=", 1) for o in job)["method"])]}
    cells = set()
    for job in sweep_jobs(sweep):
        cfg = compose_sweep_job(sweep, job)
        run = validate(cfg)["run"]
        cells.add((run.method, run.seed))
        ref = base[run.method]
        for key in ("trainer", "prompts_per_step", "model", "task", "optim", "rollout", "loss", "advantage"):
            assert cfg[key] == ref[key], key
        assert _same_eval_but_cadence(cfg, ref) and cfg.eval.every == 50
    return cells


def test_confirm_multi_repeats_the_decomposition_on_fresh_seeds_with_one_contrast():
    """sweeps/confirm_multi.yaml: grpo and oracle_credit on seeds 8-19 (none of decompose_multi's),
    every other key of the config as decompose_multi's, one declared contrast (no Holm penalty)."""
    from creditlab.analysis.preregistration import load

    assert _cells_like_decompose_multi("confirm_multi") == set(itertools.product(["grpo", "oracle_credit"], range(8, 20)))
    prereg = load(SWEEPS_DIR / "confirm_multi.yaml")
    assert [(c.group, c.expect) for c in prereg.contrasts] == [("oracle_credit", "greater")]
    assert prereg.min_seeds == 12 and prereg.baseline == "grpo"


def test_sham_multi_tests_credit_alone_against_its_matched_control_on_fresh_seeds():
    """sweeps/sham_multi.yaml (issue 55): oracle_credit against sham_credit on seeds 20-35 (none
    of decompose_multi's or confirm_multi's), every other key as decompose_multi's, one declared
    contrast with the sham as its baseline and the seeds fixed in the declaration."""
    from creditlab.analysis.preregistration import load

    assert _cells_like_decompose_multi("sham_multi") == set(itertools.product(["oracle_credit", "sham_credit"], range(20, 36)))
    prereg = load(SWEEPS_DIR / "sham_multi.yaml")
    assert [(c.group, c.expect) for c in prereg.contrasts] == [("oracle_credit", "greater")]
    assert prereg.baseline == "sham_credit" and prereg.seeds == tuple(range(20, 36))


def test_bf16_equivalence_differs_from_the_decomposition_grpo_only_in_precision():
    """sweeps/bf16_equivalence.yaml (issue 54): decompose_multi's GRPO on seeds 40-51, once with
    ``precision=fp32`` and once with ``precision=bf16``; the two arms differ in the update's
    precision and decoding's dtype only, and the declaration is one equivalence contrast."""
    from creditlab.analysis.preregistration import load

    base = next(compose_sweep_job("decompose_multi", job) for job in sweep_jobs("decompose_multi")
                if "method=grpo" in job)
    cells = set()
    for job in sweep_jobs("bf16_equivalence"):
        cfg = compose_sweep_job("bf16_equivalence", job)
        run = validate(cfg)["run"]
        cells.add((cfg.trainer.precision, cfg.backend.dtype, run.seed))
        assert run.method == "grpo"
        for key in ("prompts_per_step", "model", "task", "optim", "rollout", "loss", "advantage"):
            assert cfg[key] == base[key], key
        trainer = {k: v for k, v in cfg.trainer.items() if k != "precision"}
        assert trainer == {k: v for k, v in base.trainer.items() if k != "precision"}
        assert {k: v for k, v in cfg.backend.items() if k != "dtype"} == {k: v for k, v in base.backend.items() if k != "dtype"}
        assert _same_eval_but_cadence(cfg, base) and cfg.eval.every == 100
    arms = [("32-true", "auto"), ("bf16-mixed", "bfloat16")]
    assert base.trainer.precision == "32-true" and base.backend.dtype == "auto"
    assert cells == {(p, d, s) for (p, d) in arms for s in range(40, 52)}
    prereg = load(SWEEPS_DIR / "bf16_equivalence.yaml")
    assert prereg.by == ("trainer.precision",) and prereg.baseline == "32-true"
    assert [(c.group, c.expect, c.margin) for c in prereg.contrasts] == [("bf16-mixed", "none", 0.01)]
    assert prereg.seeds == tuple(range(40, 52))
