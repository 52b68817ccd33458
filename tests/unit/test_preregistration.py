"""The ``preregistration`` block: validated before anything loads (one line naming the valid
choices), recorded in the run's config, read back from a file; a resume of a run from before
the key existed sees no difference."""

import pytest
from creditlab.analysis.preregistration import Contrast, Preregistration, load, parse
from creditlab.cli.overrides import check
from creditlab.errors import ConfigError
from creditlab.run.config import validate
from creditlab.run.rundir_guard import config_differences

BLOCK = {"name": "trap", "metric": "eval/sample_accuracy", "budgets": ["steps", "tokens/generated"],
         "baseline": "grpo", "contrasts": [{"group": "oracle_credit", "expect": "greater"},
                                           {"group": "sham_credit", "expect": "none"},
                                           {"group": "anti_credit", "expect": "less"}]}
OVERRIDE = ("preregistration={metric: eval/pass@1, budgets: [steps, tokens/trained], baseline: grpo, "
            "contrasts: [{group: srpo_oracle, expect: greater}], alpha: 0.01}")


def test_a_block_parses_with_its_defaults():
    p = parse(BLOCK)
    assert p == Preregistration("eval/sample_accuracy", ("steps", "tokens/generated"), "grpo",
                                (Contrast("oracle_credit", "greater"), Contrast("sham_credit", "none"),
                                 Contrast("anti_credit", "less")), ("method",), 0.05, 8, "trap")
    assert parse(None) is None
    assert parse({**BLOCK, "by": "method,rollout.split", "budgets": "time/train_s", "min_seeds": 5}).by == (
        "method", "rollout.split")
    assert parse(p.as_dict()) == p
    # a contrast may name its own budget axes (the family: every contrast x its axes)
    own = parse({**BLOCK, "contrasts": [{"group": "srpo_oracle", "expect": "none", "budgets": ["steps", "tokens/generated"]},
                                        {"group": "anti_credit", "expect": "less"}], "budgets": ["steps"]})
    assert own.contrasts[0] == Contrast("srpo_oracle", "none", ("steps", "tokens/generated"))
    assert [own.budgets_of(c) for c in own.contrasts] == [("steps", "tokens/generated"), ("steps",)]
    assert parse(own.as_dict()) == own and "budgets" not in own.as_dict()["contrasts"][1]


