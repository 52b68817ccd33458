"""Registry: discovery, lazy import, clear errors, clash rules, autoload switch."""

from dataclasses import dataclass
from importlib import metadata
from types import SimpleNamespace

import pytest
from creditlab.errors import ConfigError, RegistryError
from creditlab.interfaces import AdvantageEstimator
from creditlab.registry import REGISTRIES, Entry, Registry, build_config, build_part


def test_builtins_are_entry_points():
    adv = REGISTRIES["advantage"]
    assert {"grpo", "dr_grpo"} <= set(adv.names())
    assert adv.entries["grpo"].dist == "creditlab"
    assert adv.entries["grpo"].target == "creditlab_grpo.advantage:GRPOAdvantage"


def test_unknown_name_names_closest_and_all():
    with pytest.raises(RegistryError) as err:
        REGISTRIES["advantage"].get("gpro")
    msg = str(err.value)
    assert "unknown advantage 'gpro'" in msg and "Did you mean 'grpo'" in msg and "dr_grpo" in msg


def test_broken_plugin_reports_dist_and_error():
    entry = Entry("broken", "creditlab_no_such_module:Thing", "some-dist", "1.0")
    with pytest.raises(RegistryError, match="some-dist.*ModuleNotFoundError"):
        entry.load()


def _fake_eps(monkeypatch, eps):
    monkeypatch.setattr(metadata, "entry_points", lambda group=None: [e for e in eps if e.group == group])


def _EP(name, value, group, dist_name):
    """A stand-in entry point carrying a distribution name."""
    dist = SimpleNamespace(metadata={"Name": dist_name}, version="0.1")
    return SimpleNamespace(name=name, value=value, group=group, dist=dist)


def test_clash_builtin_wins_with_warning(monkeypatch):
    eps = [
        _EP("grpo", "a:B", "creditlab.advantage", "creditlab"),
        _EP("grpo", "x:Y", "creditlab.advantage", "third-party"),
    ]
    _fake_eps(monkeypatch, eps)
    reg = Registry("advantage", "creditlab.advantage")
    with pytest.warns(UserWarning, match="clashes with the built-in"):
        assert reg.entries["grpo"].target == "a:B"


def test_clash_two_third_parties_is_error(monkeypatch):
    eps = [
        _EP("mine", "a:B", "creditlab.advantage", "pkg-one"),
        _EP("mine", "x:Y", "creditlab.advantage", "pkg-two"),
    ]
    _fake_eps(monkeypatch, eps)
    with pytest.raises(RegistryError, match="pkg-one.*pkg-two"):
        Registry("advantage", "creditlab.advantage").names()


def test_disable_autoload_hides_third_party(monkeypatch):
    eps = [
        _EP("grpo", "a:B", "creditlab.advantage", "creditlab"),
        _EP("mine", "x:Y", "creditlab.advantage", "pkg-one"),
    ]
    _fake_eps(monkeypatch, eps)
    monkeypatch.setenv("CREDITLAB_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert Registry("advantage", "creditlab.advantage").names() == ["grpo"]


def test_discovery_is_lazy():
    import sys

    reg = Registry("advantage", "creditlab.advantage", AdvantageEstimator)
    reg.names()
    assert all(e.loader is None for e in reg)  # metadata only; nothing imported by listing
    assert "creditlab_no_such" not in sys.modules


def test_register_decorator_and_base_check():
    reg = REGISTRIES["advantage"]

    @reg.register("_not_an_estimator")
    class NotOne:
        pass

    try:
        with pytest.raises(RegistryError, match="not a subclass"):
            reg.get("_not_an_estimator")
    finally:
        reg.unregister("_not_an_estimator")


@dataclass
class _Cfg:
    alpha: float = 1.0
    mode: str = "a"
    steps: int = 3
    maybe: int | None = None


def test_build_config_unknown_key_and_types():
    with pytest.raises(ConfigError, match=r"unknown key 'x\.alpah'.*Did you mean 'x\.alpha'"):
        build_config(_Cfg, {"alpah": 2}, "x")
    with pytest.raises(ConfigError, match=r"'x\.steps' must be int, got str"):
        build_config(_Cfg, {"steps": "many"}, "x")
    assert build_config(_Cfg, {"alpha": 2, "maybe": None}, "x").alpha == 2.0
    with pytest.raises(ConfigError, match="must be int, got bool"):
        build_config(_Cfg, {"steps": True}, "x")


def test_build_part_needs_name():
    with pytest.raises(ConfigError, match="needs a 'name'"):
        build_part("advantage", {})
