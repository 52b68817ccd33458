"""Run directories for ``creditlab compare``: find them, read them, classify them, group them.

A run directory holds ``metrics.jsonl`` and ``config.yaml`` (plus ``status.json``, written by the
runner, and ``summary.json`` once finished). Runs are grouped by config keys (``method`` by
default); seeds are the replicates. Runs that cannot count (empty, crashed, unfinished) are kept
in the result with their reason, never dropped silently.
"""

from __future__ import annotations

import json
import math
import os
import socket
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from creditlab.errors import closest

#: x-axes of the learning curves: metric key -> label. ``step`` is the RL step.
AXES = {
    "step": "RL step",
    "tokens/trained": "trained tokens",
    "tokens/generated": "generated tokens",
    "time/train_s": "training time (s, evaluation excluded)",
}
REWARD = "train/reward/mean"
#: Keys that may differ between the seeds of a group without a warning (``preregistration``:
#: compare checks that every run declares the same, :mod:`creditlab.analysis.confirmatory`).
IGNORED_KEYS = ("seed", "run_dir", "threads", "resume", "checkpoint_every", "tags", "logger",
                "backend.max_batch_size", "eval.batch_size", "preregistration")
SKIP_DIRS = {"checkpoints", "wandb", "lightning_logs", "__pycache__"}
UNFINISHED = ("running", "stopped", "killed", "failed", "partial")


class CompareError(Exception):
    """Bad input that stops the comparison (no runs, unknown key or baseline)."""


@dataclass
class Run:
    """One run directory, read and classified.

    Attributes:
        path: The run directory.
        name: A short display name (path relative to the runs' common parent).
        config: The flattened resolved config (``{"advantage.std": "sample", ...}``).
        rows: The parsed ``metrics.jsonl`` rows.
        status: finished | running | stopped | killed | failed | partial | empty.
        detail: A human sentence explaining the status.
        steps: Last RL step with training metrics.
        max_steps: Configured ``trainer.max_steps`` (None if unknown).
        seed: Configured ``seed`` (None if unknown).
        group: The group label.
        used: Whether the run enters the statistics.
        reason: Why it does not (empty when used).
        started: When it started (``status.json``'s local ``%Y-%m-%dT%H:%M:%S``; None if unknown).
    """

    path: Path
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    status: str = "empty"
    detail: str = ""
    steps: int = 0
    max_steps: int | None = None
    seed: Any = None
    group: str = ""
    used: bool = False
    reason: str = ""
    started: str | None = None

    def curve(self, metric: str, axis: str = "step") -> tuple[list[float], list[float]]:
        """``metric`` against ``axis``: counters are taken from the latest row at or before each
        point's step (evaluation rows carry no counters; step 0 counts as 0)."""
        xs, ys, last = [], [], {}
        for row in self.rows:
            last.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
            value = row.get(metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                x = row["step"] if axis == "step" else (0.0 if row["step"] == 0 else last.get(axis))
                if x is not None:
                    xs.append(float(x))
                    ys.append(float(value))
        return xs, ys


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists kept as values)."""
    if not isinstance(node, dict):
        return {prefix: node} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, path) if isinstance(value, dict) and value else {path: value})
    return out


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories among ``paths`` and below them (a directory with ``config.yaml`` or
    ``metrics.jsonl``; hidden folders such as ``.hydra`` and a run's own sub-folders skipped).
    Symbolic links to folders are followed, so a folder of links selects runs from several sweeps.

    Raises:
        CompareError: A path does not exist, or no run directory is found.
    """
    found: list[Path] = []
    seen: set[str] = set()  # real paths walked: symlinked folders are followed, cycles are not
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CompareError(f"no such file or directory: '{raw}'. Pass run directories or a multirun folder.")
        if path.is_file():
            path = path.parent
        for here, dirs, files in os.walk(path, followlinks=True):
            real = os.path.realpath(here)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            if "config.yaml" in files or "metrics.jsonl" in files:
                found.append(Path(here).resolve())
                dirs[:] = []
                continue
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
    runs = sorted(set(found))
    if not runs:
        searched = ", ".join(f"'{p}'" for p in paths)
        raise CompareError(
            f"no run directories found under {searched} (looked for folders holding config.yaml or "
            "metrics.jsonl, e.g. multirun/<date>/<job>/ or the run_dir= of a run)."
        )
    return runs


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    rows, bad = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        for key, value in row.items():
            if isinstance(value, str) and value.lower() in ("nan", "inf", "-inf"):
                row[key] = float(value)
        rows.append(row)
    return rows, bad


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _classify(run: Run, status: dict[str, Any] | None, has_summary: bool) -> None:
    of = f"{run.steps}/{run.max_steps if run.max_steps is not None else '?'} steps"
    if status is not None:
        state = status.get("status")
        if state == "finished":
            run.status, run.detail = "finished", f"finished ({of})"
        elif state == "stopped":  # a signal stopped it at a step's end; the same command resumes it
            message = (status.get("error") or {}).get("message") or f"stopped by a signal after {of}"
            run.status, run.detail = "stopped", f"{message} (resumable)"
        elif state == "failed":
            err = status.get("error") or {}
            run.status = "failed"
            run.detail = f"crashed after {of}: {err.get('type', '?')}: {err.get('message', '')}".rstrip(": ")
        elif status.get("host") not in (None, socket.gethostname()):
            run.status, run.detail = "running", f"running on host {status['host']} (cannot check its pid), {of} so far"
        elif _pid_alive(status.get("pid")):
            run.status, run.detail = "running", f"still running (pid {status.get('pid')}), {of} so far"
        else:
            run.status = "killed"
            run.detail = (f"stopped without finishing after {of}: status.json says running but pid "
                          f"{status.get('pid')} is gone (killed, out of memory or machine lost)")
        return
    if has_summary:
        run.status, run.detail = "finished", f"finished ({of}; summary.json, no status.json)"
    else:
        run.status = "partial"
        run.detail = (f"unfinished: {of} and no summary.json (still running, killed or crashed; an "
                      "older run without status.json, so which one cannot be told)")


