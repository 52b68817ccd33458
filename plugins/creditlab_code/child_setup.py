"""Sandbox child, part 1 of 3: the namespace root, resource limits and dropping privileges.

The child program is ``child_setup.py``, ``child_guard.py`` and ``harness.py`` run as one
program in one namespace (see :mod:`creditlab_code.harness`); standard library only.
"""

import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MS_REC, MS_PRIVATE, MNT_DETACH = 16384, 1 << 18, 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
#: pivot_root system call numbers per machine (no glibc wrapper exists).
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


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
