"""Helpers shared by the side-by-side benchmarks: turn taking, per-step timing, profiling and
robust summaries (median, IQR) of per-step times."""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path

SIDES = ("creditlab", "trl")

# ------------------------------------------------------------------------------------------------
# Turn taking and timing
# ------------------------------------------------------------------------------------------------
class Baton:
    """Two sides take turns: ``pass_and_wait(me)`` hands the CPU over and blocks until it comes back.

    A side that has finished (or crashed) never blocks the other.
    """

    def __init__(self, first: str, active: tuple[str, ...]) -> None:
        self.cond = threading.Condition()
        self.turn = first
        self.done = {s for s in SIDES if s not in active}

    @staticmethod
    def other(side: str) -> str:
        return SIDES[1 - SIDES.index(side)]

    def wait(self, me: str) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.turn == me or self.other(me) in self.done)

    def pass_and_wait(self, me: str) -> None:
        with self.cond:
            self.turn = self.other(me)
            self.cond.notify_all()
        self.wait(me)

    def finish(self, me: str) -> None:
        with self.cond:
            self.done.add(me)
            self.turn = self.other(me)
            self.cond.notify_all()


class Recorder:
    """Per-step wall times of one side: hook-to-hook ``step``, full ``cycle``, and named parts."""

    def __init__(
        self, side: str, baton: Baton, threads: int, warmup: int = 0, total: int = 0, profiler=None
    ) -> None:
        self.side, self.baton, self.threads = side, baton, threads
        self.warmup, self.total, self.profiler = warmup, total, profiler
        self.rows: list[dict[str, float]] = []
        self.parts: dict[str, float] = defaultdict(float)
        self.t_begin = self.t_resume = None
        self.thread_counts: set[int] = set()

    def timed(self, name: str, fn):
        """``fn`` wrapped to add its wall time to part ``name`` of the current step."""

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.parts[name] += time.perf_counter() - t0

        return wrapper

    def begin(self) -> None:
        import torch

        self.thread_counts.add(torch.get_num_threads())
        if self.profiler is not None and len(self.rows) >= self.warmup:
            self.profiler.start()
        self.t_begin = time.perf_counter()

    def end(self) -> None:
        t_end = time.perf_counter()
        if self.profiler is not None and len(self.rows) >= self.warmup:
            self.profiler.stop(last=len(self.rows) + 1 >= self.total)
        row = {"step": t_end - self.t_begin}
        if self.t_resume is not None:
            row["cycle"] = t_end - self.t_resume
        row.update(self.parts)
        self.rows.append(row)
        self.parts = defaultdict(float)
        self.baton.pass_and_wait(self.side)
        self.t_resume = time.perf_counter()


def describe_optimizer(opt) -> str:
    d = opt.defaults
    lrs = sorted({g["lr"] for g in opt.param_groups})
    wds = sorted({g["weight_decay"] for g in opt.param_groups})
    return (f"{type(opt).__name__}(lr={lrs}, weight_decay={wds}, betas={d.get('betas')}, "
            f"eps={d.get('eps')}, fused={d.get('fused')}, foreach={d.get('foreach')})")


# ------------------------------------------------------------------------------------------------
# Optional profiling of one side's measured steps
# ------------------------------------------------------------------------------------------------
class PythonProfiler:
    """cProfile over the measured steps (the side's own thread only); ``report`` prints the top."""

    def __init__(self, out: Path) -> None:
        import cProfile

        self.prof, self.out = cProfile.Profile(), out

    def start(self) -> None:
        self.prof.enable()

    def stop(self, last: bool = False) -> None:
        self.prof.disable()

    def report(self, top: int = 30) -> None:
        import pstats

        self.prof.dump_stats(self.out)
        for key in ("tottime", "cumulative"):
            print(f"\n--- cProfile of the measured steps, top {top} by {key} (full: {self.out}) ---")
            pstats.Stats(self.prof).strip_dirs().sort_stats(key).print_stats(top)


class TorchProfiler:
    """``torch.profiler`` (CPU) over the measured steps; ``report`` prints the top ops by self time.

    It records every thread's ops: use it with ``--only``.
    """

    def __init__(self, out: Path) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
        self.out, self.started = out, False

    def start(self) -> None:
        if not self.started:
            self.prof.__enter__()
            self.started = True

    def stop(self, last: bool = False) -> None:
        # One profile over all measured steps, closed on the thread that opened it.
        if last and self.started:
            self.prof.__exit__(None, None, None)
            self.prof.export_chrome_trace(str(self.out))

    def report(self, top: int = 30) -> None:
        if not self.started:
            return
        print(f"\n--- torch.profiler of the measured steps, top {top} ops by self CPU time "
              f"(trace: {self.out}) ---")
        print(self.prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


# ------------------------------------------------------------------------------------------------
# Driver and report
# ------------------------------------------------------------------------------------------------
def summarize(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "iqr": q[2] - q[0],
            "min": min(values), "n": len(values)}


def side_stats(rows: list[dict[str, float]], warmup: int) -> dict[str, dict[str, float]]:
    kept = [dict(r) for r in rows[warmup:]]
    for r in kept:  # TRL: the update is the rest of the step (loss fwd/bwd, clip, optimizer)
        if "update" not in r and "rollout" in r:
            r["update"], r["derived_update"] = r["step"] - r["rollout"], 1.0
    out = {}
    for key in ("step", "cycle", "rollout", "generate", "update"):
        vals = [r[key] for r in kept if key in r]
        if vals:
            out[key] = summarize(vals)
    # Derived parts per step: everything in the step that is neither rollout nor update.
    rest = [r["step"] - r["rollout"] - r["update"] for r in kept
            if "update" in r and "rollout" in r and "derived_update" not in r]
    if rest:
        out["other"] = summarize(rest)
    return out


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "lightning", "trl", "accelerate", "creditlab"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "-"
    return out


def fmt(stat: dict[str, float] | None) -> str:
    if not stat:
        return f"{'-':>14}"
    return f"{stat['median']:7.3f} ±{stat['iqr']:5.3f}"
