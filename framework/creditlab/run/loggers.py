"""Run-directory logging: ``metrics.jsonl`` (and ``eval_problems.jsonl``) beside whatever Lightning
loggers are configured."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from creditlab.analysis.problem_records import PROBLEMS_FILE
from creditlab.step.eval_hooks import ProblemLogger


def _step(line: str) -> float:
    """The ``step`` of a line (0 when it has none); infinite for a blank line or one that does not
    parse (cut off by a kill mid-write), so that a resume drops it."""
    try:
        return json.loads(line).get("step", 0) if line.strip() else math.inf
    except json.JSONDecodeError:
        return math.inf


class JsonlLogger(Logger, ProblemLogger):
    """Appends one JSON object per ``log_metrics`` call: ``{"step": s, "wall": t, **metrics}``, and
    per evaluation every problem's outcome to ``eval_problems.jsonl`` beside it (:meth:`log_problems`).

    Args:
        path: The ``metrics.jsonl`` file.
        resume_step: When resuming, lines with ``step > resume_step`` (logged after the checkpoint
            the run resumes from) are dropped first from both files, so they match an
            uninterrupted run.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.problems_path = self.path.with_name(PROBLEMS_FILE)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for file in (self.path, self.problems_path):
            if resume_step is not None and file.exists() and rank_zero_only.rank == 0:
                keep = [line for line in file.read_text().splitlines() if _step(line) <= resume_step]
                file.write_text("".join(line + "\n" for line in keep))
        self._start = time.time()

    @property
    def name(self) -> str:
        return "jsonl"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The resolved config is written to ``config.yaml`` by the run itself."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        row: dict[str, Any] = {"step": step, "wall": round(time.time() - self._start, 3)}
        for key, value in metrics.items():
            value = float(value)
            row[key] = value if math.isfinite(value) else str(value)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    @rank_zero_only
    def log_problems(self, record: dict[str, Any]) -> None:
        """Append one evaluation's per-problem line (format: :mod:`creditlab.analysis.problem_records`)."""
        with self.problems_path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
