"""Run untrusted Python code and its tests in a fresh, limited child process.

One :meth:`Sandbox.run` = one fresh ``python -I -S`` process (isolated mode, no ``site``) running
:mod:`creditlab_code.harness`, in its own session and process group, with a minimal explicit
environment (never the parent's). Two isolation modes, chosen by a probe on first use:

- ``namespaces``: the child starts under ``unshare --net --pid --mount --fork --kill-child``
  (plus ``--user --map-root-user`` when not root): no network interfaces but a downed loopback,
  its own PID namespace (every process in it dies with it), and a private mount namespace in
  which the harness builds a minimal read-only root and pivots into it. As root, the code then
  runs as an unprivileged uid (``nobody`` by default), which makes ``RLIMIT_NPROC`` effective
  (root is exempt from it: measured here).
- ``none``: no namespaces (no ``unshare``, or it is not permitted). Resource limits, the uid
  switch when root, the process-group kill and the audit hook still apply.

The parent enforces the wall-time limit itself: it waits on the result pipe with ``poll``,
SIGKILLs the whole process group on the deadline, never blocks on a read, and never waits on a
child for more than a bounded time. Standard library only (no torch, no creditlab imports).
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import pwd
import secrets
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from creditlab_code.results import (
    SandboxResult,
    head,
    kill,
    live_sandbox_processes,
    parse,
    signame,
)

log = logging.getLogger(__name__)
__all__ = ["Limits", "Sandbox", "SandboxError", "SandboxResult", "live_sandbox_processes"]

#: The child's program: three standard-library-only files run as one (see ``harness.py``).
CHILD_PARTS = ("child_setup.py", "child_guard.py", "harness.py")
HARNESS_SOURCE = "\n\n".join((Path(__file__).parent / name).read_text(encoding="utf-8")
                               for name in CHILD_PARTS)
#: The child's program when it runs the parent's Python version: load the precompiled harness
#: (saves compiling the harness, a few milliseconds, per completion).
BOOTSTRAP = ("import marshal, sys\n"
             "with open(sys.argv[2] + '/harness.bin', 'rb') as f:\n"
             "    exec(marshal.loads(f.read()))\n")
MODES = ("auto", "namespaces", "none")
#: System folders bound read-only into the namespace root (symlinks are copied as symlinks).
SYSTEM_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: Most result-pipe bytes read per run (a flood beyond it ends the run).
MAX_REPORT_BYTES = 1 << 20
#: Bytes of the child's stdout+stderr file kept in the result.
OUTPUT_HEAD = 1000
_PROBE_CODE = "def probe():\n    return 1\n"
_PROBE_TESTS = ("assert probe() == 1", "import fractions\nassert fractions.Fraction(1, 2) * 2 == 1")
_RUN_IDS = count()


@dataclass(frozen=True)
class Limits:
    """Per-completion limits.

    Attributes:
        timeout_s: Wall time of the whole run (start-up, solution and every test); the process
            group is SIGKILLed when it is reached.
        test_timeout_s: Soft per-test limit (an in-process alarm; a test that outlasts it fails
            with ``timeout`` and the next test runs).
        cpu_s: ``RLIMIT_CPU`` seconds (SIGXCPU, then SIGKILL one second later).
        memory_mb: ``RLIMIT_AS`` (address space) in MiB.
        file_size_mb: ``RLIMIT_FSIZE`` in MiB (largest file the code may write).
        output_kb: Bytes of stdout and stderr kept, each (the rest is counted and dropped).
        disk_mb: Size of the work folder (a tmpfs) in namespace mode; not enforced in ``none``
            mode, where only ``file_size_mb`` bounds each file.
        open_files: ``RLIMIT_NOFILE``.
        processes: ``RLIMIT_NPROC`` (counts every process and thread of the sandbox uid; 1 =
            no new process or thread). ``None`` leaves it unset.
    """

    timeout_s: float = 5.0
    test_timeout_s: float = 2.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    file_size_mb: int = 8
    output_kb: int = 64
    disk_mb: int = 64
    open_files: int = 64
    processes: int | None = 1

    def for_harness(self) -> dict[str, Any]:
        return {
            "test_timeout_s": self.test_timeout_s, "cpu_s": self.cpu_s,
            "memory_bytes": self.memory_mb << 20, "file_size_bytes": self.file_size_mb << 20,
            "output_bytes": self.output_kb << 10, "open_files": self.open_files,
            "processes": self.processes,
        }


class SandboxError(RuntimeError):
    """The sandbox cannot run at all (e.g. the requested isolation is not available)."""


def _subpaths_removed(paths: list[str]) -> list[str]:
    out: list[str] = []
    for path in sorted(dict.fromkeys(paths), key=len):
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in out):
            out.append(path)
    return out


class Sandbox:
    """Runs code + tests in fresh sandboxed processes (see the module docstring).

    Args:
        limits: Per-run limits.
        isolation: ``"auto"`` (namespaces when they work, else none), ``"namespaces"`` (fail if
            unavailable) or ``"none"``.
        user: Unprivileged user (name or number) the code runs as when the parent is root;
            ``None`` keeps the parent's uid.
        python: Interpreter for the child; default: the real path of the running one.
        audit_hook: Install the audit hook (turn off only to test the kernel-enforced layers).
    """

    def __init__(self, limits: Limits | None = None, *, isolation: str = "auto",
                 user: str | None = "nobody", python: str | None = None,
                 audit_hook: bool = True) -> None:
        if isolation not in MODES:
            raise ValueError(f"isolation must be one of {', '.join(MODES)}; got {isolation!r}")
        self.limits = limits or Limits()
        self.isolation = isolation
        self.user = user
        self.python = python or os.path.realpath(getattr(sys, "_base_executable", None)
                                                 or sys.executable)
        self.audit_hook = audit_hook
        self._plan: dict[str, Any] | None = None
        self._compiled: bytes | None = None
        self._lock = threading.Lock()

    # -- set-up -----------------------------------------------------------------------------
    @property
    def plan(self) -> dict[str, Any]:
        """The isolation plan in use (probed on first access)."""
        with self._lock:
            if self._plan is None:
                self._plan = self._probe()
            return self._plan

    def _identity(self) -> tuple[int | None, int | None]:
        if os.geteuid() != 0 or self.user is None:
            return None, None
        try:
            entry = pwd.getpwuid(int(self.user)) if str(self.user).isdigit() else pwd.getpwnam(self.user)
        except (KeyError, ValueError) as exc:
            raise SandboxError(f"sandbox user {self.user!r} does not exist ({exc}); set "
                               f"verifier.sandbox_user to an existing unprivileged user or null") from exc
        if entry.pw_uid == 0:
            raise SandboxError(f"sandbox user {self.user!r} is root; pick an unprivileged user")
        return entry.pw_uid, entry.pw_gid

    def _interpreter_paths(self) -> list[str]:
        query = ("import json, sys; print(json.dumps([sys.version, sys.implementation.name, "
                 "sys.prefix, sys.exec_prefix] + sys.path))")
        try:
            out = subprocess.run([self.python, "-I", "-S", "-c", query], capture_output=True,
                                 text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}, check=True)
            version, implementation, *paths = json.loads(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            raise SandboxError(f"cannot run the sandbox interpreter {self.python}: {exc}") from exc
        if (version, implementation) == (sys.version, sys.implementation.name):
            self._compiled = marshal.dumps(compile(HARNESS_SOURCE, "<creditlab-harness>", "exec"))
        paths.append(os.path.dirname(self.python))
        return _subpaths_removed([os.path.realpath(p) for p in paths if p and os.path.exists(p)])

    def _candidates(self) -> list[dict[str, Any]]:
        uid, gid = self._identity()
        readable = self._interpreter_paths()
        common = {"readable": readable, "uid": uid, "gid": gid}
        plans = []
        unshare = shutil.which("unshare")
        if self.isolation in ("auto", "namespaces") and unshare and sys.platform == "linux":
            prefix = [unshare, "--net", "--pid", "--mount", "--fork", "--kill-child"]
            root = os.geteuid() == 0
            if not root:
                prefix[1:1] = ["--user", "--map-root-user"]
            try:
                cap_last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
            except (OSError, ValueError):
                cap_last = 40
            binds = _subpaths_removed(readable + [p for p in SYSTEM_BINDS if os.path.lexists(p)])
            shm = "/dev/shm"  # run folders in memory: ext4 unlink can cost ~10 ms per run
            tmp_dir = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
            plans.append({**common, "name": "namespaces", "prefix": prefix, "layout": True,
                          "binds": binds, "devices": list(DEVICES), "drop_caps": not root,
                          "cap_last": cap_last, "tmp_dir": tmp_dir})
        if self.isolation in ("auto", "none"):
            plans.append({**common, "name": "none", "prefix": [], "layout": False})
            if uid is not None:
                plans.append({**common, "name": "none", "prefix": [], "layout": False,
                              "uid": None, "gid": None})
        return plans

    def _probe(self) -> dict[str, Any]:
        failures = []
        if self.isolation == "namespaces" and not shutil.which("unshare"):
            failures.append("namespaces: the 'unshare' program (util-linux) is not installed")
        for plan in self._candidates():
            result = self._run(plan, _PROBE_CODE, _PROBE_TESTS, None, Limits(timeout_s=30))
            if all(t["outcome"] == "passed" for t in result.tests) and result.tests:
                if failures:
                    log.warning("code sandbox: using isolation '%s' (%s); unavailable: %s",
                                plan["name"], ", ".join(result.isolation), "; ".join(failures))
                return {**plan, "layers": result.isolation}
            failed = next((t.get("error") for t in result.tests if t["outcome"] != "passed"), None)
            detail = result.error or failed or result.ended or "probe tests failed"
            if result.output.strip():
                detail += f" (output: {result.output.strip()[-300:]!r})"
            who = f"uid {plan['uid']}" if plan.get("uid") is not None else "own uid"
            failures.append(f"{plan['name']} ({who}): {detail}")
        raise SandboxError("no sandbox isolation works here: " + "; ".join(failures))

    # -- running ----------------------------------------------------------------------------
    def run(self, code: str, tests: list[str], entry_point: str | None = None) -> SandboxResult:
        """Run ``code`` then each test (Python statements, e.g. ``assert f(1) == 2``).

        Thread-safe; each call is an independent process. Never blocks past
        ``limits.timeout_s`` plus a few seconds of cleanup.
        """
        return self._run(self.plan, code, tests, entry_point, self.limits)

    def _run(self, plan: dict[str, Any], code: str, tests: list[str] | tuple[str, ...],
             entry_point: str | None, limits: Limits) -> SandboxResult:
        start = time.monotonic()
        base = tempfile.mkdtemp(prefix="creditlab-code-", dir=plan.get("tmp_dir"))
        work = os.path.join(base, "work")
        read_fd = write_fd = -1
        proc = None
        try:
            os.mkdir(work, 0o700)
            os.chmod(base, 0o711)  # the sandbox uid may traverse to work/, not list base/
            if plan.get("uid") is not None:
                os.chown(work, plan["uid"], plan["gid"])
            if plan.get("layout"):
                os.mkdir(os.path.join(base, "root"), 0o755)
            keys = ("layout", "uid", "gid", "readable", "binds", "devices", "drop_caps",
                    "cap_last")
            isolation = {k: plan[k] for k in keys if k in plan}
            isolation.update(work=work, root=os.path.join(base, "root"),
                             disk_bytes=limits.disk_mb << 20)
            nonce = secrets.token_hex(16)
            payload = {"code": code, "tests": list(tests), "entry_point": entry_point,
                       "nonce": nonce,
                       "limits": limits.for_harness(), "isolation": isolation,
                       "audit": self.audit_hook}
            fd = os.open(os.path.join(base, "payload.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps(payload))
            program = HARNESS_SOURCE
            if self._compiled is not None:
                program = BOOTSTRAP
                fd = os.open(os.path.join(base, "harness.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(self._compiled)
            read_fd, write_fd = os.pipe()
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work,
                   "CREDITLAB_SANDBOX": f"{os.getpid()}-{next(_RUN_IDS)}"}
            command = [*plan["prefix"], self.python, "-I", "-S", "-c", program,
                       str(write_fd), base]
            with open(os.path.join(base, "output.log"), "wb") as out:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=out, pass_fds=(write_fd,), close_fds=True,
                                        start_new_session=True, env=env, cwd=work)
            os.close(write_fd)
            write_fd = -1
            raw, ended = self._collect(proc, read_fd, start + limits.timeout_s)
            result = parse(raw, ended, nonce, len(tests))
            result.output = head(os.path.join(base, "output.log"), OUTPUT_HEAD)
        except OSError as exc:
            result = SandboxResult(ended="start failed", reason="error",
                                   error=f"could not start the sandbox: {exc}")
            result.tests = [{"outcome": "not_run", "error": result.error} for _ in tests]
        finally:
            if proc is not None:
                kill(proc)
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            shutil.rmtree(base, ignore_errors=True)
        result.seconds = time.monotonic() - start
        return result

    @staticmethod
    def _collect(proc: subprocess.Popen, fd: int, deadline: float) -> tuple[bytes, str]:
        """Read the result pipe until EOF and exit, the deadline, or a flood; never blocks."""
        os.set_blocking(fd, False)
        poller = select.poll()  # not select(): fd numbers above 1023 are common in a trainer
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        chunks, size = [], 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), "wall timeout"
            if not poller.poll(max(1, int(remaining * 1000))):
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_REPORT_BYTES:
                return b"".join(chunks), "report flood"
        try:  # every writer closed the pipe: the child is exiting
            code = proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return b"".join(chunks), "wall timeout"
        if code < 0:
            return b"".join(chunks), f"signal {signame(-code)}"
        return b"".join(chunks), f"exit {code}"
