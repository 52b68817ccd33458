"""sweeps/demo_check.py: the stand-ins' runs, their environments, and the verdict, on hand-made
run folders (the real check runs the demo five times: `make demo-check`)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "sweeps" / "demo_check.py"


@pytest.fixture(scope="module")
def demo_check():
    spec = importlib.util.spec_from_file_location("demo_check", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_check"] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def _run_dir(path: Path, gain: float, low: float, capability: str = "AVX512") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    headline = {"metric": "eval/sample_accuracy", "start": 0.3, "end": 0.3 + gain, "gain": gain,
                "ci95": [low, 2 * gain - low], "steps": [160, 170, 180, 190, 200], "problems": 500}
    summary = {"eval_pass@1_first": 0.5, "eval_pass@1_last": 0.56, "headline": headline}
    (path / "summary.json").write_text(json.dumps(summary))
    (path / "environment.json").write_text(json.dumps({"cpu": {"torch_capability": capability}}))
    return path


def test_summarize_reads_the_headline(demo_check, tmp_path):
    seed0 = demo_check.STANDINS[0]
    row = demo_check.summarize(_run_dir(tmp_path / "a", 0.08, 0.06), seed0)
    assert row["start"] == 0.3 and row["gain"] == 0.08 and (row["low"], row["high"]) == (0.06, 0.1)
    assert row["greedy"] == [0.5, 0.56] and row["kernels"] == "AVX512"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text("{}")
    with pytest.raises(ValueError, match="no headline"):
        demo_check.summarize(tmp_path / "b", seed0)


def test_the_kernel_stand_ins_get_their_env_and_must_use_those_kernels(demo_check, tmp_path):
    avx2 = next(s for s in demo_check.STANDINS if s.env.get("ATEN_CPU_CAPABILITY") == "avx2")
    base = next(s for s in demo_check.STANDINS if s.env.get("ATEN_CPU_CAPABILITY") == "default")
    env = demo_check.run_env(avx2, {"PATH": "/bin"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert demo_check.run_env(base, {})["ONEDNN_MAX_CPU_ISA"] == "SSE41"
    # a restriction exported in the shell reaches no stand-in but its own: the seeds keep this CPU's
    shell = {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    seed1 = next(s for s in demo_check.STANDINS if s.name == "RL seed 1")
    assert demo_check.run_env(seed1, shell) == {"PATH": "/bin", "HF_HUB_OFFLINE": "1"}
    assert demo_check.run_env(base, shell)["ATEN_CPU_CAPABILITY"] == "default"
    with pytest.raises(ValueError, match="did not take effect"):
        demo_check.summarize(_run_dir(tmp_path / "r", 0.1, 0.05, "AVX512"), avx2)
    assert demo_check.summarize(_run_dir(tmp_path / "s", 0.1, 0.05, "AVX2"), avx2)["kernels"] == "AVX2"
    assert demo_check.summarize(_run_dir(tmp_path / "t", 0.1, 0.05, "DEFAULT"), base)["kernels"] == "DEFAULT"


@pytest.mark.parametrize(("rows", "status"), [(((0.1, 0.05), (0.06, 0.01)), 0), (((0.1, 0.05), (0.04, 0.01)), 1),
                                              (((0.1, 0.05), (0.06, -0.01)), 1)])
def test_main_runs_each_stand_in_and_fails_below_the_minimum_gain_or_an_interval_at_0(
        demo_check, tmp_path, monkeypatch, capsys, rows, status):
    calls = []

    def fake_run(cmd, env):
        run_dir = Path(next(a for a in cmd if a.startswith("run_dir=")).split("=", 1)[1])
        gain, low = rows[len(calls)]
        calls.append((cmd, env))
        _run_dir(run_dir, gain, low, "AVX2" if env.get("ATEN_CPU_CAPABILITY") else "AVX512")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(demo_check.subprocess, "run", fake_run)
    out = tmp_path / "out"
    code = demo_check.main(["--out", str(out), "--only", "RL seed 1,AVX2 kernels", "trainer.max_steps=3"])
    assert code == status
    (cmd1, _), (cmd2, env2) = calls
    assert "seed=1" in cmd1 and cmd1[-1] == "trainer.max_steps=3"
    assert env2["ATEN_CPU_CAPABILITY"] == "avx2"
    table = capsys.readouterr().out
    assert "| RL seed 1 | AVX512 | 0.300 | 0.400 | +0.100 [+0.050, +0.150] | 0.500 -> 0.560 |" in table
    assert ("interval reaches 0" in table) == bool(status)
    assert [r["stand-in"] for r in json.loads((out / "demo_check.json").read_text())] == ["RL seed 1", "AVX2 kernels"]


def test_make_test_numerics_restricts_the_kernels_of_the_stand_ins(demo_check):
    """``make test-numerics`` (run by .ci/run) sets the stand-ins' variables, and asks the tests to
    stop unless torch took them (tests/conftest.py)."""
    root = _PATH.parents[1]
    makefile = (root / "Makefile").read_text()

    def variables(name):
        line = re.search(rf"^{name} := (.*)$", makefile, re.M).group(1)
        return dict(pair.split("=", 1) for pair in line.split())

    assert variables("KERNELS_AVX2") == demo_check.AVX2
    assert variables("KERNELS_BASELINE") == demo_check.BASELINE
    target = makefile.split("\ntest-numerics:", 1)[1].split("\n\n", 1)[0]
    assert "$(KERNELS_AVX2) CREDITLAB_EXPECT_CPU_CAPABILITY=AVX2" in target
    assert "$(KERNELS_BASELINE) CREDITLAB_EXPECT_CPU_CAPABILITY=DEFAULT" in target
    assert "-m numerics" in target
    assert "make test-numerics" in (root / ".ci" / "run").read_text()
