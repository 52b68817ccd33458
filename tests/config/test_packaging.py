"""A wheel carries conf/ and sweeps/ as data files (pyproject's [tool.setuptools.data-files]),
installed under <prefix>/share/creditlab, where creditlab.train looks without a source checkout."""

from pathlib import Path

import pytest
from creditlab.run.compose import find_conf_dir

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[2]


def test_every_config_and_sweep_file_is_a_data_file():
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = {}
    for target, patterns in data_files.items():
        for pattern in patterns:
            for f in ROOT.glob(pattern):
                shipped[f.relative_to(ROOT).as_posix()] = target
    wanted = [f.relative_to(ROOT).as_posix() for top in ("conf", "sweeps") for f in (ROOT / top).rglob("*")
              if f.is_file() and f.suffix in (".yaml", ".py") and "__pycache__" not in f.parts]
    missing = sorted(set(wanted) - set(shipped))
    assert not missing, f"add these to [tool.setuptools.data-files] in pyproject.toml: {missing}"
    for rel, target in shipped.items():  # each lands at share/creditlab/<its own folder>
        assert target == "share/creditlab/" + rel.rsplit("/", 1)[0], (rel, target)


def test_source_checkout_conf_wins():
    assert find_conf_dir() == ROOT / "conf"
