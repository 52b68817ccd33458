"""The environment is the lock: every package the venv holds has the version ``locks/*.txt`` names,
and each lock satisfies what ``pyproject.toml`` asks for.

``make setup`` (and ``make setup-vllm``) install a venv from a lock and write the lock's path into
``<venv>/.creditlab-installed``; in such a venv :func:`test_installed_packages_are_the_lock` fails
for any package missing, of another version, or installed beside the lock. Outside one (creditlab
installed into a user's own environment) it skips, naming why: there no lock applies.
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.lock

ROOT = Path(__file__).resolve().parents[2]
STAMP = Path(sys.prefix) / ".creditlab-installed"
#: Lock -> the extras of pyproject.toml it was compiled with (the Makefile's ``lock`` target).
LOCKS = {"locks/main.txt": {"test", "bench", "gguf"}, "locks/vllm.txt": {"test"}}
#: Installed beside a lock on purpose: the project itself, and the venv's own bootstrap pip.
NOT_LOCKED = {"creditlab", "pip"}


def read_lock(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of the ``name==version`` lines of a uv/pip-compile lock
    (hash continuations, comments and option lines skipped)."""
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        spec = [s for s in req.specifier if s.operator == "=="]
        if len(spec) != 1 or len(req.specifier) != 1:
            raise ValueError(f"not an exact pin in a lock: {line!r}")
        pins[canonicalize_name(req.name)] = spec[0].version
    return pins


def differences(lock: dict[str, str], installed: dict[str, str], allowed: set[str]) -> list[str]:
    """What keeps ``installed`` from being exactly ``lock`` (names in ``allowed`` may be extra)."""
    out = []
    for name, want in sorted(lock.items()):
        have = installed.get(name)
        if have is None:
            out.append(f"{name}: missing (lock {want})")
        elif Version(have) != Version(want):
            out.append(f"{name}: {have} installed, lock {want}")
    out += [f"{name}: {installed[name]} installed, not in the lock"
            for name in sorted(set(installed) - set(lock) - allowed)]
    return out


def installed_packages() -> dict[str, str]:
    """``{canonical name: version}`` of the distributions this interpreter sees."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in metadata.distributions()}


def test_read_lock_and_differences_by_hand():
    lock = read_lock(
        "# header\nTorch==2.13.0+cpu \\\n    --hash=sha256:ab\n"
        "typing_extensions==4.15.0    # via torch\n--find-links /x\n\n"
    )
    assert lock == {"torch": "2.13.0+cpu", "typing-extensions": "4.15.0"}
    have = {"torch": "2.13.0+cpu", "typing-extensions": "4.16.0", "rogue": "1.0", "pip": "23.2"}
    assert differences(lock, have, NOT_LOCKED) == [
        "typing-extensions: 4.16.0 installed, lock 4.15.0", "rogue: 1.0 installed, not in the lock",
    ]
    assert differences({**lock, "six": "1.16"}, lock, NOT_LOCKED) == ["six: missing (lock 1.16)"]
    with pytest.raises(ValueError, match="exact pin"):
        read_lock("transformers>=5\n")


def test_installed_packages_are_the_lock():
    if not STAMP.is_file() or not STAMP.read_text().strip():
        pytest.skip(f"{sys.prefix} was not installed from a lock by `make setup` (no {STAMP.name})")
    name = STAMP.read_text().strip()
    lock = read_lock((ROOT / name).read_text())
    diff = differences(lock, installed_packages(), NOT_LOCKED)
    assert not diff, (
        f"{sys.prefix} differs from {name} in {len(diff)} package(s):\n  " + "\n  ".join(diff)
        + "\nRun `make setup` (or `make setup-vllm`) to install exactly the lock again; to move a "
        "version on purpose, `make lock` and commit the refresh with its test results."
    )


@pytest.mark.parametrize("lock_name", sorted(LOCKS))
def test_each_lock_satisfies_pyproject(lock_name):
    """A dependency added to or changed in pyproject.toml without ``make lock`` fails here."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = LOCKS[lock_name]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for e in sorted(extras) for r in project["optional-dependencies"][e]]
    lock = read_lock((ROOT / lock_name).read_text())
    unmet = [
        f"{req} (lock: {lock.get(canonicalize_name(req.name), 'absent')})"
        for req in wanted
        if req.marker is None or req.marker.evaluate()
        if not req.specifier.contains(lock.get(canonicalize_name(req.name), "0.dev0"), prereleases=True)
        or canonicalize_name(req.name) not in lock
    ]
    assert not unmet, f"{lock_name} does not satisfy pyproject.toml; run `make lock`: {unmet}"
