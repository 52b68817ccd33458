"""What a sandbox run produced: parsing the child's reports, killing it, finding leftovers.

Standard library only (the parent side of :mod:`creditlab_code.sandbox`).
"""

from __future__ import annotations

import logging
import marshal
import os
import signal
import subprocess
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("creditlab_code.sandbox")
#: Processes that did not die within the grace period after SIGKILL; polled again later.
_UNREAPED: list[subprocess.Popen] = []


@dataclass
class SandboxResult:
    """What happened in one run.

    Attributes:
        solution: How defining the solution ended: ``ok``, ``syntax_error``, ``error``,
            ``timeout``, ``memory``, ``denied``, or ``None`` when it never finished.
        tests: One ``{"outcome", "error"?}`` per test; outcomes ``passed``, ``failed``,
            ``error``, ``timeout``, ``memory``, ``denied``, ``killed``, ``crashed``,
            ``not_run``, or the solution's failure.
        ended: ``"exit 0"``, ``"wall timeout"``, ``"signal SIGXCPU"``, ``"exit 3"``,
            ``"report flood"``, ...
        reason: Why the run ended early (``timeout``, ``killed``, ``crashed``, ``error``) or
            ``None``.
        error: Solution or start-up error message, if any.
        seconds: Wall time from start to cleanup.
        isolation: The layers that were in place (``namespaces``, ``uid 65534``, ``audit hook``).
        denials: Operations the audit hook denied (first 20).
        output_bytes: Bytes the code wrote to stdout and stderr (kept part).
        output_dropped: Bytes dropped by the output cap.
        output: The first bytes of stdout and stderr (interleaved), for diagnosis.
        skipped_lines: Reply lines the judge skipped (unreadable, or not answering the call
            in progress: code writing to the pipe itself).
    """

    solution: str | None = None
    tests: list[dict[str, Any]] = field(default_factory=list)
    ended: str = ""
    reason: str | None = None
    error: str | None = None
    seconds: float = 0.0
    isolation: tuple[str, ...] = ()
    denials: list[str] = field(default_factory=list)
    output_bytes: int = 0
    output_dropped: int = 0
    output: str = ""
    skipped_lines: int = 0


def live_sandbox_processes(parent: int | None = None) -> list[int]:
    """Pids of live processes started by the sandboxes of process ``parent`` (default: this one).

    Found through the ``CREDITLAB_SANDBOX=<parent pid>-<run>`` marker in their environment, so
    escaped processes and those in other PID namespaces count too (reading another user's
    ``/proc/<pid>/environ`` needs root or the same uid). Linux only; ``[]`` without ``/proc``.
    """
    marker = f"CREDITLAB_SANDBOX={parent or os.getpid()}-".encode()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def signame(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group and the child; reap it within a bounded time."""
    for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            target()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("code sandbox: process %d did not die within 5 s of SIGKILL", proc.pid)
        _UNREAPED.append(proc)
    for old in list(_UNREAPED):
        if old.poll() is not None:
            _UNREAPED.remove(old)


def head(path: str, size: int) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode("utf-8", "replace")
    except OSError:
        return ""


def from_report(raw: bytes, ended: str, n_tests: int) -> SandboxResult:
    """Turn the judge's report (``marshal`` data from a trusted process) and how the child
    ended into a result.

    ``ended`` comes from the parent (the child's exit status, or ``wall timeout`` when the
    judge did not report in time); the supervisor's exit line in the report, when present,
    says how the worker inside the PID namespace ended and takes precedence.
    """
    result = SandboxResult(ended=ended)
    try:
        report = marshal.loads(raw) if raw else None
    except (ValueError, EOFError, TypeError):  # a judge killed while writing
        report = None
    if not isinstance(report, dict):
        report = {}
    exit = report.get("exit") or {}
    if "signal" in exit:
        result.ended = f"signal {signame(int(exit['signal']))}"
    elif "code" in exit and ended != "wall timeout":
        result.ended = f"exit {exit['code']}"
    if report.get("closed") == "report flood":
        result.ended = "report flood"
    result.isolation = tuple(str(x) for x in report.get("isolation") or ())
    result.solution = report.get("solution")
    result.error = report.get("error")
    result.output_bytes = int(report.get("output_bytes") or 0)
    result.output_dropped = int(report.get("output_dropped") or 0)
    result.denials = [str(d) for d in report.get("denials") or ()][:20]
    result.skipped_lines = int(report.get("skipped_lines") or 0)
    result.reason = end_reason(result.ended)
    tests = report.get("tests")
    if result.solution not in (None, "ok"):
        why = f"solution failed ({result.solution}): {result.error}"
        result.tests = [{"outcome": result.solution, "error": why} for _ in range(n_tests)]
    elif isinstance(tests, list) and len(tests) == n_tests:
        result.tests = tests
    else:
        if result.solution is None and result.error is None:
            result.error = f"the sandbox ended while defining the solution ({result.ended})"
        outcome = result.reason or "crashed"
        result.tests = [{"outcome": outcome, "error": f"the sandbox ended before this test "
                                                      f"({result.ended})"}
                        for _ in range(n_tests)]
    return result


def end_reason(ended: str) -> str | None:
    """Why a run ended early, from how it ended; ``None`` for a normal exit."""
    if ended in ("exit 0", ""):
        return None
    if ended == "wall timeout" or ended == "signal SIGXCPU":
        return "timeout"
    if ended in ("signal SIGKILL", "report flood"):
        return "killed"
    return "crashed"
