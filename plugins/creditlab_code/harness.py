"""The sandbox harness: runs model-written code and its tests inside the sandboxed child.

This file is the child's whole program: the parent passes its source with ``python -I -S -c``
(so the sandbox needs no read access to creditlab's files) and two arguments, the number of the
pipe it reports on and the run's private folder (or, when the child runs the parent's Python
version, a small bootstrap that loads this file's code object from that folder). Standard
library only; it never imports creditlab. Start-up matters (one process per completion), so it
avoids modules that import ``re``/``enum`` (``json``, ``signal``): the payload is ``marshal``
data and reports are JSON written by :func:`encode`.

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
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MS_REC, MS_PRIVATE, MNT_DETACH = 16384, 1 << 18, 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
#: pivot_root system call numbers per machine (no glibc wrapper exists).
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
#: Audit events denied outright (prefix match).
DENY_PREFIXES = (
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "subprocess.", "pty.", "socket.", "ctypes.", "signal.pthread_kill",
    "resource.setrlimit", "resource.prlimit", "sys.addaudithook", "webbrowser.", "urllib.",
    "http.client.", "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.",
    "winreg.", "_winapi.",
)
#: Events whose first argument is a path that may only be inside the work folder.
WRITE_PATH_EVENTS = (
    "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
    "os.chflags", "os.lchflags", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.chown",
    "os.setxattr", "os.removexattr",
)
#: Events with two paths (source and destination) that must both be inside the work folder.
TWO_PATH_EVENTS = ("os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree",
                   "shutil.move")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MAX_MESSAGE = 300
#: Device files that may be opened for reading and writing.
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


class Denied(PermissionError):
    """Raised by the audit hook for a denied operation."""


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException so ``except Exception`` does not eat it)."""


def short(text):
    text = str(text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


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


# -- namespace mode: a minimal read-only root -------------------------------------------------
def _libc():
    import ctypes

    return ctypes, ctypes.CDLL(None, use_errno=True)


def _call(ctypes, result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def build_root(plan):
    """Mount a tmpfs root holding read-only binds of ``plan["binds"]`` and the work folder
    (read-write), then pivot into it and detach the old root."""
    ctypes, libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]

    def mount(src, dst, fstype, flags, data=None):
        enc = (lambda s: None if s is None else s.encode())
        _call(ctypes, libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)),
              f"mount {src} on {dst}")

    new = plan["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")

    def bind(src, writable=False, devices=False):
        dst = new + src
        if os.path.islink(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.lexists(dst):
                os.symlink(os.readlink(src), dst)
            return
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        elif os.path.exists(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            open(dst, "a").close()
        else:
            return
        mount(src, dst, None, MS_BIND)
        flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if devices else MS_NODEV)
        mount(None, dst, None, flags | (0 if writable else MS_RDONLY))

    for path in plan["binds"]:
        bind(path)
    for path in plan["devices"]:
        bind(path, writable=True, devices=True)
    work = new + plan["work"]  # a fresh size-limited tmpfs, not the host folder: writes stay
    os.makedirs(work, exist_ok=True)  # in memory, bounded, and vanish with the namespace
    owner = plan.get("uid") if plan.get("uid") is not None else os.getuid()
    group = plan.get("gid") if plan.get("gid") is not None else os.getgid()
    size = max(1, int(plan["disk_bytes"]) >> 10)
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={size}k,nr_inodes=4096,mode=700,uid={owner},gid={group}")
    mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: unknown system call number on {os.uname().machine}")
    os.chdir(new)
    _call(ctypes, libc.syscall(number, b".", b"."), "pivot_root")
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    _call(ctypes, libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")


def supervise(reporter):
    """As PID 1 of a PID namespace: fork the worker, report how it ended, exit.

    Returns only in the worker. When this process exits, the kernel kills every process left in
    the namespace.
    """
    pid = os.fork()
    if pid == 0:
        return
    for fd in (0, 1, 2):
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        reporter.send(event="exit", signal=os.WTERMSIG(status))
    else:
        reporter.send(event="exit", code=os.WEXITSTATUS(status))
    os._exit(0)


def set_limits(limits):
    cpu = max(1, int(limits["cpu_s"]))
    pairs = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: (limits["memory_bytes"],) * 2,
        resource.RLIMIT_FSIZE: (limits["file_size_bytes"],) * 2,
        resource.RLIMIT_NOFILE: (limits["open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if limits["processes"] is not None:
        pairs[resource.RLIMIT_NPROC] = (limits["processes"],) * 2
    for key, value in pairs.items():
        resource.setrlimit(key, value)


def drop_privileges(plan):
    """To ``plan["uid"]``/``["gid"]``, or (root of a user namespace) to no capabilities."""
    how = []
    try:
        ctypes, libc = _libc()
    except (ImportError, OSError):
        ctypes = libc = None
    if plan.get("uid") is None and plan.get("drop_caps") and libc is not None:
        last = plan.get("cap_last", 40)
        for cap in range(last + 1):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]

        _call(ctypes, libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
        how.append("capabilities dropped")
    if libc is not None:
        _call(ctypes, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        how.append("no_new_privs")
    if plan.get("uid") is not None:
        os.setgroups([])
        os.setgid(plan["gid"])
        os.setuid(plan["uid"])
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise OSError("privileges could be regained after setuid")
        how.append(f"uid {plan['uid']}")
    for name in ("ctypes", "_ctypes", "ctypes._endian"):
        sys.modules.pop(name, None)
    return how


# -- the audit hook ---------------------------------------------------------------------------
def make_hook(work, readable, denials):
    work = os.path.realpath(work)
    readable = tuple(os.path.realpath(p) for p in readable) + (work,)
    state = {"busy": False}

    def inside(path, roots):
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return False
        full = os.path.realpath(os.path.join(os.getcwd(), path))
        return any(full == r or full.startswith(r.rstrip("/") + "/") for r in roots)

    def deny(event, detail=""):
        denials.append(short(f"{event} {detail}".strip()))
        raise Denied(f"sandbox: {event} denied {detail}".strip())

    def hook(event, args):
        if state["busy"]:
            return
        state["busy"] = True
        try:
            if event.startswith(DENY_PREFIXES):
                deny(event)
            if event == "open":
                path, mode, flags = (tuple(args) + (None, None, None))[:3]
                if isinstance(path, int):
                    if path > 2:
                        deny(event, f"file descriptor {path}")
                    return
                writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                    isinstance(flags, int) and flags & WRITE_FLAGS)
                if path in DEVICES:
                    return
                if not inside(path, (work,) if writing else readable):
                    deny(event, f"{'writing' if writing else 'reading'} {path!r}")
            elif event in WRITE_PATH_EVENTS:
                if args and not isinstance(args[0], int) and not inside(args[0], (work,)):
                    deny(event, repr(args[0]))
            elif event in TWO_PATH_EVENTS:
                for path in args[:2]:
                    if not isinstance(path, int) and not inside(path, (work,)):
                        deny(event, repr(path))
            elif event in ("os.listdir", "os.scandir"):
                if args and isinstance(args[0], (str, bytes)) and not inside(args[0], readable):
                    deny(event, repr(args[0]))
        finally:
            state["busy"] = False

    return hook


# -- running the code -------------------------------------------------------------------------
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
            exc = guarded(lambda: exec(compiled, dict(namespace)), timer)
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
