"""Plug-in discovery through real installed metadata (``*.dist-info`` folders on ``sys.path``).

``test_registry.py`` checks the rules with stand-in entry points; here small distributions are
written to a temporary folder, exactly as pip would lay them out, and found by
``importlib.metadata``: a broken plug-in does not break the others, the name-clash rules,
``CREDITLAB_DISABLE_PLUGIN_AUTOLOAD=1``, and config folders (``creditlab.conf``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from creditlab.errors import RegistryError
from creditlab.interfaces import AdvantageEstimator
from creditlab.registry import AUTOLOAD_ENV, REGISTRIES, Registry, conf_entries

from tests.helpers import write_dist

GOOD = '''
from creditlab.interfaces import AdvantageEstimator
from creditlab.types import Advantages


class ZeroAdvantage(AdvantageEstimator):
    def estimate(self, batch, ctx=None):
        return Advantages(values=batch.loss_mask * 0)
'''


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fresh folder on ``sys.path``; imported test modules and cached registries are undone."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        if name.startswith("cl_test_"):
            del sys.modules[name]
    for reg in REGISTRIES.values():
        reg.refresh()


def advantages() -> Registry:
    return Registry("advantage", "creditlab.advantage", AdvantageEstimator)


def test_broken_plugin_is_reported_and_others_still_work(site, capsys):
    write_dist(site, "broken-plugin", {"creditlab.advantage": {"broken": "cl_test_broken:Thing"}},
               {"cl_test_broken.py": "raise ImportError('needs libfoo >= 2')\n"})
    write_dist(site, "good-plugin", {"creditlab.advantage": {"zero": "cl_test_good:ZeroAdvantage"}},
               {"cl_test_good.py": GOOD})
    reg = advantages()
    assert {"broken", "zero", "grpo"} <= set(reg.names())  # listing imports nothing
    with pytest.raises(RegistryError) as err:
        reg.get("broken")
    msg = str(err.value)
    assert "'broken-plugin'" in msg and "ImportError: needs libfoo >= 2" in msg
    assert reg.get("zero").__name__ == "ZeroAdvantage"
    assert reg.get("grpo").__name__ == "GRPOAdvantage"

    from creditlab.cli.plugins_command import plugins

    for r in REGISTRIES.values():
        r.refresh()
    plugins([])
    out = capsys.readouterr().out
    assert "broken-plugin" in out and "good-plugin" in out and "1.2.3" in out


def test_third_party_clashing_with_builtin_loses_with_warning(site):
    write_dist(site, "shadow-plugin", {"creditlab.advantage": {"grpo": "cl_test_shadow:Mine"}})
    with pytest.warns(UserWarning, match="'shadow-plugin' clashes with the built-in"):
        entry = advantages().entries["grpo"]
    assert entry.dist == "creditlab" and entry.target == "creditlab_grpo.advantage:GRPOAdvantage"


def test_two_third_parties_clashing_is_an_error_naming_both(site):
    write_dist(site, "plugin-one", {"creditlab.advantage": {"same": "cl_test_one:A"}})
    write_dist(site, "plugin-two", {"creditlab.advantage": {"same": "cl_test_two:A"}})
    with pytest.raises(RegistryError) as err:
        advantages().names()
    msg = str(err.value)
    assert "advantage 'same'" in msg and "'plugin-one'" in msg and "'plugin-two'" in msg


def test_disable_autoload_hides_third_party_parts_and_configs(site, monkeypatch):
    write_dist(site, "good-plugin", {
        "creditlab.advantage": {"zero": "cl_test_good:ZeroAdvantage"},
        "creditlab.conf": {"good": "cl_test_goodconf"},
    }, {"cl_test_good.py": GOOD, "cl_test_goodconf/__init__.py": "", "cl_test_goodconf/advantage/zero.yaml": "name: zero\n"})
    assert "zero" in advantages().names()
    assert [e.dist for e, _ in conf_entries()] == ["good-plugin"]
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    names = advantages().names()
    assert "zero" not in names and "grpo" in names
    assert conf_entries() == []


def test_config_folder_is_located_without_importing_it(site):
    write_dist(site, "conf-plugin", {"creditlab.conf": {"mine": "cl_test_pkg.conf"}}, {
        "cl_test_pkg/__init__.py": "",
        "cl_test_pkg/conf/__init__.py": "raise RuntimeError('config folders are not imported')\n",
        "cl_test_pkg/conf/advantage/zero.yaml": "name: zero\n",
    })
    [(entry, path)] = conf_entries()
    assert (entry.name, entry.dist, entry.version, entry.target) == ("mine", "conf-plugin", "1.2.3", "cl_test_pkg.conf")
    assert Path(path) == site / "cl_test_pkg" / "conf"
    assert "cl_test_pkg.conf" not in sys.modules


def test_broken_config_folder_is_skipped_with_a_warning(site):
    write_dist(site, "bad-conf", {"creditlab.conf": {"bad": "cl_test_missing.conf"}})
    write_dist(site, "conf-plugin", {"creditlab.conf": {"mine": "cl_test_ok"}}, {"cl_test_ok/__init__.py": ""})
    with pytest.warns(UserWarning, match=r"'cl_test_missing\.conf' from distribution 'bad-conf' is skipped: ModuleNotFoundError"):
        entries = conf_entries()
    assert [e.dist for e, _ in entries] == ["conf-plugin"]


def test_plugin_config_cannot_shadow_a_builtin_config(site):
    """A plug-in's ``advantage/grpo.yaml`` is behind conf/ on Hydra's search path: the built-in
    wins, as for parts."""
    from creditlab.run.compose import compose

    write_dist(site, "conf-plugin", {"creditlab.conf": {"mine": "cl_test_shadowconf"}}, {
        "cl_test_shadowconf/__init__.py": "",
        "cl_test_shadowconf/advantage/grpo.yaml": "name: grpo\nstd: population\n",
        "cl_test_shadowconf/advantage/zero.yaml": "name: zero\n",
    })
    assert compose(["advantage=grpo"]).advantage.std == "sample"
    assert compose(["advantage=zero"]).advantage.name == "zero"
