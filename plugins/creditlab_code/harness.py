"""The sandbox harness: defines model-written code and answers calls of its function.

The child's program is four files run as one (in this order, in one namespace):
:mod:`creditlab_code.child_setup` (namespace root, cgroups, limits, privileges, seccomp),
:mod:`creditlab_code.child_guard` (the audit hook), :mod:`creditlab_code.codec` (return values
as JSON) and this file. The parent passes that program with ``python -I -S -c`` -- or, when the
child runs the parent's Python version, a small bootstrap loading its precompiled code object
from the run's folder -- so the sandbox needs no read access to creditlab's files. Arguments:
the reply pipe, the request pipe and the run's private folder. Standard library only. Start-up
matters (one process per completion), so it avoids modules that import ``re``/``enum``
(``json``, ``signal``).

The child never sees a test or an expected value: the tests run in the judge
(:mod:`creditlab_code.judge`, another process), which sends each call's arguments here and
compares the value that comes back. Whatever the model's code does to this process -- patch
builtins, rewrite these functions through frames or ``gc``, write to the pipe itself -- can only
change the values its function appears to return.

Order of events in the child (see ``docs/code-tasks.md``):

1. Read ``<base>/payload.bin`` (``marshal``: code, entry point, limits, isolation plan) while
   still privileged; join the run's cgroups when the plan has them.
2. With ``layout`` (namespace mode: fresh mount, PID, network, IPC, UTS and cgroup namespaces):
   build a minimal read-only root on a tmpfs -- the interpreter's prefix, ``/usr`` and the
   library folders bound read-only and ``nosuid``, ``/dev/null``-like devices, and the work
   folder as its own size-limited tmpfs -- and ``pivot_root`` into it, detaching the old root.
   As PID 1 of its namespace it forks the worker and reports how it ended.
3. Resource limits (``setrlimit``: CPU, address space, file size, processes, open files, core).
4. Drop privileges: to the sandbox uid/gid (``setgroups([])``), or, as root of a user namespace,
   drop every capability; ``PR_SET_NO_NEW_PRIVS`` either way; then the seccomp filter.
5. Cap ``sys.stdout``/``sys.stderr``; install the audit hook (defence in depth, not a boundary).
6. Define the solution, then answer calls (:func:`serve`), each under a soft per-call alarm.
   Exit with ``os._exit`` (no user ``atexit`` handlers).
"""


import _signal as signal  # the C module: ``signal`` would import enum (milliseconds per run)
import marshal
import os
import sys

try:  # the parent (tests, linters) imports the parts as modules; the child runs them as one
    from creditlab_code.child_guard import Denied, make_hook, short
    from creditlab_code.child_setup import (build_root, drop_privileges, forget_ctypes,
                                            install_seccomp, join_cgroups, set_limits,
                                            supervise)
    from creditlab_code.codec import ValueSendError, encode, quote
except ImportError:  # the child: parts 1 and 2 already defined these names
    pass


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException so ``except Exception`` does not eat it)."""


def message(**fields):
    """One report line: a JSON object of strings, ints, booleans, None and lists of those."""
    def plain(value):
        if isinstance(value, (list, tuple)):
            return "[" + ",".join(plain(v) for v in value) + "]"
        if value is None or value is True or value is False or type(value) is int:
            return encode(value)
        return quote(str(value))

    return "{" + ",".join(quote(k) + ":" + plain(v) for k, v in fields.items()) + "}"


class Reporter:
    """Writes one JSON object per line to the reply pipe."""

    def __init__(self, fd):
        self.fd = fd
        self.reserve = bytearray(1 << 20)  # given back if reporting runs out of memory

    def hide(self):
        """Move the pipe to a random high descriptor (code that writes to every low descriptor
        only garbles its own answers; the judge skips lines it cannot read)."""
        target = 300 + int.from_bytes(os.urandom(2), "little") % 700
        os.dup2(self.fd, target, inheritable=False)
        os.close(self.fd)
        self.fd = target

    def write(self, line):
        try:
            data = (line + "\n").encode()
        except MemoryError:
            self.reserve = None
            data = (line + "\n").encode()
            try:
                self.reserve = bytearray(1 << 20)
            except MemoryError:
                pass
        while data:
            data = data[os.write(self.fd, data):]

    def send(self, **fields):
        self.write(message(**fields))


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


def read_exact(fd, size):
    """``size`` bytes from ``fd``, or ``b""`` at end of file."""
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            return b""
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def define(payload, reporter, denials, timer):
    """Run the solution's code; its entry-point function, or ``None`` (the failure reported)."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        code = compile(payload["code"], "<solution>", "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        reporter.send(ev="solution", outcome="syntax_error",
                      error=short(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}{where}"))
        return None
    before = len(denials)
    exc = guarded(lambda: exec(code, namespace), timer)
    if exc is not None:
        outcome, error = classify(exc, before, denials)
        reporter.send(ev="solution", outcome=outcome, error=error)
        return None
    entry = payload["entry_point"]
    function = namespace.get(entry)
    if not callable(function):
        reporter.send(ev="solution", outcome="error",
                      error=f"the code does not define a function named {entry!r}")
        return None
    reporter.send(ev="solution", outcome="ok")
    return function


