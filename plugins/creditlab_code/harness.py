"""The sandbox harness: runs model-written code and its tests inside the sandboxed child.

The child's program is three files run as one (in this order, in one namespace):
:mod:`creditlab_code.child_setup` (namespace root, limits, privileges),
:mod:`creditlab_code.child_guard` (the audit hook) and this file (reporting, running the code,
``main``). The parent passes that program with ``python -I -S -c`` -- or, when the child runs
the parent's Python version, a small bootstrap loading its precompiled code object from the
run's folder -- so the sandbox needs no read access to creditlab's files. Arguments: the number
of the pipe to report on and the run's private folder. Standard library only. Start-up matters
(one process per completion), so it avoids modules that import ``re``/``enum`` (``json``,
``signal``): the payload is ``marshal`` data and reports are JSON written by :func:`encode`.

Order of events in the child (see ``docs/code-tasks.md``):

1. Read ``<base>/payload.bin`` (``marshal``: code, tests, limits, isolation plan) while still
   privileged.
2. With ``layout`` (namespace mode, run as root of fresh mount/PID/network namespaces): build a
   minimal read-only root on a tmpfs -- the interpreter's prefix, ``/usr`` and the library
   folders bound read-only and ``nosuid``, ``/dev/null``-like devices, and the work folder as
   its own size-limited tmpfs -- and ``pivot_root`` into it, detaching the old root (nothing
   outside is reachable any more). As PID 1 of its namespace it forks the worker and reports how it ended.
3. Resource limits (``setrlimit``: CPU, address space, file size, processes, open files, core).
4. Drop privileges: to the sandbox uid/gid (``setgroups([])``), or, as root of a user namespace,
   drop every capability; ``PR_SET_NO_NEW_PRIVS`` either way.
5. Cap ``sys.stdout``/``sys.stderr``; install the audit hook (defence in depth, not a boundary).
6. Run the solution, then each test, each under a soft per-test alarm; stream one JSON line per
   result to the pipe. Exit with ``os._exit`` (no user ``atexit`` handlers).
"""


import _signal as signal  # the C module: ``signal`` would import enum (milliseconds per run)
import marshal
import os
import sys

try:  # the parent (tests, linters) imports the parts as modules; the child runs them as one
    from creditlab_code.child_guard import Denied, make_hook, short
    from creditlab_code.child_setup import build_root, drop_privileges, set_limits, supervise
except ImportError:  # the child: parts 1 and 2 already defined these names
    pass


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException so ``except Exception`` does not eat it)."""


def quote(text):
    """``text`` as a JSON string literal (ASCII only; control characters and quotes escaped)."""
    out = []
    for char in text:
        code = ord(char)
        if 32 <= code < 127 and char not in '"\\':
            out.append(char)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
        else:
            out.append("\\u%04x" % code)
    return '"' + "".join(out) + '"'


def encode(value):
    """JSON text of a report: dicts, lists, strings, ints, booleans and None."""
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(quote(str(k)) + ":" + encode(v) for k, v in value.items()) + "}"
    return quote(str(value))


class Reporter:
    """Writes one JSON object per line to the result pipe, tagged with the run's nonce."""

    def __init__(self, fd):
        self.fd, self.nonce = fd, None
        self.reserve = bytearray(1 << 20)  # given back if reporting runs out of memory

    def hide(self, nonce):
        """Move the pipe to a random high descriptor and remember the nonce (makes forging
        results harder for the code under test; not a guarantee)."""
        self.nonce = nonce
        target = 300 + int.from_bytes(os.urandom(2), "little") % 700
        os.dup2(self.fd, target, inheritable=False)
        os.close(self.fd)
        self.fd = target

    def send(self, **message):
        message["k"] = self.nonce
        try:
            data = (encode(message) + "\n").encode()
        except MemoryError:
            self.reserve = None
            data = (encode(message) + "\n").encode()
            try:
                self.reserve = bytearray(1 << 20)
            except MemoryError:
                pass
        while data:
            data = data[os.write(self.fd, data):]


