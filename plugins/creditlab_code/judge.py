"""The judge: runs a problem's tests against the sandboxed function, in its own process.

The tests (trusted task data) run here, never in the sandbox. Each test is Python statements in
which the entry point is a proxy: calling it sends the arguments to the sandboxed child
(:func:`creditlab_code.harness.serve`) and returns the value that comes back, rebuilt by
:func:`creditlab_code.codec.decode` as plain built-in data -- so ``==``, ``is True`` and float
comparisons are the built-in ones, with expected values the child never saw. A call that raised
in the child raises here: the same built-in exception type (so a test can expect
``ValueError``), or :class:`SolutionError`; a call that timed out, ran out of memory or was
denied raises :class:`CallAborted`, which ``except Exception`` in a test does not catch.

Every reply must echo its request's fresh random token; other lines (code writing to the pipe
itself, garbage) are skipped and counted. The judge never waits past a call's limit
(``test_timeout_s`` + 1 s) or the run's deadline, and reports once, as ``marshal`` data on
stdout (read by the parent, which trusts this process).
Program: :mod:`creditlab_code.codec` and this file run as one (``python -I -S -c``); arguments:
the request pipe, the reply pipe and the run's folder (``judge.bin``: tests, entry point, limits).
Standard library only.
"""

import _json  # the C scanner alone: the ``json`` package imports ``re`` (~11 ms per run here)
import builtins
import marshal
import os
import resource
import select
import sys
import time

try:  # the parent imports this as a module; the judge process runs it after codec.py
    from creditlab_code.codec import decode
except ImportError:
    pass

#: Most reply bytes read per run; a flood beyond it ends the run (``report flood``).
MAX_REPLY_BYTES = 8 << 20
GRACE_S = 1.0
MAX_ERROR = 300


class _Strict:
    """Settings of the C JSON scanner: plain ``dict``/``float``/``int``; NaN and Infinity
    refused (non-finite floats travel tagged, see :mod:`creditlab_code.codec`)."""

    strict, object_hook, object_pairs_hook = True, None, None
    parse_float, parse_int = float, int

    def __init__(self):
        self.memo = {}

    @staticmethod
    def parse_constant(name):
        raise ValueError(f"{name} is not JSON")


_SCAN = _json.make_scanner(_Strict())


def parse(raw):
    """The JSON value of one whole line of bytes; ``ValueError`` if it is anything else."""
    text = raw.decode("utf-8").strip()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("trailing data")
    return value


class SolutionError(Exception):
    """The solution raised an exception that is not a built-in type (its name is in the text)."""


class CallAborted(BaseException):
    """A call timed out, ran out of memory, was denied, or the child is gone."""

    def __init__(self, outcome, message):
        super().__init__(message)
        self.outcome = outcome


def short(text):
    text = str(text)
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


class Replies:
    """Lines from the child, read with ``poll`` against deadlines; never blocks past one."""

    def __init__(self, fd):
        self.fd, self.buffer, self.total, self.skipped = fd, b"", 0, 0
        self.closed = None  # why no more lines will come
        self.exit = None  # the supervisor's report of how the child ended
        os.set_blocking(fd, False)
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)

    def line(self, deadline):
        """The next parsed JSON object, or ``None`` (deadline passed, or the pipe closed)."""
        while True:
            cut = self.buffer.find(b"\n")
            if cut >= 0:
                raw, self.buffer = self.buffer[:cut], self.buffer[cut + 1:]
                try:
                    message = parse(raw)
                except (ValueError, RecursionError):
                    message = None
                if type(message) is not dict:
                    self.skipped += 1
                    continue
                if message.get("ev") == "exit":
                    self.exit = message
                    continue
                return message
            if self.closed:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.poller.poll(max(1, int(remaining * 1000))):
                if time.monotonic() >= deadline:
                    return None
                continue
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self.closed = "closed"
                continue
            self.total += len(chunk)
            if self.total > MAX_REPLY_BYTES:
                self.closed, self.buffer = "report flood", b""
                return None
            self.buffer += chunk

    def event(self, name, deadline):
        """The next message with ``ev == name`` (setup errors end the wait too)."""
        while True:
            message = self.line(deadline)
            if message is None or message.get("ev") in (name, "setup_error"):
                return message
            self.skipped += 1