def load_run(path: Path) -> Run:
    """Read one run directory and classify it (see :class:`Run`)."""
    run = Run(path=path, name=path.name)
    cfg_path = path / "config.yaml"
    notes = []
    if cfg_path.exists():
        try:
            run.config = flatten(yaml.safe_load(cfg_path.read_text()) or {})
        except yaml.YAMLError as exc:
            notes.append(f"config.yaml unreadable ({exc.__class__.__name__})")
    else:
        notes.append("no config.yaml")
    run.seed = run.config.get("seed")
    steps = run.config.get("trainer.max_steps")
    run.max_steps = int(steps) if isinstance(steps, (int, float)) else None
    metrics = path / "metrics.jsonl"
    if metrics.exists():
        run.rows, bad = _read_jsonl(metrics)
        if bad:
            notes.append(f"{bad} unreadable line(s) in metrics.jsonl skipped")
    run.steps = max((int(r["step"]) for r in run.rows if REWARD in r and "step" in r), default=0)
    status = _read_json(path / "status.json")
    run.started = str(status["started"]) if status and status.get("started") else None
    if not run.rows:
        run.status = "empty"
        run.detail = "metrics.jsonl is empty" if metrics.exists() else "no metrics.jsonl"
        if status and status.get("status") == "failed":
            _classify(run, status, False)
            run.detail += " (nothing logged)"
    else:
        _classify(run, status, (path / "summary.json").exists())
    if notes:
        run.detail += "; " + "; ".join(notes)
    return run


def _label(run: Run, keys: list[str]) -> str:
    values = [run.config.get(k, "(missing)") for k in keys]
    if len(keys) == 1:
        return str(values[0])
    return ",".join(f"{k}={v}" for k, v in zip(keys, values))


def assign_groups(runs: list[Run], keys: list[str]) -> list[str]:
    """Label every run's group from the config ``keys``; returns warnings.

    Raises:
        CompareError: A key is absent from every run's config (with the closest known key).
    """
    known = sorted({k for r in runs for k in r.config})
    warnings = []
    for key in keys:
        missing = [r.name for r in runs if key not in r.config]
        if len(missing) == len(runs):
            hint = closest(key, known)
            raise CompareError(
                f"--by {key}: no run has config key '{key}'." + (f" Did you mean '{hint}'?" if hint else "")
                + " Use dotted config keys such as method, advantage.std or rollout.split."
            )
        if missing:
            warnings.append(f"--by {key}: missing from the config of {', '.join(missing)}; grouped as '(missing)'")
    for run in runs:
        run.group = _label(run, keys)
    return warnings


def select_used(runs: list[Run], metric: str, include_unfinished: bool) -> None:
    """Mark which runs enter the statistics, with the reason for the others."""
    for run in runs:
        evals = run.curve(metric)[0]
        if run.status == "empty":
            run.reason = run.detail
        elif not evals:
            run.reason = f"no '{metric}' logged (eval.every=0?)"
        elif run.status in UNFINISHED and not include_unfinished:
            run.reason = f"{run.status} (--include-unfinished counts it)"
        run.used = not run.reason


def config_mismatches(runs: list[Run], by: list[str]) -> list[str]:
    """Warnings for config keys that differ within a group (seed and bookkeeping keys aside)."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.config:
            groups[run.group].append(run)
    out = []
    for label, members in groups.items():
        keys = sorted({k for r in members for k in r.config})
        diffs = []
        for key in keys:
            if key in by or any(key == i or key.startswith(i + ".") for i in IGNORED_KEYS):
                continue
            values: dict[str, list[str]] = defaultdict(list)
            for r in members:
                values[json.dumps(r.config.get(key, "(missing)"), default=str)].append(r.name)
            if len(values) > 1:
                diffs.append(f"{key}: " + "; ".join(f"{v} ({', '.join(n)})" for v, n in values.items()))
        if diffs:
            shown = diffs[:6] + ([f"... and {len(diffs) - 6} more keys"] if len(diffs) > 6 else [])
            out.append(f"group '{label}': configs differ apart from the seed — " + " | ".join(shown))
        seeds = [r.seed for r in members if r.seed is not None]
        dupes = sorted({s for s in seeds if seeds.count(s) > 1}, key=str)
        if dupes:
            out.append(f"group '{label}': seed(s) {', '.join(map(str, dupes))} appear more than once; "
                       "tests against the baseline fall back to unpaired")
    return out


def short_names(runs: list[Run]) -> None:
    """Name runs by their path relative to the common parent of all runs."""
    if len(runs) == 1:
        runs[0].name = runs[0].path.name
        return
    base = Path(os.path.commonpath([str(r.path) for r in runs]))
    for run in runs:
        run.name = str(run.path.relative_to(base)) if run.path != base else run.path.name
