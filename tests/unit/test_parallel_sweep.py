"""``creditlab train -m ... --jobs N`` (issue 54): a sweep's jobs as separate processes, at most N
at a time, with the cores and the memory shared and checked before anything starts. The runs
themselves (the same metrics as Hydra's launcher) are in tests/integration/test_parallel_sweep.py."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from creditlab.cli import main
from creditlab.cli import train_command
from creditlab.errors import ConfigError
from creditlab.run import parallel
from creditlab.run.memory_budget import GIB, SHARE_ENV, available_memory
from creditlab.run.parallel import (
    SweepJob, SweepStopped, _command, _ended, _env, _quoted, check_memory, run_jobs, sweep_jobs, thread_count,
)


@pytest.mark.parametrize("overrides, jobs, cores, expected", [
    ([], 2, 2, 1), ([], 1, 2, 2), ([], 2, 16, 8), (["threads=0"], 2, 4, 2), (["threads=3"], 2, 8, 3),
])
def test_threads_are_the_cores_shared_unless_set(overrides, jobs, cores, expected):
    assert thread_count(overrides, jobs, cores) == expected


@pytest.mark.parametrize("overrides, jobs, message", [
    ([], 3, "at most --jobs 2"),
    (["threads=2"], 2, "asks 4 threads of 2 cores: use threads=1"),
    (["threads=1,2"], 2, "is not one thread count"),
])
def test_more_threads_than_cores_is_refused(overrides, jobs, message):
    with pytest.raises(ConfigError, match=message):
        thread_count(overrides, jobs, 2)


def test_jobs_run_in_hydras_folders_and_order(tmp_path):
    jobs = sweep_jobs(["method=grpo,dr_grpo", "seed=0,1", f"hydra.sweep.dir={tmp_path}"])
    assert [j.folder for j in jobs] == [tmp_path / str(i) for i in range(4)]
    assert [j.overrides for j in jobs][:2] == [("method=grpo", "seed=0", f"hydra.sweep.dir={tmp_path}"),
                                               ("method=grpo", "seed=1", f"hydra.sweep.dir={tmp_path}")]
    assert len({j.cost_key for j in jobs}) == 2  # seeds share a configuration, methods do not
    assert {j.sweep for j in jobs} == {tmp_path}  # where jobs.jsonl goes


def test_a_sweep_folder_with_the_time_in_it_is_resolved_once():
    jobs = sweep_jobs(["seed=0,1,2"])  # conf/train.yaml: multirun/${now:...}/${hydra.job.num}
    assert len({j.folder.parent for j in jobs}) == 1 and [j.folder.name for j in jobs] == ["0", "1", "2"]
    assert jobs[0].folder.parent.parent.name == "multirun"


def test_a_sweep_folder_may_depend_on_the_jobs_values(tmp_path):
    jobs = sweep_jobs(["method=grpo,dr_grpo", f"hydra.sweep.dir={tmp_path}/" + "${method}", "hydra.sweep.subdir=s"])
    assert [j.folder for j in jobs] == [tmp_path / "grpo" / "s", tmp_path / "dr_grpo" / "s"]


def test_two_jobs_in_one_folder_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"jobs 0 \(.*\) and 1 \(.*\) would both run in"):
        sweep_jobs(["trainer.max_steps=20,40", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=same"])


@pytest.mark.parametrize("override", ["hydra.job.chdir=true", "hydra/sweeper=optuna"])
def test_what_the_jobs_would_not_get_is_refused(override):
    with pytest.raises(ConfigError, match="is not passed to the jobs"):
        sweep_jobs(["seed=0,1", override])


def test_values_are_quoted_for_hydra_only_when_needed():
    assert _quoted("multirun/a_b-1.x") == "multirun/a_b-1.x"
    assert _quoted("/tmp/a b,c") == "'/tmp/a b,c'" and _quoted("it's") == "'it\\'s'"


def test_idle_threads_sleep_only_when_jobs_share_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert _env(2)["OMP_WAIT_POLICY"] == "PASSIVE" and "OMP_WAIT_POLICY" not in _env(1)


def test_how_a_job_ended_is_said_in_words():
    assert _ended(2) == "exit 2" and _ended(-15) == "killed by SIGTERM"
    assert _ended(-9) == "killed by SIGKILL (out of memory? its peak is in jobs.jsonl)"


def test_each_job_runs_as_its_own_command_with_its_folder_and_threads(tmp_path):
    job = SweepJob(3, ("method=grpo", "seed=1", "threads=2", f"hydra.sweep.dir={tmp_path}", "run_dir=x"),
                   tmp_path / "3", "k", tmp_path)
    cmd = _command(job, 1)
    assert cmd[:4] == [sys.executable, "-m", "creditlab.cli", "train"]
    assert cmd[4:] == ["method=grpo", "seed=1", "threads=1", f"run_dir={tmp_path / '3'}"]


def test_memory_is_planned_for_each_jobs_share():
    jobs = sweep_jobs(["seed=0,1", "method=grpo,dr_grpo", "hydra.sweep.dir=/tmp/unused"])
    (line,) = check_memory(jobs, 2, (24 * GIB, "a test's memory"))  # both configurations plan the same peak
    assert line.endswith("for jobs 0, 1 and those like them, 8.80 GiB usable of each job's share")
    with pytest.raises(ConfigError, match=r"--jobs 4: job 0 .* more than the .* GiB usable of each job's share.*use --jobs 2"):
        check_memory(jobs, 4, (6 * GIB, "a test's memory"))  # 1.5 GiB a job, of which 2 GiB are kept free
    with pytest.raises(ConfigError, match="does not fit even alone"):
        check_memory(jobs, 2, (2 * GIB, "a test's memory"))


def test_runs_of_several_ranks_are_refused():
    jobs = sweep_jobs(["seed=0,1", "trainer=ddp", "trainer.devices=2", "hydra.sweep.dir=/tmp/unused"])
    with pytest.raises(ConfigError, match="one-process CPU runs; job 0 runs on cpu with 2 rank"):
        check_memory(jobs, 2, (24 * GIB, "a test's memory"))


def test_each_job_sizes_auto_for_its_share(monkeypatch):
    whole = available_memory("cpu")
    monkeypatch.setenv(SHARE_ENV, "2")
    shared = available_memory("cpu")
    assert shared[0] == whole[0] // 2 and shared[1] == f"{whole[1]}, shared by 2 parallel sweep jobs"


def _fake(tmp_path, codes, monkeypatch, sleep=0.3):
    """Jobs whose commands exit with ``codes`` (and print their number), in ``tmp_path/<n>``."""
    monkeypatch.setattr(parallel, "_command", lambda job, threads: [
        sys.executable, "-c", f"import time; print('job {job.num} threads {threads}', flush=True); time.sleep({sleep}); "
                              f"raise SystemExit({codes[job.num]})"])
    return [SweepJob(n, (f"seed={n}",), tmp_path / str(n), "k", tmp_path) for n in range(len(codes))]


def test_jobs_run_at_most_n_at_a_time_each_with_its_log(tmp_path, monkeypatch):
    said = []
    assert run_jobs(_fake(tmp_path, [0, 0, 0], monkeypatch), 2, 1, said.append) == []
    assert [s.split()[1] for s in said].count("started") == 3
    assert said.index(next(s for s in said if s.startswith("[3/3] started"))) > 2  # the third waited for a slot
    assert (tmp_path / "2" / "job.log").read_text() == "job 2 threads 1\n"
    records = [json.loads(line) for line in (tmp_path / "jobs.jsonl").read_text().splitlines()]
    assert sorted(r["num"] for r in records) == [0, 1, 2] and all(r["exit"] == 0 for r in records)
    # a peak is recorded (a child starts from its parent's pages: under pytest that parent may hold GiB)
    assert all(r["seconds"] >= 0.3 and r["peak_rss_gib"] > 0 for r in records)


def test_a_failure_starts_no_new_job_and_is_named(tmp_path, monkeypatch):
    said = []
    failed = run_jobs(_fake(tmp_path, [3, 0, 0], monkeypatch), 1, 1, said.append)
    assert [j.num for j in failed] == [0]
    assert json.loads((tmp_path / "jobs.jsonl").read_text())["exit"] == 3
    assert said[-1] == f"[1/3] FAILED (exit 3) {tmp_path / '0'}: see {tmp_path / '0' / 'job.log'}"
    assert not (tmp_path / "1").exists()


def test_a_signal_stops_the_running_jobs_and_starts_no_new_one(tmp_path, monkeypatch):
    said, before = [], signal.getsignal(signal.SIGTERM)
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    with pytest.raises(SweepStopped) as stopped:
        run_jobs(_fake(tmp_path, [0, 0, 0], monkeypatch, sleep=30), 2, 1, said.append)
    assert time.monotonic() - t0 < 20 and stopped.value.signum == signal.SIGTERM and stopped.value.unfinished == 3
    assert sorted(s for s in said if "stopped" in s) == [f"[1/3] stopped (killed by SIGTERM) {tmp_path / '0'}",
                                                         f"[2/3] stopped (killed by SIGTERM) {tmp_path / '1'}"]
    assert not (tmp_path / "2").exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back


@pytest.mark.parametrize("args, message", [
    (["--jobs", "2"], "it goes with -m"),
    (["-m", "seed=0,1", "--jobs", "0"], "--jobs 0: give the number of runs at once"),
    (["-m", "seed=0,1", "--jobs=x"], "--jobs x: give the number"),
    (["-m", "seed=0,1", "--jobs", "2", "--plan"], "--plan and --dry-run only look at it"),
    (["-m", "seed=0,1", "--jobs", "2", "--cfg", "job"], "--cfg is not supported with it"),
    (["-m", "seed=0,1", "--jobs", "2", "hydra/launcher=slurm"], "runs them elsewhere"),
    (["-m", "seed=0,1", "--jobs", "2", "threads=5"], "--jobs 2 with threads=5 asks 10 threads"),
])
def test_command_line_errors(args, message, capsys, monkeypatch):
    monkeypatch.setattr(parallel, "cpu_cores", lambda: 2)
    with pytest.raises(SystemExit) as exc:
        main(["train", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_command_line_reaches_the_launcher(monkeypatch, capsys, tmp_path):
    seen = []
    monkeypatch.setattr(parallel, "cpu_cores", lambda: 2)
    monkeypatch.setattr(train_command, "prepare_models", lambda jobs, threads, say: seen.append(("models", threads)))
    monkeypatch.setattr(train_command, "run_jobs", lambda jobs, n, threads, say: seen.append(
        ([j.folder.name for j in jobs], n, threads)) or jobs[1:])
    with pytest.raises(SystemExit) as exc:
        main(["train", "-m", "seed=0,1", f"hydra.sweep.dir={tmp_path}", "--jobs", "2"])
    assert exc.value.code == 1  # a failed job
    assert seen == [("models", 1), (["0", "1"], 2, 1)]
    captured = capsys.readouterr()
    assert "2 runs, at most 2 at a time, 1 thread(s) each" in captured.out
    assert f"failed: {tmp_path / '1'} (log: {tmp_path / '1' / 'job.log'})" in captured.err