class Child:
    """The sandboxed function, called through the pipes."""

    def __init__(self, requests, replies, limits, deadline):
        self.requests, self.replies, self.deadline = requests, replies, deadline
        self.call_s = float(limits["test_timeout_s"]) + GRACE_S
        self.gone = None  # (outcome, message) once the child cannot answer any more

    def call(self, *args, **kwargs):
        if self.gone:
            raise CallAborted(*self.gone)
        token = os.urandom(12).hex()
        try:
            body = marshal.dumps((token, args, kwargs))
        except ValueError as exc:
            raise TypeError(f"a test argument cannot be sent to the sandbox: {exc}") from None
        try:
            data = len(body).to_bytes(4, "little") + body
            while data:
                data = data[os.write(self.requests, data):]
        except OSError:
            self.gone = ("crashed", "the sandbox ended before answering")
            raise CallAborted(*self.gone) from None
        deadline = min(self.deadline, time.monotonic() + self.call_s)
        while True:
            reply = self.replies.line(deadline)
            if reply is None:
                if self.replies.closed == "report flood":
                    self.gone = ("killed", "the sandbox wrote more than the reply limit")
                elif self.replies.closed:
                    self.gone = self.ended()
                else:
                    self.gone = ("timeout", "the call did not return within the time limit")
                raise CallAborted(*self.gone)
            if reply.get("k") == token:
                break
            self.replies.skipped += 1
        if "r" in reply:
            try:
                return decode(reply["r"])
            except (ValueError, TypeError, RecursionError) as exc:
                raise SolutionError(f"the returned value could not be read: {exc}") from None
        outcome, name, text = reply.get("e"), str(reply.get("x")), short(reply.get("m"))
        if outcome != "error":
            raise CallAborted(outcome if outcome in ("timeout", "memory", "denied") else "error",
                              text)
        kind = getattr(builtins, name, None)
        if isinstance(kind, type) and issubclass(kind, Exception) and kind is not SolutionError:
            try:
                error = kind(text)
            except Exception:  # noqa: BLE001 - a built-in with other required arguments
                error = SolutionError(text)
        else:
            error = SolutionError(text)
        error.outcome = "error"
        raise error

    def ended(self):
        exit = self.replies.exit or {}
        if "signal" in exit:
            how = {9: "killed", 24: "timeout"}.get(exit["signal"], "crashed")
            return how, f"the sandbox was ended by signal {exit['signal']}"
        return "crashed", "the sandbox ended before answering"


def describe(exc):
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        text = ""
    return short(f"{name}: {text}" if text else name)


def judge(payload, child):
    """Per-test ``{"outcome", "error"?}`` for every test; stops calling once the child is gone."""
    results = []
    for index, source in enumerate(payload["tests"]):
        if child.gone:
            results.append({"outcome": "not_run",
                            "error": f"the sandbox ended before this test ({child.gone[1]})"})
            continue
        namespace = {"__name__": "__test__", payload["entry_point"]: child.call}
        try:
            exec(compile(source, f"<test {index + 1}>", "exec"), namespace)
        except CallAborted as exc:
            results.append({"outcome": exc.outcome, "error": short(exc.args[0])})
        except AssertionError as exc:
            results.append({"outcome": "failed", "error": describe(exc)})
        except Exception as exc:  # noqa: BLE001 - a test that raised is a failed test
            results.append({"outcome": getattr(exc, "outcome", "error"), "error": describe(exc)})
        else:
            results.append({"outcome": "passed"})
    return results


def main():
    requests, replies_fd, base = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    with open(os.path.join(base, "judge.bin"), "rb") as f:
        payload = marshal.loads(f.read())
    deadline = time.monotonic() + float(payload["timeout_s"])
    resource.setrlimit(resource.RLIMIT_AS, (payload["memory_bytes"],) * 2)
    replies = Replies(replies_fd)
    report = {"tests": None}
    ready = replies.event("ready", deadline)
    if ready is None or ready.get("ev") == "setup_error":
        report["error"] = ("sandbox set-up failed: " + str(ready.get("error"))) if ready else None
    else:
        report["isolation"] = [str(x) for x in ready.get("isolation", ())]
        solution = replies.event("solution", deadline)
        if solution is not None and solution.get("ev") == "solution":
            report["solution"] = str(solution.get("outcome"))
            report["error"] = solution.get("error")
            if report["solution"] == "ok":
                child = Child(requests, replies, payload["limits"], deadline)
                report["tests"] = judge(payload, child)
    os.close(requests)  # the child's serve loop ends; it reports its output and exits
    done = replies.event("done", min(deadline, time.monotonic() + GRACE_S))
    if done is not None and done.get("ev") == "done":
        report["output_bytes"] = done.get("output_bytes")
        report["output_dropped"] = done.get("output_dropped")
        report["denials"] = done.get("denials")
    replies.line(min(deadline, time.monotonic() + 0.2))  # the supervisor's exit line, if any
    report["exit"] = replies.exit
    report["closed"] = replies.closed
    report["skipped_lines"] = replies.skipped
    data = marshal.dumps(report)
    while data:
        data = data[os.write(1, data):]
    os._exit(0)


if __name__ == "__main__":
    main()