def serve(function, requests, reporter, denials, timer):
    """Answer call requests until the judge closes the pipe.

    A request is a 4-byte little-endian length and ``marshal`` data ``(token, args, kwargs)``
    (written by the judge, never by model code). The reply echoes the token with the encoded
    return value (``r``) or how the call failed (``e`` outcome, ``x`` exception type, ``m``
    message). The call and the encoding of its value run under the per-call alarm.
    """
    while True:
        header = read_exact(requests, 4)
        if not header:
            return
        token, args, kwargs = marshal.loads(read_exact(requests, int.from_bytes(header, "little")))
        box = []
        before = len(denials)
        exc = guarded(lambda: box.append(encode(function(*args, **kwargs))), timer)
        if exc is None:
            reporter.write('{"k":' + quote(token) + ',"r":' + box.pop() + "}")
        else:
            del box[:]
            if isinstance(exc, ValueSendError):
                outcome, error = "error", describe(exc)
            else:
                outcome, error = classify(exc, before, denials)
            reporter.send(k=token, e=outcome, x=type(exc).__name__, m=error)


def main():
    reporter = Reporter(int(sys.argv[1]))
    requests, base = int(sys.argv[2]), sys.argv[3]
    try:
        with open(os.path.join(base, "payload.bin"), "rb") as f:
            payload = marshal.loads(f.read())
        reporter.hide()
        sys.argv[:] = ["-c"]
        plan = payload["isolation"]
        sys.dont_write_bytecode = True
        layers = []
        if plan.get("cgroups"):
            join_cgroups(plan["cgroups"])
            layers.append("cgroups")
        if plan.get("layout"):
            build_root(plan)
            layers.append("namespaces")
            if os.getpid() == 1:
                supervise(reporter)
        set_limits(payload["limits"])
        how = layers + drop_privileges(plan)
        if plan.get("seccomp"):
            how.append(install_seccomp(payload["limits"]["processes"] == 1))
        forget_ctypes()
        os.chdir(plan["work"])
        os.umask(0o077)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes raise OSError instead
        cap = int(payload["limits"]["output_bytes"])
        sys.stdout, sys.stderr = CappedStream(1, cap), CappedStream(2, cap)
        denials = []
        if payload.get("audit", True):
            sys.addaudithook(make_hook(plan["work"], plan["readable"], denials))
            how.append("audit hook")
    except BaseException as exc:  # noqa: BLE001 - reported to the judge
        reporter.send(ev="setup_error", error=short(f"{type(exc).__name__}: {exc}"))
        os._exit(3)
    reporter.send(ev="ready", uid=os.getuid(), isolation=how)

    def alarm(signum, frame):
        raise TestTimeout()

    signal.signal(signal.SIGALRM, alarm)
    timer = float(payload["limits"]["test_timeout_s"])
    function = define(payload, reporter, denials, timer)
    if function is not None:
        serve(function, requests, reporter, denials, timer)
    reporter.send(ev="done", output_bytes=sys.stdout.written + sys.stderr.written,
                  output_dropped=sys.stdout.dropped + sys.stderr.dropped, denials=denials[:20])
    os._exit(0)


if __name__ == "__main__":
    main()
