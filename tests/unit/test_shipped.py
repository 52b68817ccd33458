"""Shipped warm starts (creditlab_arith.shipped): every preset a documented result or the demo
starts from ships as verified bytes, a changed byte is refused, and the recipe loads them."""

from __future__ import annotations

import json
import shutil

import pytest
from creditlab import InputError
from creditlab.testing import check_config
from creditlab_arith import model as recipe
from creditlab_arith import shipped
from omegaconf import OmegaConf

#: The presets whose warm starts documented results and the demo depend on.
PRESETS = {"demo": [], "credit_multi": ["experiment=credit_multi"], "credit_trap": ["experiment=credit_trap"],
           "credit_trap_last": ["experiment=credit_trap_last"], "credit_h8": ["experiment=credit_h8"],
           "tiny_localize": ["model=tiny_localize"]}


def key_of(overrides: list[str]) -> str:
    cfg, _ = check_config(overrides)
    return recipe.checkpoint_dir(OmegaConf.to_container(cfg.model.recipe_args, resolve=True)).name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_documented_preset_starts_from_shipped_verified_bytes(name, monkeypatch):
    key = key_of(PRESETS[name])
    assert key in shipped.manifest(), f"{name}'s warm start {key} does not ship"
    monkeypatch.setattr(recipe, "build_cached", lambda *a, **k: pytest.fail("built instead of loading the shipped bytes"))
    cfg, _ = check_config(PRESETS[name])
    folder = recipe.build_tiny_model(OmegaConf.to_container(cfg.model.recipe_args, resolve=True))
    assert folder == str(shipped.ROOT / key)
    entry = shipped.manifest()[key]
    assert set(entry["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(shipped.sha256(shipped.ROOT / key / f) == h for f, h in entry["files"].items())


def test_the_shipped_set_stays_small():
    total = sum(p.stat().st_size for p in shipped.ROOT.rglob("*") if p.is_file())
    assert total < 30 * 2**20, f"shipped warm starts take {total / 2**20:.1f} MiB (budget about 25)"


def test_a_changed_byte_is_refused_naming_the_file_and_the_way_out(tmp_path, monkeypatch, capsys):
    key = key_of([])
    root = tmp_path / "warm_starts"
    shutil.copytree(shipped.ROOT / key, root / key)
    (root / "manifest.json").write_text(json.dumps({key: shipped.manifest()[key]}))
    monkeypatch.setattr(shipped, "ROOT", root)
    monkeypatch.setattr(shipped, "MANIFEST", root / "manifest.json")
    assert shipped.load(key) == root / key
    assert "verified" in capsys.readouterr().out
    weights = root / key / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"model.safetensors has sha256 .* the manifest says .*shipped: false"):
        shipped.load(key)
    weights.unlink()
    with pytest.raises(InputError, match="has sha256 missing"):
        shipped.load(key)
    assert shipped.load("arith_tiny-000000000000") is None


def test_shipped_false_rebuilds_from_the_recipe_under_the_same_key(monkeypatch):
    calls = []
    monkeypatch.setattr(recipe, "build_cached", lambda final, build: calls.append(final) or str(final))
    assert recipe.build_tiny_model({"shipped": False}) == str(recipe.checkpoint_dir({}))
    assert calls == [recipe.checkpoint_dir({})]
    assert recipe.checkpoint_dir({"shipped": False}) == recipe.checkpoint_dir({})
    with pytest.raises(ValueError, match="shipped must be true or false"):
        recipe.resolve_args({"shipped": "no"})


def test_the_word_problem_adapter_ships_for_its_preset_verified_and_small():
    """model=smollm2_135m_word_problems starts from a shipped LoRA adapter (issue 53: <= 25 MB,
    sha256 checked at load), found under the preset's own cache key."""
    from creditlab_smollm2 import word_problems as wp
    from creditlab_wordproblems.task import DATA

    cfg, _ = check_config(["model=smollm2_135m_word_problems", "task=word_problems"])
    key = wp.checkpoint_dir(OmegaConf.to_container(cfg.model.recipe_args, resolve=True)).name
    entry = shipped.manifest(wp.SHIPPED).get(key)
    assert entry is not None, f"the word-problem adapter {key} does not ship"
    assert set(entry["files"]) == set(wp.ADAPTER_FILES)
    assert shipped.load(key, root=wp.SHIPPED, weights="adapter_model.safetensors") == wp.SHIPPED / key
    size = sum((wp.SHIPPED / key / f).stat().st_size for f in entry["files"])
    assert size <= 25e6, f"the adapter takes {size / 1e6:.1f} MB (issue 53: at most 25)"
    built = json.loads((wp.SHIPPED / key / "creditlab_recipe.json").read_text())
    assert built["train_data_sha256"] == shipped.sha256(DATA / "train.jsonl")
    assert built["args"]["lr"] == wp.DEFAULTS["lr"] and built["version"] == wp.RECIPE_VERSION
