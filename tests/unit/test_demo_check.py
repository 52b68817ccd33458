"""sweeps/demo_check.py: the stand-ins' runs, their environments, and the verdict, on hand-made
run folders (the real check runs the demo four times: `make demo-check`)."""

from __future__ import annotations

import importlib.util
import json
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


def _run_dir(path: Path, curve: list[float], capability: str = "AVX512") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"step": 10 * i, "eval/pass@1": v} for i, v in enumerate(curve)]
    rows.insert(1, {"step": 1, "train/loss": 0.1})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "environment.json").write_text(json.dumps({"cpu": {"torch_capability": capability}}))
    return path


def test_summarize_reads_first_and_last_evaluation(demo_check, tmp_path):
    seed0 = demo_check.STANDINS[0]
    row = demo_check.summarize(_run_dir(tmp_path / "a", [0.5, 0.6, 0.58]), seed0)
    assert row["start"] == 0.5 and row["end"] == 0.58 and row["gain"] == pytest.approx(0.08)
    assert row["steps"] == 20 and row["kernels"] == "AVX512"
    with pytest.raises(ValueError, match="1 evaluation"):
        demo_check.summarize(_run_dir(tmp_path / "b", [0.5]), seed0)


def test_the_avx2_stand_in_gets_its_env_and_cache_and_must_use_avx2(demo_check, tmp_path, monkeypatch):
    monkeypatch.setenv("CREDITLAB_CACHE", str(tmp_path / "cache"))
    avx2 = next(s for s in demo_check.STANDINS if s.env)
    env = demo_check.run_env(avx2, {"PATH": "/bin"})
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2"
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert env["CREDITLAB_CACHE"] == str(tmp_path / "cache" / "isa-avx2")
    assert "CREDITLAB_CACHE" not in demo_check.run_env(demo_check.STANDINS[1], {})
    with pytest.raises(ValueError, match="did not take effect"):
        demo_check.summarize(_run_dir(tmp_path / "r", [0.5, 0.6], "AVX512"), avx2)
    assert demo_check.summarize(_run_dir(tmp_path / "s", [0.5, 0.6], "AVX2"), avx2)["kernels"] == "AVX2"


@pytest.mark.parametrize(("gains", "status"), [((0.1, 0.06), 0), ((0.1, 0.04), 1)])
def test_main_runs_each_stand_in_and_fails_below_the_minimum_gain(demo_check, tmp_path, monkeypatch, capsys,
                                                                   gains, status):
    calls = []

    def fake_run(cmd, env):
        run_dir = Path(next(a for a in cmd if a.startswith("run_dir=")).split("=", 1)[1])
        gain = gains[len(calls)]
        calls.append((cmd, env))
        _run_dir(run_dir, [0.5, 0.5 + gain], "AVX2" if env.get("ATEN_CPU_CAPABILITY") else "AVX512")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(demo_check.subprocess, "run", fake_run)
    out = tmp_path / "out"
    code = demo_check.main(["--out", str(out), "--only", "seed 1,seed 0 AVX2", "trainer.max_steps=3"])
    assert code == status
    (cmd1, _), (cmd2, env2) = calls
    assert "+model.recipe_args={seed: 1}" in cmd1 and cmd1[-1] == "trainer.max_steps=3"
    assert env2["ATEN_CPU_CAPABILITY"] == "avx2"
    table = capsys.readouterr().out
    assert "| seed 1 | AVX512 | 0.500 | 0.600 | +0.100 |" in table
    assert ("(below 0.05)" in table) == bool(status)
    assert [r["stand-in"] for r in json.loads((out / "demo_check.json").read_text())] == ["seed 1", "seed 0 AVX2"]
