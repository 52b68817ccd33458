"""A run directory belongs to one run: it must be a writable folder, one process at a time runs in
it (an advisory lock), and a resume continues the same run (the config in ``config.yaml``, apart
from the step budget and keys that cannot change what is trained).

Each check ends in one clear message (:class:`RunDirError`, an :class:`~creditlab.errors.InputError`)
before the model loads and before anything in the folder is written, so a refused run loses
nothing of the run already there. Light on purpose (no torch): the CLI checks ``run_dir`` with it
before Hydra creates the folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from creditlab.analysis.rundirs import flatten
from creditlab.errors import ConfigError, InputError

#: The lock file in a run directory (its content names the holder; the lock itself is the kernel's).
LOCK_FILE = ".lock"
#: Config keys a resume may change (with their sub-keys): they cannot change what is trained.
#: ``trainer.max_steps`` is the step budget (extending a run is what resuming is for); ``run_dir``,
#: ``resume`` and ``resume_mismatch`` say where and how to run; ``checkpoint_every`` when to save
#: (randomness is a function of the RL step, not of the checkpoints); ``logger`` and ``tags`` where
#: metrics are reported; the ``trainer`` display keys what the console shows. ``threads`` is a
#: machine's resource, like the machine itself: another thread count may change float rounding as
#: moving to another machine does, never the method. So are the update's memory layout keys
#: ``loss.micro_batch_size``, ``loss.micro_batch_tokens`` (``auto`` resolves from the machine's
#: memory anyway) and ``loss.fused_head``: the packed, fused update equals the whole-batch one up
#: to float rounding (tests/unit/test_packing.py, test_token_logprobs.py), so runs from before
#: ``auto`` resume. Anything else (seed, method, parts, rollout, the loss itself, optimizer, model,
#: eval, batch sizes, precision, devices) needs ``resume_mismatch=allow``.
RESUME_FREE_KEYS = (
    "trainer.max_steps", "run_dir", "resume", "resume_mismatch", "checkpoint_every", "threads",
    "logger", "tags", "trainer.enable_progress_bar", "trainer.enable_model_summary",
    "trainer.log_every_n_steps", "loss.micro_batch_size", "loss.micro_batch_tokens", "loss.fused_head",
)
#: Keys added to ``conf/train.yaml`` after runs existed, with the value a ``config.yaml`` written
#: before them means by leaving them out (a resume of such a run sees no difference).
ADDED_KEYS = {"preregistration": None, "loss.skip_zero_advantage": False}
MISMATCH_MODES = ("refuse", "allow")
SHOWN_DIFFS = 4


class RunDirError(InputError):
    """A run directory that cannot be used as asked: not a writable folder, in use by another run,
    or holding another run than the one asked to resume it."""


class RunStopped(Exception):
    """The run stopped on a signal (SIGTERM, Ctrl-C) at the end of an RL step, or at once on a
    second Ctrl-C; ``checkpoint`` is what a resume continues from (None: it starts over).

    Attributes:
        signal: ``SIGTERM`` or ``SIGINT``.
        step: RL steps done.
        max_steps: The run's step budget.
        checkpoint: The checkpoint ``resume=auto`` will continue from, or None.
        saved: Whether ``checkpoint`` was written as the run stopped (False: an earlier one).
    """

    def __init__(self, signal_name: str, step: int, max_steps: int, checkpoint: Path | None, saved: bool) -> None:
        self.signal, self.step, self.max_steps = signal_name, step, max_steps
        self.checkpoint, self.saved = checkpoint, saved
        if checkpoint is None:
            where = "no checkpoint yet: resuming starts over"
        elif saved:
            where = f"checkpoint saved: {checkpoint}"
        else:
            where = f"stopped mid-step, nothing saved: resuming continues from {checkpoint}"
        super().__init__(f"stopped by {signal_name} after RL step {step} of {max_steps}; {where}")

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process ended by that signal."""
        return 128 + int(getattr(signal, self.signal, signal.SIGTERM))


def check_run_dir(run_dir: str | Path) -> None:
    """Raise :class:`RunDirError` unless ``run_dir`` is (or can be created as) a writable folder
    that no run is using at the moment.

    The nearest existing folder on the path is probed with a temporary file, so read-only file
    systems and missing permissions are found for every user (root included, on a read-only mount).
    The lock is only tried here (and let go): the run takes it with :class:`RunDirLock`.
    """
    path = Path(run_dir)
    here = path
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        what = "is a file" if here.exists() else "does not exist"
        raise RunDirError(f"run_dir={run_dir}: {here} {what}, not a folder; choose another run_dir.")
    try:
        with tempfile.TemporaryFile(dir=here):
            pass
    except OSError as exc:
        action = "write in" if here == path else "create a folder in"
        raise RunDirError(
            f"run_dir={run_dir}: cannot {action} {here} ({exc.strerror}); choose a writable run_dir."
        ) from None
    if (path / LOCK_FILE).is_file():
        with RunDirLock(path):
            pass


