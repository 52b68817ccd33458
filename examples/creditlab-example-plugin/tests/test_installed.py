"""The installed plug-in as creditlab sees it: entry points, shipped configs, presets.

Needs the package installed (``pip install -e examples/creditlab-example-plugin`` or
``pip install .``): these tests read the installed distribution's metadata, as creditlab does.
"""

import pytest
from creditlab import REGISTRIES, conf_dirs
from creditlab.testing import check_config

DIST = "creditlab-example-plugin"


@pytest.fixture(scope="module", autouse=True)
def installed():
    entry = REGISTRIES["advantage"].entries.get("rloo")
    assert entry is not None and entry.dist == DIST, (
        f"advantage 'rloo' is not registered by {DIST}; install the plug-in first: "
        "pip install -e examples/creditlab-example-plugin"
    )


def test_entry_point_resolves_to_the_estimator():
    from creditlab_example.advantage import RLOOAdvantage

    entry = REGISTRIES["advantage"].entries["rloo"]
    assert entry.target == "creditlab_example.advantage:RLOOAdvantage"
    assert REGISTRIES["advantage"].get("rloo") is RLOOAdvantage


def test_config_folder_is_on_the_search_path():
    dirs = {dist: path for dist, path in conf_dirs()}
    assert DIST in dirs, f"no 'creditlab.conf' entry point of {DIST} found: {dirs}"


def test_advantage_option_composes_and_validates():
    cfg, checked = check_config(["advantage=rloo", "advantage.batch_std=true"])
    cls, config = checked["advantage"]
    assert cfg.advantage.name == "rloo" and config.batch_std is True
    assert cls(config).config == config


def test_method_preset_composes_and_validates():
    cfg, checked = check_config(["method=rloo"])
    assert checked["run"].method == "rloo"
    assert cfg.advantage.name == "rloo" and cfg.reset_selector.name == "none"
    assert checked["loss"].mode == "reinforce" and checked["loss"].agg == "seq-mean-token-sum"
