"""Run-directory logging: ``metrics.jsonl`` beside whatever Lightning loggers are configured."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only


class JsonlLogger(Logger):
    """Appends one JSON object per ``log_metrics`` call: ``{"step": s, "wall": t, **metrics}``.

    Args:
        path: The ``metrics.jsonl`` file.
        resume_step: When resuming, lines with ``step > resume_step`` (logged after the checkpoint
            the run resumes from) are dropped first, so the file matches an uninterrupted run.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None) -> None:
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists() and rank_zero_only.rank == 0:
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in keep))
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


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
