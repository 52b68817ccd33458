"""The example plug-in (``examples/creditlab-example-plugin``) installed as a third party would
install it, then used from the command line in subprocesses.

It is built and installed offline (``pip install --no-deps --no-build-isolation --no-index
--target``, or uv's equivalent) from a copy of its source into a temporary folder that only the
subprocesses see (``PYTHONPATH``), so nothing is added to the test environment itself. A second,
broken distribution is laid out next to it to show that one bad plug-in does not break others.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from creditlab.registry import AUTOLOAD_ENV

from tests.helpers import write_dist
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "creditlab-example-plugin"
DIST, VERSION, NAME = "creditlab-example-plugin", "0.1.0", "rloo"
BIN = Path(sys.executable).parent


def _install(source: Path, target: Path) -> None:
    """Build and install ``source`` into ``target`` without network or build isolation."""
    assert importlib.util.find_spec("setuptools"), (
        "building the example needs setuptools in this environment (part of the test extra): "
        "run `make setup` or `pip install -e '.[test]'`"
    )
    flags = ["--no-deps", "--no-build-isolation", "--target", str(target), str(source)]
    if importlib.util.find_spec("pip") is not None:
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", *flags]
    else:  # a venv made by uv has no pip
        uv = shutil.which("uv", path=str(BIN)) or shutil.which("uv")
        assert uv, "neither pip nor uv is available to install the example plug-in"
        cmd = [uv, "pip", "install", "--quiet", "--offline", "--python", sys.executable, *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"installing the example failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    """``source``: a copy of the example; ``site``: it, installed; ``broken``: a distribution
    whose advantage fails to import (with a config so that ``advantage=broken_example`` composes)."""
    root = tmp_path_factory.mktemp("example_plugin")
    source = root / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    _install(source, root / "site")
    write_dist(root / "broken", "broken-example", {
        "creditlab.advantage": {"broken_example": "cl_broken_example.advantage:BrokenAdvantage"},
        "creditlab.conf": {"cl_broken_example": "cl_broken_example_conf"},
    }, {
        "cl_broken_example/__init__.py": "",
        "cl_broken_example/advantage.py": "import creditlab_no_such_dependency\n",
        "cl_broken_example_conf/__init__.py": "",
        "cl_broken_example_conf/advantage/broken_example.yaml": "name: broken_example\n",
    })
    return {"source": source, "site": root / "site", "broken": root / "broken"}


def _run(args: list[str], *paths: Path, timeout: int = 600, **env: str) -> subprocess.CompletedProcess:
    """``creditlab <args>`` with ``paths`` on PYTHONPATH (the console script, as a user runs it)."""
    script = BIN / "creditlab"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "creditlab.cli"]
    pythonpath = os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    full_env = {**os.environ, "PYTHONPATH": pythonpath, "HF_HUB_OFFLINE": "1"}
    full_env.pop(AUTOLOAD_ENV, None)
    full_env.update(env)
    return subprocess.run([*cmd, *args], capture_output=True, text=True, env=full_env, timeout=timeout)


def _row(table: str, kind: str, name: str) -> str | None:
    """The line of ``creditlab plugins`` output for (kind, name), or None."""
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if cells[:2] == [kind, name]:
            return line
    return None


def test_plugins_lists_it_with_distribution_and_version(sites):
    out = _run(["plugins"], sites["site"], sites["broken"])
    assert out.returncode == 0, out.stderr[-3000:]
    row = _row(out.stdout, "advantage", NAME)
    assert row and DIST in row and VERSION in row and "creditlab_example.advantage:RLOOAdvantage" in row, out.stdout
    conf = _row(out.stdout, "conf", "creditlab_example")
    assert conf and DIST in conf, out.stdout
    assert _row(out.stdout, "advantage", "broken_example"), "a broken plug-in is still listed (metadata only)"
    assert _row(out.stdout, "advantage", "grpo")

    hidden = _run(["plugins"], sites["site"], **{AUTOLOAD_ENV: "1"})
    assert hidden.returncode == 0, hidden.stderr[-3000:]
    assert DIST not in hidden.stdout and _row(hidden.stdout, "advantage", "grpo")


def test_train_with_its_advantage(sites, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [o for o in SMALL if not o.startswith(("eval.every", "logger"))]
    out = _run(["train", f"advantage={NAME}", "trainer.max_steps=1", "logger=none", "threads=1",
                "eval.every=0", f"run_dir={run_dir}", *overrides], sites["site"], sites["broken"])
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1 and "train/loss" in rows[-1]
    assert rows[-1]["train/advantage/groups"] == 4  # the plug-in's metrics() reached the log
    prov = json.loads((run_dir / "plugins.json").read_text())["advantage"]
    assert prov == {"name": NAME, "dist": DIST, "version": VERSION,
                    "target": "creditlab_example.advantage:RLOOAdvantage"}


def test_credit_bench_scores_its_advantage(sites, tmp_path):
    """A third-party estimator is scored by `creditlab credit-bench` like a built-in one (the
    broken distribution beside it is not asked for, so it does not stop the bench)."""
    # The small warm start never solves arith (a truth of zeros is refused), so a verifier it
    # sometimes satisfies is installed beside it: a "7" anywhere in the response.
    write_dist(tmp_path / "seven", "seven-verifier", {"creditlab.verifier": {"has_seven": "cl_seven:HasSeven"}}, {
        "cl_seven/__init__.py": (
            "from dataclasses import dataclass\n"
            "from creditlab import Rewards, Verifier\n\n"
            "class HasSeven(Verifier):\n"
            "    @dataclass\n"
            "    class Config:\n"
            "        timeout_s: float = 5.0\n"
            "        workers: int = 1\n\n"
            "    def score(self, problems, completions):\n"
            "        v = tuple(float('7' in c.text) for c in completions)\n"
            "        return Rewards(v, tuple({} for _ in v))\n"
        ),
    })
    out_dir = tmp_path / "bench"
    out = _run(["credit-bench", "--estimators", f"grpo,{NAME}", "--selectors", "random", "--prompts", "3",
                "--k", "4", "--min-reliability", "0.01", "--bootstrap", "100", "--out", str(out_dir),
                "threads=1", *SMALL, "verifier.name=has_seven"], sites["site"], sites["broken"], tmp_path / "seven")
    assert out.returncode == 0, out.stderr[-3000:]
    bench = json.loads((out_dir / "bench.json").read_text())
    scored = {e["name"]: e for e in bench["estimators"]}
    assert set(scored) == {"grpo", NAME} and scored[NAME]["error"] is None
    assert set(scored[NAME]["scores"]) >= {"spearman/mean", "error/sum", "blame_hit/mean"}
    report = (out_dir / "report.md").read_text()
    assert f"| {NAME} |" in report and NAME in out.stdout


def test_cli_errors_name_the_plugin_problem(sites):
    broken = _run(["train", "advantage=broken_example"], sites["site"], sites["broken"])
    assert broken.returncode == 2
    assert "'broken-example'" in broken.stderr and "ModuleNotFoundError" in broken.stderr
    assert "creditlab_no_such_dependency" in broken.stderr and "Traceback" not in broken.stderr

    hidden = _run(["train", f"advantage={NAME}"], sites["site"], **{AUTOLOAD_ENV: "1"})
    assert hidden.returncode == 2
    assert f"unknown advantage '{NAME}'" in hidden.stderr and "Traceback" not in hidden.stderr


def test_its_own_tests_pass(sites):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    env = {**os.environ, "PYTHONPATH": str(sites["site"])}
    env.pop(AUTOLOAD_ENV, None)
    out = subprocess.run(cmd, cwd=sites["source"], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and "skipped" not in out.stdout and "failed" not in out.stdout
