"""Per-run memory and pids cgroups for the sandbox, where this process may create them.

``RLIMIT_AS`` bounds the address space of a process, not the memory it can hold outside it:
files on the work tmpfs, pipe buffers, ``memfd`` and SysV segments. A memory cgroup charges all
of those to the run; a pids cgroup bounds its processes and threads whatever its uid. The parent
makes one group per run under its own group (cgroup v1 hierarchies or v2, as mounted), the
child joins it before it runs any model code (:func:`creditlab_code.child_setup.join_cgroups`),
and the parent removes it after the run. Where the hierarchy is not writable (not root, no
delegation), :func:`available` says so and the sandbox runs without this layer (recorded in
``info["isolation"]``). Standard library only.
"""

from __future__ import annotations

import os
import time
import uuid

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids")


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per controller (``""``: the v2 unified group)."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, path = line.rstrip("\n").split(":", 2)
                for name in names.split(",") if names else [""]:
                    out[name] = path
    except (OSError, ValueError):
        pass
    return out


def parents() -> dict[str, str]:
    """Controller -> the folder under which run groups are made (v1 first, then v2)."""
    own, out = _own_paths(), {}
    for name in CONTROLLERS:
        v1 = os.path.join(ROOT, name)
        if name in own and os.path.isfile(os.path.join(v1, "cgroup.procs")):
            out[name] = v1 + own[name].rstrip("/")
            continue
        v2 = ROOT + own.get("", "/").rstrip("/")
        try:
            with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                if name in f.read().split():
                    out[name] = v2
        except OSError:
            pass
    return out


def create(memory_bytes: int, pids: int) -> list[str]:
    """Make and limit this run's groups; their folders (empty when none can be made).

    Raises:
        OSError: If a group was made but a limit could not be written (it is removed first).
    """
    made: list[str] = []
    tag = f"creditlab-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        for name, parent in sorted(parents().items()):
            path = os.path.join(parent, tag)
            if path not in made:
                os.mkdir(path)
                made.append(path)
            if name == "memory":
                v1 = os.path.exists(os.path.join(path, "memory.limit_in_bytes"))
                _write(path, "memory.limit_in_bytes" if v1 else "memory.max", memory_bytes)
                if not v1 and os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(path, "memory.swap.max", 0)
            else:
                _write(path, "pids.max", pids)
    except OSError:
        remove(made)
        raise
    return made


def _write(path: str, name: str, value: int) -> None:
    with open(os.path.join(path, name), "w") as f:
        f.write(str(value))


def remove(paths: list[str], wait_s: float = 2.0) -> None:
    """Remove the groups once their processes are gone (the kernel frees them asynchronously)."""
    deadline = time.monotonic() + wait_s
    for path in paths:
        while True:
            try:
                os.rmdir(path)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)


def available(memory_bytes: int = 256 << 20, pids: int = 4) -> bool:
    """Whether run groups can be made here (tries one and removes it)."""
    try:
        made = create(memory_bytes, pids)
    except OSError:
        return False
    remove(made)
    return bool(made)
