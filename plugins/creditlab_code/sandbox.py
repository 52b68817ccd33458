"""Run untrusted Python code in a fresh, limited child process; judge it from another one.

One :meth:`Sandbox.run` = two fresh ``python -I -S`` processes (isolated mode, no ``site``), each
in its own session and process group, with a minimal explicit environment (never the parent's):

- the **child** (:mod:`creditlab_code.harness`) defines the model's code and answers calls of
  its entry point. It gets the code and, one call at a time, the call's arguments -- never a
  test or an expected value -- and sends back the return value as plain data
  (:mod:`creditlab_code.codec`);
- the **judge** (:mod:`creditlab_code.judge`) runs the problem's tests with the entry point as a
  proxy and compares, with built-in operations on rebuilt built-in values, in a process the
  model's code never shares. The model's code can influence nothing but its return values.

Two isolation modes for the child, chosen by a probe on first use:

- ``namespaces``: the child starts under ``unshare --net --pid --mount --ipc --uts --cgroup
  --fork --kill-child`` (plus ``--user --map-root-user`` when not root): no network but a downed
  loopback, its own PID namespace (every process in it dies with it), its own SysV IPC objects
  (gone with it), hostname and cgroup view, and a private mount namespace in which the harness
  builds a minimal read-only root and pivots into it. As root, the code then runs as an
  unprivileged uid (``nobody`` by default), which makes ``RLIMIT_NPROC`` effective.
- ``none``: no namespaces (no ``unshare``, or it is not permitted). Resource limits, the uid
  switch when root, the seccomp filter, cgroups, the process-group kill and the audit hook still
  apply.

In both modes, where available: a seccomp filter (``libseccomp``) refusing namespace creation,
keyrings, SysV IPC, ``ptrace`` and mounts (:data:`creditlab_code.child_setup.SECCOMP_DENY`), and
a memory + pids cgroup per run (:mod:`creditlab_code.cgroups`) that bounds the memory held
outside the address space too (tmpfs files, pipes, shared memory).

The parent enforces the wall-time limit itself: it waits on the judge's report with ``poll``,
SIGKILLs both process groups on the deadline, never blocks on a read, and never waits on a
child for more than a bounded time. Standard library only (no torch, no creditlab imports).
"""

from __future__ import annotations

import ctypes
import json
import logging
import marshal
import os
import pwd
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

from creditlab_code import cgroups
from creditlab_code.results import (
    SandboxResult,
    from_report,
    head,
    kill,
    live_sandbox_processes,
    signame,
)

log = logging.getLogger(__name__)
__all__ = ["Limits", "Sandbox", "SandboxError", "SandboxResult", "live_sandbox_processes"]

#: The child's and the judge's programs: standard-library-only files run as one.
CHILD_PARTS = ("child_setup.py", "child_guard.py", "codec.py", "harness.py")
JUDGE_PARTS = ("codec.py", "judge.py")
HARNESS_SOURCE, JUDGE_SOURCE = ("\n\n".join((Path(__file__).parent / name).read_text(encoding="utf-8")
                                            for name in parts) for parts in (CHILD_PARTS, JUDGE_PARTS))
#: The child's program when it runs the parent's Python version: load the precompiled harness
#: (saves compiling the harness, a few milliseconds, per completion).
BOOTSTRAP = ("import marshal, sys\n"
             "with open(sys.argv[3] + '/{name}', 'rb') as f:\n"
             "    exec(marshal.loads(f.read()))\n")