@pytest.mark.parametrize("change, message", [
    ({"metrc": "eval/pass@1"}, "preregistration: unknown key 'metrc'. Did you mean 'metric'? Valid keys: name, "
     "metric, budgets, by, baseline, contrasts, alpha, correction, seeds, min_seeds."),
    ({"budgets": ["steps", "tokens/generatd"]}, "preregistration.budgets: 'tokens/generatd' is not a budget axis. "
     "Did you mean 'tokens/generated'? Budget axes: steps, tokens/generated, tokens/trained, time/train_s."),
    ({"budgets": ["step"]}, "'step' is not a budget axis. Did you mean 'steps'?"),
    ({"budgets": ["steps", "steps"]}, "preregistration.budgets: lists an axis twice: steps, steps."),
    ({"budgets": []}, "preregistration.budgets: must be a budget axis or a list of them, got []."),
    ({"contrasts": [{"group": "a", "expect": "grater"}]}, "preregistration.contrasts[0].expect: 'grater' is not a "
     "prediction. Did you mean 'greater'? Choose one of: greater, less, none (none = no difference expected)."),
    ({"contrasts": [{"group": "a", "expected": "less"}]}, "preregistration.contrasts[0]: unknown key 'expected'. "
     "Did you mean 'expect'? Valid keys: group, expect, margin, baseline, budgets."),
    ({"contrasts": [{"group": "a", "expect": "less", "budgets": ["tokens"]}]}, "preregistration.contrasts[0].budgets: "
     "'tokens' is not a budget axis. Did you mean 'tokens/trained'?"),
    ({"contrasts": [{"group": "grpo", "expect": "less"}]}, "group 'grpo' is its own baseline"),
    ({"contrasts": [{"group": "a", "expect": "less"}, {"group": "a", "expect": "none"}]}, "group 'a' is listed twice against 'grpo'"),
    ({"contrasts": []}, "preregistration.contrasts: must be a non-empty list"),
    ({"metric": "pass@1"}, "preregistration.metric: must be an evaluation metric such as eval/pass@1"),
    ({"alpha": 5}, "preregistration.alpha: must be a number in (0, 1), got 5."),
    ({"min_seeds": 1}, "preregistration.min_seeds: must be an integer >= 2, got 1."),
    ({"baseline": None}, "preregistration: missing baseline (required: metric, budgets, baseline, contrasts)."),
])
def test_each_mistake_is_one_line_naming_the_choices(change, message):
    with pytest.raises(ConfigError) as exc:
        parse({**BLOCK, **change})
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_run_config_validates_it_before_anything_loads(tmp_path, capsys):
    checked = validate(check([OVERRIDE]))
    assert checked["preregistration"] == Preregistration("eval/pass@1", ("steps", "tokens/trained"), "grpo",
                                                         (Contrast("srpo_oracle", "greater"),), alpha=0.01)
    assert validate(check([]))["preregistration"] is None  # conf/train.yaml: preregistration: null
    with pytest.raises(SystemExit) as exc:
        check([OVERRIDE.replace("budgets: [steps, tokens/trained]", "budgets: [steps, tokens]")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("creditlab: error: preregistration.budgets: 'tokens' is not a budget axis.")
    # a sweep file (# @package _global_) sets the block, so every run's resolved config records it
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "sweeps" / "declared.yaml").write_text(
        "# @package _global_\npreregistration:\n  metric: eval/sample_accuracy\n  budgets: [tokens/generated]\n"
        "  baseline: grpo\n  contrasts:\n    - {group: oracle_credit, expect: greater}\n")
    cfg = check([f"hydra.searchpath=[file://{tmp_path}]", "+sweeps=declared"])
    assert cfg.preregistration.budgets == ["tokens/generated"]
    assert validate(cfg)["preregistration"].contrasts == (Contrast("oracle_credit", "greater"),)


def test_a_declaration_file(tmp_path):
    (tmp_path / "a.yaml").write_text("preregistration:\n  metric: eval/pass@1\n  budgets: steps\n  baseline: grpo\n"
                                     "  contrasts: [{group: m, expect: none}]\n")
    assert load(tmp_path / "a.yaml") == Preregistration("eval/pass@1", ("steps",), "grpo", (Contrast("m", "none"),))
    (tmp_path / "b.yaml").write_text("metric: eval/pass@1\nbudgets: steps\nbaseline: grpo\ncontrasts: [{group: m, expect: none}]\n")
    assert load(tmp_path / "b.yaml") == load(tmp_path / "a.yaml")  # the block itself
    (tmp_path / "c.yaml").write_text("preregistration: null\n")
    with pytest.raises(ConfigError, match=r"--prereg .*c.yaml: the file declares nothing"):
        load(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match=r"--prereg .*missing.yaml: cannot read it \(FileNotFoundError"):
        load(tmp_path / "missing.yaml")
    (tmp_path / "d.yaml").write_text("preregistration: {metric: eval/pass@1, budget: steps}\n")
    with pytest.raises(ConfigError, match=r"^--prereg .*d.yaml: unknown key 'budget'. Did you mean 'budgets'\?"):
        load(tmp_path / "d.yaml")


def test_a_run_from_before_the_key_resumes_but_a_changed_declaration_does_not():
    old = {"seed": 0, "method": "grpo"}
    assert config_differences(old, {**old, "preregistration": None}) == []
    changed = config_differences(old, {**old, "preregistration": {"metric": "eval/pass@1"}})
    assert changed == ["preregistration.metric: (missing) -> eval/pass@1"]
    # loss.skip_zero_advantage came later: absent means false; turning it on is a difference (the
    # entropy and ratio metrics would change what they average over in the middle of a run)
    loss = {"seed": 0, "loss": {"kl_coef": 0.0}}
    assert config_differences(loss, {"seed": 0, "loss": {"kl_coef": 0.0, "skip_zero_advantage": False}}) == []
    assert config_differences(loss, {"seed": 0, "loss": {"kl_coef": 0.0, "skip_zero_advantage": True}}) == [
        "loss.skip_zero_advantage: (missing) -> true"]


def test_a_run_from_before_auto_packing_resumes():
    """The update's memory layout keys change float rounding only (the packed, fused update equals
    the whole batch's): a run written with micro_batch_tokens 0, or before the key, resumes."""
    old = {"seed": 0, "loss": {"micro_batch_size": 0, "kl_coef": 0.0}}
    new = {"seed": 0, "loss": {"micro_batch_size": 16, "micro_batch_tokens": "auto", "fused_head": "auto", "kl_coef": 0.0}}
    assert config_differences(old, new) == []
    assert config_differences(old, {**new, "loss": {**new["loss"], "kl_coef": 0.1}}) == ["loss.kl_coef: 0.0 -> 0.1"]
