"""Bad overrides end with one clear line naming the fix."""

import pytest
from creditlab.cli.overrides import _sweep_variants, check


def _message(capsys, overrides):
    with pytest.raises(SystemExit) as exc:
        check(overrides)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_unknown_plugin_name(capsys):
    err = _message(capsys, ["advantage=nope"])
    assert "unknown advantage 'nope'" in err and "grpo" in err


def test_close_plugin_name_suggests(capsys):
    err = _message(capsys, ["advantage=gpro"])
    assert "Did you mean 'advantage=grpo'" in err


def test_misspelt_nested_key(capsys):
    err = _message(capsys, ["trainer.max_stpes=2"])
    assert "unknown config key 'trainer.max_stpes'" in err and "Did you mean 'trainer.max_steps'" in err


def test_a_mapping_value_adding_keys_names_the_plus(capsys):
    """The key exists; its value adds keys (was: "unknown config key 'model.recipe_args'. Did you
    mean 'model.recipe_args'?")."""
    err = _message(capsys, ["model.recipe_args={seed: 1}"])
    assert "'model.recipe_args' has no key 'seed'" in err and "'+model.recipe_args={seed: 1}'" in err
    assert "Did you mean" not in err and err.count("\n") == 1


def test_misspelt_top_level_key(capsys):
    err = _message(capsys, ["seeed=3"])
    assert "Did you mean 'seed'" in err


def test_added_unknown_section_key(capsys):
    err = _message(capsys, ["+advantage.stdd=none"])
    assert "unknown key 'advantage.stdd'" in err and "Did you mean 'advantage.std'" in err


def test_wrong_type(capsys):
    err = _message(capsys, ["rollout.group_size=many"])
    assert "rollout.group_size" in err and "int" in err


def test_bad_value(capsys):
    err = _message(capsys, ["loss.agg=token-means"])
    assert "loss" in err and "token-mean" in err


def test_sweep_values_are_checked(capsys):
    err = _message(capsys, ["advantage=grpo,nope"])
    assert "unknown advantage" in err or "nope" in err


def test_good_overrides_pass():
    cfg = check(["method=dr_grpo", "trainer.max_steps=2"])
    assert cfg.advantage.name == "dr_grpo" and cfg.loss.agg == "seq-mean-token-sum-norm"


def test_misspelt_sweep_keeps_the_plus(capsys):
    err = _message(capsys, ["+sweeps=compare_methodz"])
    assert "Did you mean '+sweeps=compare_methods'" in err


def test_user_searchpath_joins_ours(tmp_path):
    """A user's hydra.searchpath adds to creditlab's (plug-in configs, sweeps/), never replaces it."""
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "arith_short.yaml").write_text("name: arith\nmax_steps: 2\n")
    cfg = check([f"hydra.searchpath=[file://{tmp_path}]", "task=arith_short", "+sweeps=resets"])
    assert cfg.task.max_steps == 2 and cfg.trainer.max_steps == 80  # both folders were searched


def test_vllm_backend_without_vllm_names_the_install_command(capsys):
    from creditlab.backends.vllm import vllm_available

    if vllm_available():
        pytest.skip("vLLM is installed here")
    err = _message(capsys, ["backend=vllm"])
    assert err.count("\n") == 1 and "make setup-vllm" in err and "creditlab[vllm]" in err


def test_rollout_strategy_keys_and_selectors_name_the_fix(capsys):
    """The reset buffer's keys belong to rollout=resets; a selector needs a strategy that resets
    (and back); a split that does not fit the group; a misspelt strategy key."""
    err = _message(capsys, ["rollout.split=2x4"])
    assert "It is a key of rollout=resets: choose that option." in err
    err = _message(capsys, ["reset_selector=random"])
    assert "reset_selector=random does nothing with rollout=plain" in err and "resets" in err
    err = _message(capsys, ["method=srpo", "reset_selector=none"])
    assert "rollout=resets asks a reset selector" in err and "oracle, random, self_localize" in err
    err = _message(capsys, ["method=srpo", "rollout.split=3x4"])
    assert "rollout.split='3x4' needs R, K >= 1 and R*K <= rollout.group_size (8)" in err
    err = _message(capsys, ["method=srpo", "rollout.spilt=1x4"])
    assert "Did you mean 'rollout.split'" in err
    err = _message(capsys, ["model.accelerator=fast"])
    assert "model.accelerator must be one of auto, none, fused, compile" in err


def test_sweep_overrides_with_a_prefix_are_checked_as_written():
    """``+key=a,b`` and ``++key=a,b`` keep their prefix once in the values checked (a doubled
    ``++++seed=4`` did not parse, so ``creditlab train -m ++seed=4,5`` was refused)."""
    assert _sweep_variants(["++seed=4,5", "+foo=1"]) == [["++seed=4", "+foo=1"], ["++seed=5", "+foo=1"]]
    assert _sweep_variants(["+foo=1,2"]) == [["+foo=1"], ["+foo=2"]]
