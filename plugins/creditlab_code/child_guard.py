"""Sandbox child, part 2 of 3: the audit hook (defence in depth, not a security boundary).

It denies, inside the child's interpreter, what the kernel layers should already prevent:
processes, sockets, ``ctypes``, raising resource limits, and file writes (and reads) outside the
allowed folders. Python-level only: code that reaches the kernel without these events (a C
extension, an already-open descriptor) is not seen. See ``docs/code-tasks.md``.
"""

import os

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


def short(text):
    text = str(text)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


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
            elif (event in WRITE_PATH_EVENTS and args and not isinstance(args[0], int)
                  and not inside(args[0], (work,))):
                deny(event, repr(args[0]))
            elif event in TWO_PATH_EVENTS:
                for path in args[:2]:
                    if not isinstance(path, int) and not inside(path, (work,)):
                        deny(event, repr(path))
            elif (event in ("os.listdir", "os.scandir") and args
                  and isinstance(args[0], (str, bytes)) and not inside(args[0], readable)):
                deny(event, repr(args[0]))
        finally:
            state["busy"] = False

    return hook
