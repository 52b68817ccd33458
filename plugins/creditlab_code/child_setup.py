"""Sandbox child, part 1 of 4: namespace root, cgroups, limits, privileges, seccomp filter.

The child program is ``child_setup.py``, ``child_guard.py``, ``codec.py`` and ``harness.py`` run
as one program in one namespace (see :mod:`creditlab_code.harness`); standard library only
(``libseccomp``, the well-kept library behind the filters of Docker, systemd and Chromium, is
loaded with ``ctypes`` when the plan asks for the filter).
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


#: System calls the filter refuses with EPERM: new namespaces, keyrings, SysV IPC and POSIX
#: message queues (memory that outlives the run), other processes' memory, mounts, kernel
#: modules and the like. ``clone`` is refused only with a ``CLONE_NEW*`` flag; ``clone3``
#: (whose flags a filter cannot read) fails with ENOSYS, so the C library falls back to
#: ``clone``.
SECCOMP_DENY = (
    "unshare", "setns", "keyctl", "add_key", "request_key", "shmget", "shmat", "shmctl", "shmdt",
    "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd", "msgrcv", "msgctl", "mq_open",
    "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr", "ptrace",
    "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "open_by_handle_at", "name_to_handle_at", "sethostname", "setdomainname", "swapon",
    "swapoff", "reboot", "acct", "quotactl", "syslog", "personality", "fanotify_init",
)
#: Refused with EAGAIN when no new process or thread is allowed (``max_processes: 1``).
SECCOMP_NO_PROCESSES = ("fork", "vfork", "clone")
CLONE_NEW_FLAGS = (0x80, 0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                   0x40000000)
SCMP_ACT_ALLOW, SCMP_CMP_MASKED_EQ, EPERM, EAGAIN, ENOSYS = 0x7FFF0000, 7, 1, 11, 38


def join_cgroups(paths):
    """Move this process into each cgroup in ``paths`` (made and limited by the parent); writing
    ``0`` to ``cgroup.procs`` means the writer, in v1 and v2 alike."""
    for path in paths:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write("0")


def install_seccomp(no_processes):
    """Load the system-call filter (see :data:`SECCOMP_DENY`); returns the layer's name."""
    import ctypes

    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)

    class Cmp(ctypes.Structure):
        _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                    ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]

    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                           ctypes.c_uint, ctypes.POINTER(Cmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")

    def rule(name, errno, *masks):
        number = lib.seccomp_syscall_resolve_name(name.encode())
        if number < 0:  # not a system call on this machine (fork on aarch64, ...)
            return
        conditions = (Cmp * max(1, len(masks)))(*[Cmp(0, SCMP_CMP_MASKED_EQ, m, m) for m in masks])
        result = lib.seccomp_rule_add_array(ctx, 0x00050000 | errno, number, len(masks),
                                            conditions)
        if result < 0:
            raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")

    try:
        for name in SECCOMP_DENY:
            rule(name, EPERM)
        rule("clone3", ENOSYS)
        if no_processes:
            for name in SECCOMP_NO_PROCESSES:
                rule(name, EAGAIN)
        else:
            for flag in CLONE_NEW_FLAGS:
                rule("clone", EPERM, flag)
        result = lib.seccomp_load(ctx)
        if result < 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")
    finally:
        lib.seccomp_release(ctx)
    return "seccomp"


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
        reporter.send(ev="exit", signal=os.WTERMSIG(status))
    else:
        reporter.send(ev="exit", code=os.WEXITSTATUS(status))
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
    return how


def forget_ctypes():
    """Drop ``ctypes`` from the module cache (the audit hook refuses importing it again)."""
    for name in ("ctypes", "_ctypes", "ctypes._endian"):
        sys.modules.pop(name, None)
