"""A small persistent process pool with a hard per-item wall-clock timeout.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill one hung task (a timed-out
future keeps its worker busy forever, and killing a worker breaks the whole executor). Here each
worker is a fresh interpreter (``subprocess``, POSIX) with its own socket; the parent sends items,
waits on every socket with one ``poll(2)``, and when an item overruns its deadline the parent
SIGKILLs that worker, records the item as a timeout and starts a replacement. The parent never
uses signals, so it works from any thread and never touches an outer ``SIGALRM`` (e.g.
pytest-timeout's).

Workers are started with ``python -c`` rather than ``multiprocessing``'s spawn/forkserver because
those re-import the parent's ``__main__`` in every worker: with a training script as ``__main__``
that costs a torch import (seconds) per worker and per replacement, and it breaks scripts without
an ``if __name__ == "__main__"`` guard. A worker imports only the target's module and what the
initializer needs (the parent's ``sys.path`` is passed along).

Workers call a module-level function named ``"module:function"``, looked up at call time, so a
worker initializer may replace it (how tests inject a hanging verification).

Cheap items can be pipelined (``pipeline`` > 0): while a worker runs one item, the parent
queues more on its socket (at most ``pipeline`` items and :data:`PIPELINE_BYTES` bytes, well under
the socket's buffer, so the parent never blocks writing to a busy worker), and the worker starts
the next as soon as it has sent its answer, without waiting for the parent, which reads the
answers that have arrived together. A batch of cheap items then costs about one round trip, not
one per item. An item's clock starts when its worker starts it: at dispatch to an idle worker,
else when the previous answer arrives (answers are never held back, so a hang is blamed on the
item that hangs). A killed or dead worker's queued items never started; they go back to the
queue. Queued items wait behind a slow one instead of going to an idle worker, so expensive
items are better not pipelined (``pipeline=0``: one item per worker at a time).
"""

from __future__ import annotations

import importlib
import math
import os
import pickle
import select
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
from multiprocessing.connection import Connection
from typing import Any

_STOP = None  # message asking a worker to exit
#: Items a pool for cheap checks queues on one worker's socket behind the one it is running.
PIPELINE_DEPTH = 64
#: Most bytes queued on one worker's socket behind the item it is running (a quarter of the
#: socket's send buffer if that is smaller), so queueing never blocks the parent.
PIPELINE_BYTES = 64 * 1024


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