MODES = ("auto", "namespaces", "none")
#: System folders bound read-only into the namespace root (symlinks are copied as symlinks).
SYSTEM_BINDS = ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32", "/etc/ld.so.cache")
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
#: Most bytes of the judge's report read per run.
MAX_REPORT_BYTES = 1 << 20
#: Address-space limit of the judge (it holds the tests and the values that came back).
JUDGE_MEMORY_BYTES = 1 << 30
#: Seconds the parent waits for the judge's report past the run's wall limit.
REPORT_GRACE_S = 2.0
#: Bytes of the child's stdout+stderr file kept in the result.
OUTPUT_HEAD = 1000
_PROBE_CODE = "import fractions\n\ndef probe(x):\n    return fractions.Fraction(x, 2) * 2 == x\n"
_PROBE_TESTS = ("assert probe(1) is True",)
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
        self._compiled: dict[str, bytes] | None = None
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
            self._compiled = {name: marshal.dumps(compile(source, f"<creditlab-{name}>", "exec"))
                              for name, source in (("harness", HARNESS_SOURCE),
                                                   ("judge", JUDGE_SOURCE))}
        paths.append(os.path.dirname(self.python))
        return _subpaths_removed([os.path.realpath(p) for p in paths if p and os.path.exists(p)])

    def _candidates(self) -> list[dict[str, Any]]:
        uid, gid = self._identity()
        readable = self._interpreter_paths()
        common = {"readable": readable, "uid": uid, "gid": gid, "seccomp": _has_libseccomp(),
                  "cgroups": os.geteuid() == 0 and cgroups.available()}
        plans = []
        unshare = shutil.which("unshare")
        if self.isolation in ("auto", "namespaces") and unshare and sys.platform == "linux":
            prefix = [unshare, "--net", "--pid", "--mount", "--ipc", "--uts", "--cgroup", "--fork",
                      "--kill-child"]
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
            result = self._run(plan, _PROBE_CODE, _PROBE_TESTS, "probe", Limits(timeout_s=30))
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
    def run(self, code: str, tests: list[str], entry_point: str) -> SandboxResult:
        """Define ``code`` in the child, then run each test (Python statements calling
        ``entry_point``, e.g. ``assert f(1) == 2``) in the judge.

        Thread-safe; each call is an independent pair of processes. Never blocks past
        ``limits.timeout_s`` plus a few seconds of cleanup.
        """
        return self._run(self.plan, code, tests, entry_point, self.limits)

    def _run(self, plan: dict[str, Any], code: str, tests: list[str] | tuple[str, ...],
             entry_point: str, limits: Limits) -> SandboxResult:
        start = time.monotonic()
        base = tempfile.mkdtemp(prefix="creditlab-code-", dir=plan.get("tmp_dir"))
        work = os.path.join(base, "work")
        fds: list[int] = []
        procs: list[subprocess.Popen] = []
        groups: list[str] = []
        try:
            os.mkdir(work, 0o700)
            os.chmod(base, 0o711)  # the sandbox uid may traverse to work/, not list base/
            if plan.get("uid") is not None:
                os.chown(work, plan["uid"], plan["gid"])
            if plan.get("layout"):
                os.mkdir(os.path.join(base, "root"), 0o755)
            if plan.get("cgroups"):  # memory: the code's, its files' and some slack
                groups = cgroups.create((limits.memory_mb + limits.disk_mb + 64) << 20,
                                        (limits.processes or 64) + 2)
            keys = ("layout", "uid", "gid", "readable", "binds", "devices", "drop_caps",
                    "cap_last", "seccomp")
            isolation = {k: plan[k] for k in keys if k in plan}
            isolation.update(work=work, root=os.path.join(base, "root"), cgroups=groups,
                             disk_bytes=limits.disk_mb << 20)
            _write_private(base, "payload.bin", marshal.dumps(
                {"code": code, "entry_point": entry_point, "limits": limits.for_harness(),
                 "isolation": isolation, "audit": self.audit_hook}))
            _write_private(base, "judge.bin", marshal.dumps(
                {"tests": list(tests), "entry_point": entry_point, "timeout_s": limits.timeout_s,
                 "limits": limits.for_harness(), "memory_bytes": JUDGE_MEMORY_BYTES}))
            programs = {"harness": HARNESS_SOURCE, "judge": JUDGE_SOURCE}
            for name, compiled in (self._compiled or {}).items():
                programs[name] = BOOTSTRAP.format(name=f"{name}.pyc")
                _write_private(base, f"{name}.pyc", compiled)
            program = programs["harness"]
            req_read, req_write = os.pipe()
            fds += [req_read, req_write]
            rep_read, rep_write = os.pipe()
            fds += [rep_read, rep_write]
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work,
                   "CREDITLAB_SANDBOX": f"{os.getpid()}-{next(_RUN_IDS)}"}
            with open(os.path.join(base, "output.log"), "wb") as out:
                procs.append(subprocess.Popen(
                    [*plan["prefix"], self.python, "-I", "-S", "-c", program, str(rep_write),
                     str(req_read), base], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    pass_fds=(rep_write, req_read), close_fds=True, start_new_session=True,
                    env=env, cwd=work))
            with open(os.path.join(base, "judge.log"), "wb") as err:
                procs.append(subprocess.Popen(
                    [self.python, "-I", "-S", "-c", programs["judge"], str(req_write), str(rep_read),
                     base], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                    pass_fds=(req_write, rep_read), close_fds=True, start_new_session=True,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd=base))
            for fd in fds:
                os.close(fd)
            fds = []
            child, judge = procs
            raw, ended = self._collect(judge, judge.stdout.fileno(),
                                       start + limits.timeout_s + REPORT_GRACE_S)
            if ended != "wall timeout":
                ended = _child_ended(child)
            result = from_report(raw, ended, len(tests))
            result.output = head(os.path.join(base, "output.log"), OUTPUT_HEAD)
            if not raw:
                result.error = result.error or ("the judge did not report: " + head(
                    os.path.join(base, "judge.log"), 300).strip()[-300:])
        except OSError as exc:
            result = SandboxResult(ended="start failed", reason="error",
                                   error=f"could not start the sandbox: {exc}")
            result.tests = [{"outcome": "not_run", "error": result.error} for _ in tests]
        finally:
            for proc in procs:
                kill(proc)
                if proc.stdout is not None:
                    proc.stdout.close()
            for fd in fds:
                os.close(fd)
            cgroups.remove(groups)
            shutil.rmtree(base, ignore_errors=True)
        result.seconds = time.monotonic() - start
        return result

    @staticmethod
    def _collect(proc: subprocess.Popen, fd: int, deadline: float) -> tuple[bytes, str]:
        """Read the judge's report until EOF, the deadline, or a flood; never blocks."""
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
        return b"".join(chunks), "reported"


def _child_ended(proc: subprocess.Popen, wait_s: float = 0.3) -> str:
    """How the child process ended (``exit 0``, ``signal SIGXCPU``), after at most ``wait_s``;
    ``wall timeout`` when it was still running once the judge was done with it (a call that
    outlasted its hard limit)."""
    try:
        code = proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        return "wall timeout"
    return f"signal {signame(-code)}" if code < 0 else f"exit {code}"


def _write_private(base: str, name: str, data: bytes) -> None:
    fd = os.open(os.path.join(base, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _has_libseccomp() -> bool:
    """Whether the seccomp filter can be loaded here (Linux with ``libseccomp.so.2``)."""
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return False
    return sys.platform == "linux"