class CappedStream:
    """A text stream keeping the first ``cap`` bytes (written to ``fd``) and counting the rest."""

    def __init__(self, fd, cap):
        self.fd, self.cap, self.written, self.dropped = fd, cap, 0, 0

    def write(self, text):
        data = str(text).encode("utf-8", "replace")
        room = max(0, self.cap - self.written)
        if room:
            os.write(self.fd, data[:room])
        self.written += min(room, len(data))
        self.dropped += max(0, len(data) - room)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def describe(exc):
    """``"Type: message"`` of an exception, even when its ``__str__`` misbehaves."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - user-defined __str__
        text = "<unprintable>"
    return short(f"{name}: {text}" if text else name)


def classify(exc, denials_before, denials):
    """(outcome, error message) of a failed solution or test."""
    message = describe(exc)
    if isinstance(exc, TestTimeout):
        return "timeout", "exceeded the per-test time limit"
    if isinstance(exc, Denied) or len(denials) > denials_before:
        return "denied", short(denials[-1] if denials[denials_before:] else message)
    if isinstance(exc, MemoryError):
        return "memory", message
    if isinstance(exc, AssertionError):
        return "failed", message
    return "error", message


def guarded(action, seconds):
    """Run ``action()`` under the per-test alarm; the exception it ended with, or ``None``.

    The alarm is disarmed in ``finally``; if it fires while an exception is being unwound, the
    ``TestTimeout`` replaces that exception and is caught here too, never by the harness.
    """
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, seconds)
            action()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:  # noqa: BLE001 - every failure is a reported outcome
        # Drop the tracebacks: their frames hold the code's data (e.g. the memory a memory
        # bomb allocated), and reporting needs a little memory of its own.
        seen, link = set(), exc
        while link is not None and id(link) not in seen:
            seen.add(id(link))
            link.__traceback__ = None
            link = link.__context__ or link.__cause__
        return exc
    return None


def run_code(payload, reporter, denials):
    def alarm(signum, frame):
        raise TestTimeout()

    signal.signal(signal.SIGALRM, alarm)
    timer = float(payload["limits"]["test_timeout_s"])
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(payload["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        reporter.send(event="solution", outcome="syntax_error",
                      error=short(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}{where}"))
        return
    before = len(denials)
    exc = guarded(lambda: exec(code, namespace), timer)
    if exc is not None:
        outcome, error = classify(exc, before, denials)
        reporter.send(event="solution", outcome=outcome, error=error)
        return
    entry = payload.get("entry_point")
    if entry and not callable(namespace.get(entry)):
        reporter.send(event="solution", outcome="error",
                      error=f"the code does not define a function named {entry!r}")
        return
    reporter.send(event="solution", outcome="ok")
    for index, test in enumerate(payload["tests"]):
        reporter.send(event="start", index=index)
        before = len(denials)
        try:
            compiled = compile(test, f"<test {index + 1}>", "exec")
        except (SyntaxError, ValueError) as error:
            exc = error
        else:
            exc = guarded(lambda code=compiled: exec(code, dict(namespace)), timer)
        if exc is None:
            reporter.send(event="test", index=index, outcome="passed")
        else:
            outcome, error = classify(exc, before, denials)
            reporter.send(event="test", index=index, outcome=outcome, error=error)


def main():
    reporter = Reporter(int(sys.argv[1]))
    base = sys.argv[2]
    try:
        with open(os.path.join(base, "payload.bin"), "rb") as f:
            payload = marshal.loads(f.read())
        reporter.hide(payload["nonce"])
        sys.argv[:] = ["-c"]
        plan = payload["isolation"]
        sys.dont_write_bytecode = True
        if plan.get("layout"):
            build_root(plan)
            if os.getpid() == 1:
                supervise(reporter)
        set_limits(payload["limits"])
        how = drop_privileges(plan)
        os.chdir(plan["work"])
        os.umask(0o077)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError instead
        cap = int(payload["limits"]["output_bytes"])
        sys.stdout, sys.stderr = CappedStream(1, cap), CappedStream(2, cap)
        denials = []
        if payload.get("audit", True):
            sys.addaudithook(make_hook(plan["work"], plan["readable"], denials))
            how.append("audit hook")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        reporter.send(event="setup_error", error=short(f"{type(exc).__name__}: {exc}"))
        os._exit(3)
    reporter.send(event="ready", uid=os.getuid(), pid=os.getpid(), isolation=how)
    run_code(payload, reporter, denials)
    reporter.send(event="done", output_bytes=sys.stdout.written + sys.stderr.written,
                  output_dropped=sys.stdout.dropped + sys.stderr.dropped, denials=denials[:20])
    os._exit(0)


if __name__ == "__main__":
    main()
