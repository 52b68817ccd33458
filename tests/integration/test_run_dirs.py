"""A run directory belongs to one run: no silent mixing, no lost config (docs/reproducing.md).

Each case runs the CLI (a subprocess, where signals and locks need one) or ``creditlab.run.launch.run``
and asserts the exit status, the one-line message and that ``config.yaml``, ``metrics.jsonl`` and
the checkpoints of the run already there are intact. The fast cases fail before any training; the
slow ones share one finished 4-step run (``finished``) as the uninterrupted reference.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from creditlab.errors import ConfigError
from creditlab.run.compose import compose
from creditlab.run.launch import run
from creditlab.run.loggers import read_metrics
from creditlab.run.rundir_guard import RunDirError, RunDirLock, check_resume
from omegaconf import OmegaConf

from tests.helpers import stable
from tests.integration.conftest import SMALL

STEPS = ["trainer.max_steps=4"]
CLI = [sys.executable, "-m", "creditlab.cli", "train"]


def _cli(run_dir, *extra):
    return [*CLI, *SMALL, *STEPS, f"run_dir={run_dir}", *extra]


def _env():
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HYDRA_FULL_ERROR": "0"}


def _refused(done, *needles):
    """Exit status 2 and a message of at most two lines naming ``needles``; no traceback."""
    err = done.stderr
    assert done.returncode == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.startswith("creditlab: error: ")), None)
    assert start is not None and len(lines) - start <= 2, err[-2000:]
    message = "\n".join(lines[start:])
    for needle in needles:
        assert needle in message, (needle, err[-2000:])


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of a run directory except the lock's record and Hydra's log."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name not in (".lock", "hydra_main.log")}


def _held_run(run_dir: Path, *overrides: str) -> Path:
    """A run directory as a run leaves it after two steps (config, metrics, Hydra's records),
    without training (the refusals below happen before any checkpoint is read)."""
    run_dir.mkdir(parents=True)
    cfg = compose([*SMALL, *STEPS, f"run_dir={run_dir}", *overrides])
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- the original command\n")
    rows = [{"step": 0, "eval/pass@1": 0.5}, {"step": 1, "train/reward/mean": 0.25}, {"step": 2, "train/reward/mean": 0.5}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def _no_duplicate_steps(rows):
    for key in ("train/reward/mean", "eval/pass@1"):
        steps = [r["step"] for r in rows if key in r]
        assert len(steps) == len(set(steps)), (key, steps)


# -- fast: refused before anything is trained ------------------------------------------------------

def test_a_file_as_run_dir_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    for run_dir in (afile, afile / "sub"):
        done = subprocess.run(_cli(run_dir), capture_output=True, text=True, env=_env(), timeout=300)
        _refused(done, f"run_dir={run_dir}: {afile} is a file, not a folder")
    assert afile.read_text() == "not a folder"
    with pytest.raises(RunDirError, match="is a file, not a folder"):
        run(compose([*SMALL, *STEPS, f"run_dir={afile}"]), afile)


def test_a_read_only_run_dir_is_one_line(tmp_path):
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    frozen.chmod(0o555)
    command = _cli(frozen / "run")
    if os.geteuid() == 0:  # root writes through permissions: a read-only bind mount in its own namespace
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare: no read-only folder to test with")
        mount = f"mount --bind {frozen} {frozen} && mount -o remount,bind,ro {frozen} && exec "
        command = ["unshare", "-m", "sh", "-c", mount + shlex.join(command)]
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300)
    if os.geteuid() == 0 and "mount" in done.stderr and "creditlab" not in done.stderr:
        pytest.skip(f"no mount namespace here: {done.stderr.strip()[:200]}")
    _refused(done, f"run_dir={frozen / 'run'}: cannot create a folder in {frozen}", "choose a writable run_dir")
    assert not (frozen / "run").exists()


def test_a_run_dir_in_use_is_refused_naming_the_holder(tmp_path):
    run_dir = _held_run(tmp_path / "run")
    before = _snapshot(run_dir)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from creditlab.run.rundir_guard import RunDirLock; "
         "RunDirLock(sys.argv[1]).acquire(); print('held', flush=True); sys.stdin.read()", str(run_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=rf"run_dir {run_dir} is in use by another run \(pid {holder.pid} on host "):
            run(compose([*SMALL, *STEPS, f"run_dir={run_dir}"]), run_dir)
        assert _snapshot(run_dir) == before, "a refused run writes nothing"
    finally:
        holder.kill()  # SIGKILL: no clean-up, yet the kernel drops the lock
        holder.wait()
    with RunDirLock(run_dir):  # no stale lock
        pass


def test_a_resume_with_another_config_is_refused_naming_the_keys(tmp_path):
    run_dir = _held_run(tmp_path / "run")
    before = _snapshot(run_dir)
    done = subprocess.run(_cli(run_dir, "seed=1"), capture_output=True, text=True, env=_env(), timeout=300)
    _refused(done, f"run_dir {run_dir} holds a run (metrics up to RL step 2) with another config: seed: 0 -> 1.",
             "resume_mismatch=allow")
    # a method and a seed: five keys, four shown, then a count
    with pytest.raises(RunDirError, match=r"advantage.name: grpo -> dr_grpo, .* and 1 more\.\n"):
        run(compose([*SMALL, *STEPS, f"run_dir={run_dir}", "method=dr_grpo", "seed=1"]), run_dir)
    with pytest.raises(RunDirError, match=r"resume=null would start a second run on top of it"):
        run(compose([*SMALL, *STEPS, f"run_dir={run_dir}", "resume=null"]), run_dir)
    assert _snapshot(run_dir) == before, "config.yaml, metrics.jsonl and .hydra/ are kept"


def test_a_resume_may_change_the_step_budget_and_bookkeeping_only(tmp_path):
    run_dir = _held_run(tmp_path / "run")
    same = ["trainer.max_steps=9", "threads=1", "checkpoint_every=3", "logger=wandb", "tags=[x]",
            "+trainer.enable_progress_bar=false", f"run_dir={tmp_path / 'elsewhere'}"]
    assert check_resume(compose([*SMALL, *same]), run_dir) is None
    with pytest.raises(RunDirError, match=r"eval.every: 2 -> 3\."):
        check_resume(compose([*SMALL, *STEPS, "eval.every=3"]), run_dir)
    with pytest.raises(ConfigError, match="resume_mismatch=maybe: use refuse"):
        check_resume(compose([*SMALL, *STEPS, "resume_mismatch=maybe"]), run_dir)


# -- slow: real runs -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One uninterrupted 4-step run: the reference of every resumed run below. A fresh process,
    like the runs it is compared with, so that nothing an earlier test left in this process can
    change its floats (a run's ``threads=1`` once stayed set after it: fixed in ``launch.run``)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    _fresh(_cli(run_dir))
    return run_dir


def _fresh(command: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh process (runs compared for equality all do) and check it ended well."""
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _copy(finished: Path, to: Path) -> Path:
    shutil.copytree(finished, to)
    return to


def _wait_for_step(run_dir: Path, proc: subprocess.Popen, step: int = 1) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = run_dir / "metrics.jsonl"
        if metrics.is_file() and any(r.get("step") == step and "train/reward/mean" in r
                                     for r in read_metrics(metrics)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step {step} logged: {proc.communicate()[1][-2000:] if proc.poll() is not None else 'timeout'}")


def _resume(stderr: str) -> subprocess.CompletedProcess:
    """Run the command the stopped run printed."""
    line = next(ln for ln in stderr.splitlines() if "resume with: " in ln)
    words = shlex.split(line.split("resume with: ", 1)[1])
    assert words[:2] == ["creditlab", "train"]
    return subprocess.run([*CLI, *words[2:]], capture_output=True, text=True, env=_env(), timeout=600)


@pytest.mark.slow
def test_sigterm_saves_exits_non_zero_and_prints_the_resume_command_while_a_second_run_is_refused(tmp_path, finished):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(_cli(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for_step(run_dir, first)
        first.send_signal(signal.SIGSTOP)  # keep it mid-run while the second run tries
        second = subprocess.run(_cli(run_dir, "seed=1"), capture_output=True, text=True, env=_env(), timeout=300)
        _refused(second, f"run_dir {run_dir} is in use by another run (pid {first.pid} on host ")
        first.send_signal(signal.SIGCONT)
        first.send_signal(signal.SIGTERM)
        err = first.communicate(timeout=300)[1]
    finally:
        first.kill()
    assert first.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert f"checkpoint saved: {run_dir / 'checkpoints' / 'interrupted.ckpt'}" in err
    step = int(err.split("stopped by SIGTERM after RL step ")[1].split(" ")[0])
    assert 1 <= step < 4
    state = json.loads((run_dir / "status.json").read_text())
    assert state["status"] == "stopped" and "SIGTERM" in state["error"]["message"]
    done = _resume(err)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(run_dir / "metrics.jsonl")
    _no_duplicate_steps(rows)
    assert stable(rows) == stable(read_metrics(finished / "metrics.jsonl")), "stopped + resumed = uninterrupted"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["last.ckpt", "step4.ckpt"]


@pytest.mark.slow
def test_ctrl_c_resumes_from_the_interrupted_step_not_the_older_last_ckpt(tmp_path, finished):
    run_dir = tmp_path / "run"
    # no periodic checkpoint before the end: only the interrupted one holds the steps done
    first = subprocess.Popen(_cli(run_dir, "checkpoint_every=100"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for_step(run_dir, first)
        first.send_signal(signal.SIGINT)
        err = first.communicate(timeout=300)[1]
    finally:
        first.kill()
    assert first.returncode == 130, err[-2000:]
    assert "Ctrl-C: stopping after this RL step and saving a checkpoint" in err and "Traceback" not in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["interrupted.ckpt"]
    done = _resume(err)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / 'interrupted.ckpt'} at RL step " in done.stdout
    assert stable(read_metrics(run_dir / "metrics.jsonl")) == stable(read_metrics(finished / "metrics.jsonl"))


@pytest.mark.slow
def test_a_truncated_last_ckpt_falls_back_to_the_newest_intact_one(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    done = _fresh(_cli(run_dir, "trainer.max_steps=5"))
    err = done.stderr
    assert f"{last} cannot be read (truncated or corrupt); resuming from step4.ckpt (RL step 4)" in err
    rows = read_metrics(run_dir / "metrics.jsonl")
    _no_duplicate_steps(rows)
    reference = stable(read_metrics(finished / "metrics.jsonl"))
    assert stable(rows)[: len(reference)] == reference, "nothing of the 4 steps is lost"
    assert max(r["step"] for r in rows) == 5

    # no intact checkpoint left: the same run starts over and logs its rows anew, once
    for ckpt in (run_dir / "checkpoints").iterdir():
        ckpt.write_bytes(b"")
    assert "no intact checkpoint is left: starting over" in _fresh(_cli(run_dir)).stderr
    assert stable(read_metrics(run_dir / "metrics.jsonl")) == reference


@pytest.mark.slow
def test_resume_mismatch_allow_resumes_and_keeps_the_old_config(tmp_path, finished):
    run_dir = _copy(finished, tmp_path / "run")
    old = (run_dir / "config.yaml").read_text()
    assert "resume_mismatch=allow: resuming" in _fresh(_cli(run_dir, "seed=1", "resume_mismatch=allow")).stderr
    assert (run_dir / "config.1.yaml").read_text() == old
    assert OmegaConf.load(run_dir / "config.yaml").seed == 1
    assert stable(read_metrics(run_dir / "metrics.jsonl")) == stable(read_metrics(finished / "metrics.jsonl"))


@pytest.mark.slow
def test_ctrl_c_stops_two_ranks_together_at_the_step_end(tmp_path):
    """Both ranks stop after the same step (rank 0's decision, broadcast where every rank is),
    well within the 30 s the elastic agent waits before it kills them."""
    run_dir = tmp_path / "run"
    command = [*_cli(run_dir, "checkpoint_every=100"), "trainer=ddp", "trainer.devices=2", "trainer.max_steps=8"]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        _wait_for_step(run_dir, first)
        start = time.monotonic()
        first.send_signal(signal.SIGINT)
        err = first.communicate(timeout=300)[1]
    finally:
        first.kill()
    assert first.returncode == 130, err[-3000:]
    assert time.monotonic() - start < 25, "the ranks did not stop by themselves"
    assert "forcefully" not in err and "Traceback" not in err, err[-3000:]
    assert "stopped by SIGINT after RL step " in err and "resume with: creditlab train" in err
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["interrupted.ckpt"]
