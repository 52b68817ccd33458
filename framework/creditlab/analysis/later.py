"""A declaration made after some runs (``creditlab compare --prereg FILE``): a new, separately
labelled declaration, never a relabelling of the runs' own (:mod:`creditlab.analysis.confirmatory`).

Its date is the commit that last changed the file: the file must be committed (an uncommitted
declaration has no date anyone can check), and only runs that started after that commit count
towards it (``status.json``'s ``started``); the runs before it are listed as left out. So a
follow-up question asked of finished runs is answered on fresh seeds, as declared.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from creditlab.analysis.preregistration import Preregistration, load
from creditlab.analysis.rundirs import CompareError, Run
from creditlab.errors import ConfigError


@dataclass(frozen=True)
class Later:
    """A later declaration: the block, the file, and the commit that dates it.

    Attributes:
        declaration: The validated block.
        path: The file.
        commit: The last commit that changed the file (full hash).
        date: That commit's committer date (ISO 8601 with its offset).
    """

    declaration: Preregistration
    path: Path
    commit: str
    date: str

    @property
    def source(self) -> str:
        return f"--prereg {self.path} (committed {self.date}, commit {self.commit[:12]})"

    @property
    def timestamp(self) -> float:
        return datetime.fromisoformat(self.date).timestamp()


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CompareError(f"--prereg: cannot run git to date the declaration ({exc})") from None


def load_later(path: str | Path) -> Later:
    """The declaration in ``path`` with the commit that dates it.

    Raises:
        CompareError: The file is invalid, not in a git repository, not committed, or changed
            since its last commit (the message says to commit it before running the fresh seeds).
    """
    file = Path(path).resolve()
    try:
        decl = load(path)
    except ConfigError as exc:
        raise CompareError(str(exc)) from None
    hint = (f"a later declaration is dated by its commit: commit {path} before the runs it is tested on "
            "(only runs started after that commit count)")
    if _git(file.parent, "ls-files", "--error-unmatch", file.name).returncode != 0:
        raise CompareError(f"--prereg {path}: not a committed file of a git repository; {hint}")
    if _git(file.parent, "status", "--porcelain", "--", file.name).stdout.strip():
        raise CompareError(f"--prereg {path}: changed since its last commit; {hint}")
    out = _git(file.parent, "log", "-1", "--format=%H %cI", "--", file.name).stdout.split()
    if len(out) != 2:
        raise CompareError(f"--prereg {path}: git has no commit of it; {hint}")
    return Later(decl, Path(path), out[0], out[1])


def started_at(run: Run) -> float | None:
    """When ``run`` started (seconds since the epoch; its local time), None if unknown."""
    if not run.started:
        return None
    try:
        return datetime.strptime(run.started, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def fresh_runs(runs: list[Run], later: Later) -> tuple[list[Run], list[str]]:
    """The runs that started after the declaration's commit, and the others as ``name (why)``."""
    kept, left = [], []
    for run in runs:
        when = started_at(run)
        if when is None:
            left.append(f"{run.name} (no start time in status.json)")
        elif when < later.timestamp:
            left.append(f"{run.name} (started {run.started}, before the declaration)")
        else:
            kept.append(run)
    return kept, left