class RunDirLock:
    """An exclusive advisory lock (``flock``) on ``<run_dir>/.lock``, held while a run uses the
    folder; the kernel releases it when the process ends, however it ends, so no lock goes stale.

    Taken by the launching process only: ranks it starts never touch it (their file descriptors do
    not carry it: Python's are close-on-exec). A forked child holds it until it exits.
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunDirError` naming the process that holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunDirError(
                f"run_dir {self.path.parent} is in use by another run ({holder}); two runs in one folder "
                "would mix their metrics and checkpoints. Wait for it to end, or choose another run_dir."
            ) from None
        except OSError as exc:  # a file system without locks: run, but say so
            os.close(fd)
            print(f"[creditlab] warning: cannot lock {self.path} ({exc.strerror}); nothing stops a "
                  "second run from using this run_dir at the same time", file=sys.stderr)
            return
        os.ftruncate(fd, 0)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.pwrite(fd, json.dumps(record).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> str:
    """``pid N on host H, since T`` from the lock file (written by the holder once it holds it)."""
    try:
        record = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {record['pid']} on host {record['host']}, since {record['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "pid unknown: it has only just started"


def _held(run_dir: Path) -> str:
    """What of an earlier run ``run_dir`` holds (``""``: nothing that a new run could mix with)."""
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").glob("*.ckpt"))
    steps = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                steps.append(int(json.loads(line).get("step", 0)))
            except (ValueError, TypeError, AttributeError):
                continue
    parts = ([f"metrics up to RL step {max(steps)}"] if steps else []) + (
        [f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) > 1 else ''}"] if checkpoints else [])
    return ", ".join(parts)


_MISSING = object()


def _short(value: Any) -> str:
    if value is _MISSING:
        return "(missing)"
    plain = isinstance(value, str) and value and not any(c.isspace() or c in "\"'," for c in value)
    text = value if plain else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every flattened key that differs, :data:`RESUME_FREE_KEYS` aside."""
    a, b = flatten(old), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "hydra" or key.startswith("hydra.") or any(key == f or key.startswith(f + ".") for f in RESUME_FREE_KEYS):
            continue
        absent = ADDED_KEYS.get(key, _MISSING)
        if a.get(key, absent) != b.get(key, absent):
            out.append(f"{key}: {_short(a.get(key, _MISSING))} -> {_short(b.get(key, _MISSING))}")
    return out


def check_resume(cfg: DictConfig, run_dir: str | Path) -> str | None:
    """Refuse to run ``cfg`` in a ``run_dir`` that holds another run. Call it holding the lock,
    before ``config.yaml`` is written.

    A run_dir holds a run when it has logged metrics or checkpoints. ``resume=null`` there would
    start a second run on top of it; a resume (``auto`` or a path) must have the same config apart
    from :data:`RESUME_FREE_KEYS`. With ``resume_mismatch=allow`` the resume goes on and the old
    ``config.yaml`` is kept as ``config.<n>.yaml``.

    Returns:
        A line to print when a differing config is allowed, else None.

    Raises:
        ConfigError: ``resume_mismatch`` is neither ``refuse`` nor ``allow``.
        RunDirError: The run_dir holds another run.
    """
    run_dir = Path(run_dir)
    mode = cfg.get("resume_mismatch", "refuse")
    if mode not in MISMATCH_MODES:
        raise ConfigError(f"resume_mismatch={mode}: use refuse (the default) or allow.")
    held = _held(run_dir)
    if not held:
        return None
    if not cfg.get("resume"):
        raise RunDirError(
            f"run_dir {run_dir} already holds a run ({held}); resume=null would start a second run on "
            "top of it. Choose a new run_dir, or resume=auto to continue it."
        )
    new = yaml.safe_load(OmegaConf.to_yaml(cfg, resolve=True)) or {}
    old_path = run_dir / "config.yaml"
    try:
        old: Any = yaml.safe_load(old_path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        old = exc
    if isinstance(old, dict):
        diffs = config_differences(old, new)
    else:
        reason = "missing" if isinstance(old, FileNotFoundError) else f"unreadable: {type(old).__name__}"
        diffs = [f"config.yaml ({reason}) -> this config"]
    if not diffs:
        return None
    shown = ", ".join(diffs[:SHOWN_DIFFS]) + (f" and {len(diffs) - SHOWN_DIFFS} more" if len(diffs) > SHOWN_DIFFS else "")
    if mode == "allow":
        kept = ""
        if old_path.is_file():
            n = 1
            while (run_dir / f"config.{n}.yaml").exists():
                n += 1
            shutil.copyfile(old_path, run_dir / f"config.{n}.yaml")
            kept = f"; the old config is kept as config.{n}.yaml"
        return f"[creditlab] resume_mismatch=allow: resuming {run_dir} with another config ({shown}){kept}"
    raise RunDirError(
        f"run_dir {run_dir} holds a run ({held}) with another config: {shown}.\n"
        "Resuming it would mix two runs: choose a new run_dir, or add resume_mismatch=allow to resume "
        "anyway (a resume may change only trainer.max_steps and bookkeeping keys; docs/reproducing.md)."
    )