def _readable(conns: Sequence[Connection], timeout: float | None) -> list[Connection]:
    """The connections with data (or EOF) to read, waiting up to ``timeout`` seconds (``None``:
    forever). One ``poll(2)`` call: ``multiprocessing.connection.wait`` builds a selector per
    call, which cost more than a cheap verification."""
    poller = select.poll()
    for conn in conns:
        poller.register(conn.fileno(), select.POLLIN)
    ms = None if timeout is None else math.ceil(timeout * 1000)
    ready = {fd for fd, _ in poller.poll(ms)}  # POLLHUP/POLLERR count: recv then reads EOF
    return [conn for conn in conns if conn.fileno() in ready]


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
    """One worker process, its socket, and the items sent to it and not yet answered."""

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
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * PIPELINE_BYTES)
        except OSError:
            pass
        self.pipeline_bytes = min(
            PIPELINE_BYTES, ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4
        )
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send((target, initializer, initargs))
        self.started = time.monotonic()
        self.ready = False
        #: ``(index, message bytes)`` of the items sent and not answered; the first is running.
        self.items: deque[tuple[int, int]] = deque()
        self.queued_bytes = 0  # message bytes of the items behind the running one
        self.deadline = 0.0
        self.dispatched = 0.0  # when the running item started

    def can_take(self, size: int, pipeline: int) -> bool:
        """Whether an item of ``size`` message bytes may be sent now: always when idle (the
        worker is reading), else within the pipeline limits."""
        return not self.items or (
            len(self.items) <= pipeline and self.queued_bytes + size <= self.pipeline_bytes
        )

    def start_next(self, now: float, timeout_s: float) -> None:
        """The first queued item starts now (its clock starts)."""
        if self.items:
            self.queued_bytes -= self.items[0][1]
            self.dispatched, self.deadline = now, now + timeout_s

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
        pipeline: Items queued on a busy worker behind the one it runs (0: one at a time; see
            the module's docstring).
    """

    def __init__(
        self,
        target: str,
        workers: int = 2,
        timeout_s: float = 5.0,
        initializer: Callable | None = None,
        initargs: tuple = (),
        startup_timeout_s: float = 120.0,
        pipeline: int = 0,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.target = target
        self.num_workers = workers
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = startup_timeout_s
        self.pipeline = pipeline
        self._initializer = initializer
        self._initargs = tuple(initargs)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pending: deque[int] = deque()  # items of the running map() not yet sent
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
                if not worker.items:
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
        """Kill ``worker`` (its running item was settled by the caller); its queued items,
        which never started, go back to the front of the queue in order."""
        worker.kill()
        self._workers.remove(worker)
        self.restarts += 1
        self._pending.extendleft(index for index, _ in reversed(list(worker.items)[1:]))
        worker.items.clear()

    def _run(self, items: list[tuple]) -> list[ItemResult]:
        results: list[ItemResult | None] = [None] * len(items)
        self._pending = pending = deque(range(len(items)))
        self._messages: dict[int, bytes] = {}
        while pending or any(w.items for w in self._workers):
            while len(self._workers) < self.num_workers:
                self._workers.append(self._spawn())
            self._dispatch(items, pending)
            self._wait_and_collect(results)
        return [r if r is not None else ItemResult("error", error="lost result") for r in results]

    def _dispatch(self, items: list[tuple], pending: deque[int]) -> None:
        """Hand out pending items in order, each to the least busy ready worker that can take
        it: an idle one, else one whose queue is within the pipeline limits."""
        skip: set[int] = set()  # workers found dead while sending
        while pending:
            index = pending[0]
            message = self._messages.get(index)
            if message is None:  # pickled once, kept until sent
                message = pickle.dumps((index, items[index]), protocol=pickle.HIGHEST_PROTOCOL)
                self._messages[index] = message
            takers = [
                w for w in self._workers
                if w.ready and id(w) not in skip and w.can_take(len(message), self.pipeline)
            ]
            if not takers:
                return
            worker = min(takers, key=lambda w: len(w.items))
            try:
                worker.conn.send_bytes(message)
            except OSError:  # it just died: its EOF is handled when collecting
                skip.add(id(worker))
                continue
            pending.popleft()
            del self._messages[index]
            idle = not worker.items
            worker.items.append((index, len(message)))
            worker.queued_bytes += len(message)
            if idle:
                worker.start_next(time.monotonic(), self.timeout_s)

    def _wait_and_collect(self, results: list[ItemResult | None]) -> None:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.items]
        deadlines += [w.started + self.startup_timeout_s for w in self._workers if not w.ready]
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        by_conn = {w.conn: w for w in self._workers}
        for conn in _readable(list(by_conn), timeout):  # a dead worker's socket reads EOF
            self._receive(by_conn[conn], results)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.items and now >= worker.deadline:
                results[worker.items[0][0]] = ItemResult(
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
            while True:  # called when readable: read every message that has arrived
                self._handle(worker, worker.conn.recv(), results)
                if worker not in self._workers or not _readable([worker.conn], 0):
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
        if worker.items:
            results[worker.items[0][0]] = ItemResult(
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
            if worker.items and index == worker.items[0][0]:
                now = time.monotonic()
                seconds = now - worker.dispatched
                if status == "ok":
                    results[index] = ItemResult("ok", value=payload, seconds=seconds)
                else:
                    results[index] = ItemResult("error", error=payload, seconds=seconds)
                worker.items.popleft()
                worker.start_next(now, self.timeout_s)
