"""The runs a comparison read, in one compressed file a reader can recompute it from (issue 55).

``creditlab compare`` writes ``results.jsonl.gz`` beside its report: one line per run found
(used or not), holding the small files of its run directory as compare read them: ``config.yaml``,
``metrics.jsonl``, ``status.json``, ``summary.json`` and the per-problem ``eval_problems.jsonl``.
Nothing else (checkpoints, logs) enters. Passing that file to ``creditlab compare`` in place of the
run directories rebuilds them in a temporary folder and compares them again: the same tables, the
same ``compare.json`` (paths aside). The gzip header carries no time, so the same runs give the same
bytes. A card commits the file its tables come from (docs/comparing.md, *Results a reader can
recompute*).
"""

from __future__ import annotations

import atexit
import gzip
import io
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from creditlab.analysis.problem_records import PROBLEMS_FILE
from creditlab.analysis.rundirs import CompareError, Run

#: The files of a run directory the file keeps.
FILES = ("config.yaml", "metrics.jsonl", "status.json", "summary.json", PROBLEMS_FILE)
SUFFIX = ".jsonl.gz"
#: Above this size (bytes) ``write_results`` warns: a card should commit less.
BUDGET = 5 * 1024 * 1024


def write_results(runs: list[Run], path: Path) -> tuple[Path, str]:
    """Write ``runs``' small files to ``path``; returns it and a warning ('' if within :data:`BUDGET`)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as gz:
        for run in sorted(runs, key=lambda r: r.name):
            files = {f: (run.path / f).read_text() for f in FILES if (run.path / f).is_file()}
            gz.write((json.dumps({"name": run.name, "files": files}, sort_keys=True) + "\n").encode())
    path.write_bytes(buffer.getvalue())
    size = path.stat().st_size
    warning = (f"{path.name} is {size / 2**20:.1f} MiB, above the {BUDGET / 2**20:.0f} MiB a card should commit"
               if size > BUDGET else "")
    return path, warning


def is_results(path: str | Path) -> bool:
    """Whether ``path`` is a results file (not a run directory)."""
    return str(path).endswith(SUFFIX) and Path(path).is_file()


def materialize(path: str | Path) -> Path:
    """The runs of results file ``path`` as run directories in a new temporary folder (removed at
    exit), each at its recorded name.

    Raises:
        CompareError: The file is not gzip JSON lines of ``{"name", "files"}``, or a name or file
            would land outside the folder.
    """
    root = Path(tempfile.mkdtemp(prefix="creditlab-results-"))
    atexit.register(shutil.rmtree, root, True)
    try:
        lines = gzip.decompress(Path(path).read_bytes()).decode().splitlines()
        items: list[dict[str, Any]] = [json.loads(line) for line in lines if line.strip()]
    except (OSError, EOFError, ValueError) as exc:
        raise CompareError(f"{path}: not a results file of creditlab compare ({type(exc).__name__}: {exc})") from None
    for i, item in enumerate(items):
        name, files = item.get("name") if isinstance(item, dict) else None, item.get("files") if isinstance(item, dict) else None
        target = (root / str(name)).resolve()
        if not isinstance(name, str) or not isinstance(files, dict) or root.resolve() not in target.parents \
                or any(f not in FILES or not isinstance(v, str) for f, v in files.items()):
            raise CompareError(f"{path}: line {i + 1} is not a run of a results file (name, and files among "
                               f"{', '.join(FILES)})")
        target.mkdir(parents=True, exist_ok=True)
        for f, text in files.items():
            (target / f).write_text(text)
    return root
