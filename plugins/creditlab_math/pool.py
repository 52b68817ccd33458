"""A small persistent process pool with a hard per-item wall-clock timeout.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill one hung task (a timed-out
future keeps its worker busy forever, and killing a worker breaks the whole executor). Here each
worker is a fresh interpreter (``subprocess``, POSIX) with its own socket; the parent sends one
item at a time, waits on every socket with ``multiprocessing.connection.wait``, and when an item
overruns its deadline the parent SIGKILLs that worker, records the item as a timeout and starts a
replacement. The parent never uses signals, so it works from any thread and never touches an
outer ``SIGALRM`` (e.g. pytest-timeout's).

Workers are started with ``python -c`` rather than ``multiprocessing``'s spawn/forkserver because
those re-import the parent's ``__main__`` in every worker: with a training script as ``__main__``
that costs a torch import (seconds) per worker and per replacement, and it breaks scripts without
an ``if __name__ == "__main__"`` guard. A worker imports only the target's module and what the
initializer needs (the parent's ``sys.path`` is passed along).

Workers call a module-level function named ``"module:function"``, looked up at call time, so a
worker initializer may replace it (how tests inject a hanging verification).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

_STOP = None  # message asking a worker to exit


@dataclass(frozen=True)
class ItemResult:
    """What happened to one item.

    Attributes:
        status: ``"ok"`` (``value`` holds the function's return value), ``"timeout"`` (the item
            overran the deadline and its worker was killed) or ``"error"`` (the function raised,
            or the worker died; ``error`` says which).
        value: The function's return value when ``status == "ok"``.
        error: A message for ``"timeout"`` and ``"error"``.
        seconds: Wall time from dispatch to result.
    """

    status: str
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def worker_main(fd: int) -> None:
    """Worker entry point (``python -c`` in a fresh interpreter): serve the parent on ``fd``.

    The first message is the parent's ``sys.path``, the second ``(target, initializer,
    initargs)`` (unpickled once the path is in place); the worker announces readiness, then
    answers ``(index, args)`` messages until told to stop or the parent is gone.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    conn = Connection(fd)
    try:
        sys.path[:] = conn.recv()
        target, initializer, initargs = conn.recv()
        importlib.import_module(target.partition(":")[0])
        if initializer is not None:
            initializer(*initargs)
        _resolve(target)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        if message is _STOP:
            return
        index, args = message
        try:
            value = _resolve(target)(*args)  # looked up per call: an initializer may patch it
        except Exception as exc:  # noqa: BLE001 - reported as this item's error
            conn.send((index, "error", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send((index, "ok", value))


# Where this package lives, so a worker finds it even if the parent extended sys.path at runtime.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOT = (
    f"import sys; sys.path.insert(0, {_ROOT!r}); "
    "from creditlab_math.pool import worker_main; worker_main(int(sys.argv[1]))"
)


class _Worker:
    """One worker process, its socket, and the item it is working on."""

    def __init__(self, target: str, initializer: Callable | None, initargs: tuple) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()  # so a dead worker shows up as EOF on our end
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send((target, initializer, initargs))
        self.started = time.monotonic()
        self.ready = False
        self.item: int | None = None
        self.deadline = 0.0
        self.dispatched = 0.0

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()


class ProcessWorkerPool:
    """Persistent worker processes that run ``target(*args)`` with a hard per-item timeout.

    Workers start lazily (on the first :meth:`map`) and are replaced when one is killed or dies.
    :meth:`map` is thread-safe (calls are serialized) and can be called from any thread.

    Args:
        target: ``"module:function"`` the workers call; must be importable in a fresh process.
        workers: Number of worker processes.
        timeout_s: Wall-clock limit per item, measured from dispatch to an already-started worker
            (start-up time is not charged to items).
        initializer: Optional picklable callable (importable by name) run once in each worker
            before it serves items.
        initargs: Arguments for ``initializer``.
        startup_timeout_s: How long a worker may take to import and initialize.
    """

    def __init__(
        self,
        target: str,
        workers: int = 2,
        timeout_s: float = 5.0,
        initializer: Callable | None = None,
        initargs: tuple = (),
        startup_timeout_s: float = 120.0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.target = target
        self.num_workers = workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = startup_timeout_s
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._owner_pid = os.getpid()  # a forked copy of the pool must not stop our workers
        #: Workers killed (timeouts) or found dead and replaced, since construction.
        self.restarts = 0

    # -- public -----------------------------------------------------------------------------
    def map(self, items: Sequence[tuple]) -> list[ItemResult]:
        """Run ``target(*args)`` for every ``args`` in ``items``; results in input order.

        Raises:
            RuntimeError: If the pool is closed, or a worker cannot start (import or initializer
                error, or no readiness within ``startup_timeout_s``).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("the verifier's worker pool is closed")
            if os.getpid() != self._owner_pid:
                raise RuntimeError(
                    "this worker pool belongs to another process (it was forked); build the "
                    "verifier in the process that uses it"
                )
            try:
                return self._run(list(items))
            except BaseException:
                self._shutdown()  # leave no worker in an unknown state
                raise

    def close(self) -> None:
        """Stop every worker (politely, then by force). Idempotent."""
        with self._lock:
            self._closed = True
            self._shutdown()

    # -- internals --------------------------------------------------------------------------
    def _shutdown(self) -> None:
        workers, self._workers = self._workers, []
        if os.getpid() != self._owner_pid:
            return
        for worker in workers:
            try:
                if worker.item is None:
                    worker.conn.send(_STOP)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 1.0
        for worker in workers:
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            worker.kill()

    def _spawn(self) -> _Worker:
        return _Worker(self.target, self._initializer, self._initargs)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self.restarts += 1

    def _run(self, items: list[tuple]) -> list[ItemResult]:
        results: list[ItemResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        while pending or any(w.item is not None for w in self._workers):
            while len(self._workers) < self.num_workers:
                self._workers.append(self._spawn())
            now = time.monotonic()
            for worker in self._workers:  # dispatch to idle, ready workers
                if worker.ready and worker.item is None and pending:
                    index = pending.popleft()
                    try:
                        worker.conn.send((index, items[index]))
                    except OSError:  # it just died: requeue; its EOF is handled below
                        pending.appendleft(index)
                        continue
                    worker.item, worker.dispatched = index, now
                    worker.deadline = now + self.timeout_s
            self._wait_and_collect(results)
        return [r if r is not None else ItemResult("error", error="lost result") for r in results]

    def _wait_and_collect(self, results: list[ItemResult | None]) -> None:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.item is not None]
        deadlines += [w.started + self.startup_timeout_s for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        by_conn = {w.conn: w for w in self._workers}
        for conn in wait(list(by_conn), timeout=timeout):  # a dead worker's socket reads EOF
            self._receive(by_conn[conn], results)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.item is not None and now >= worker.deadline:
                results[worker.item] = ItemResult(
                    "timeout",
                    error=f"verification exceeded {self.timeout_s:g} s; worker killed",
                    seconds=now - worker.dispatched,
                )
                self._replace(worker)
            elif not worker.ready and now >= worker.started + self.startup_timeout_s:
                raise RuntimeError(
                    f"a verifier worker ({self.target}) did not start within "
                    f"{self.startup_timeout_s:g} s"
                )

    def _receive(self, worker: _Worker, results: list[ItemResult | None]) -> None:
        try:
            while worker.conn.poll():
                self._handle(worker, worker.conn.recv(), results)
            return
        except (EOFError, OSError):
            pass
        # EOF: the worker died (crash, OOM kill, os._exit...).
        try:
            code = worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        if not worker.ready:
            self._replace(worker)
            raise RuntimeError(
                f"a verifier worker ({self.target}) died while starting (exit code {code})"
            )
        if worker.item is not None:
            results[worker.item] = ItemResult(
                "error",
                error=f"worker process died (exit code {code}) while verifying this item",
                seconds=time.monotonic() - worker.dispatched,
            )
        self._replace(worker)

    def _handle(self, worker: _Worker, message: tuple, results: list[ItemResult | None]) -> None:
        kind = message[0]
        if kind == "ready":
            worker.ready = True
        elif kind == "init_error":
            self._replace(worker)
            raise RuntimeError(
                f"a verifier worker ({self.target}) failed to initialize:\n{message[1]}"
            )
        else:
            index, status, payload = message
            if index == worker.item:
                seconds = time.monotonic() - worker.dispatched
                if status == "ok":
                    results[index] = ItemResult("ok", value=payload, seconds=seconds)
                else:
                    results[index] = ItemResult("error", error=payload, seconds=seconds)
                worker.item = None
