"""Render a credit-bench :class:`~creditlab.creditbench.result.BenchResult`: ``scatter.png``,
``scores.png``, ``report.md``, a self-contained ``report.html``, ``bench.json`` and a terminal
summary (rich).

Markdown and HTML are built from one list of blocks by the renderers of :mod:`creditlab.analysis.report`,
so they always say the same.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from creditlab.analysis.report import Block, to_html, to_markdown
from creditlab.creditbench.result import (
    FIRST_THOUGHT,
    SCORES,
    BenchResult,
    EstimatorScores,
    Interval,
    SelectorScores,
)

TITLE = "creditlab credit-bench"
SCATTER, SCORES_PLOT = "scatter.png", "scores.png"
SELECTOR_COLUMNS = ("exact", "early", "late")
#: The selectors' reference row: every failed chain reset at its first thought.
FIRST_LABEL = "(reference: always thought 0)"
COUNTS = (("chains", "chains"), ("failed_chains", "failed chains"), ("thoughts", "(chain, thought) pairs"),
          ("states", "states valued"), ("continuations", "Monte-Carlo continuations"))
NOISE = (("value_se", "standard error of V (mean)"), ("advantage_se", "standard error of A_k (mean)"),
         ("value_split_half", "split-half reliability of V (Spearman-Brown)"),
         ("advantage_split_half", "split-half reliability of A_k (Spearman-Brown)"),
         ("advantage_reliability", "reliability of A_k (1 - noise variance / variance)"),
         ("error_floor", "error floor (the error score of a perfect estimator, from the noise alone)"))
READING = [
    "spearman: rank correlation between credit and the true A_k over all (chain, thought) pairs.",
    ("spearman_within: mean over chains of the within-chain rank correlation; a chain whose credit is "
     "constant counts 0."),
    ("sign: share of steps with |A_k| above the threshold whose credit has the same sign (zero credit "
     "counts as disagreement)."),
    ("blame_hit: on failed chains, whether the most-blamed thought (lowest credit) is the true "
     "most-negative step; ties count fractionally."),
    ("error: squared error after the least-squares scale match, divided by the truth's sum of squares: "
     "0 is perfect, 1 is no better than zero credit; the noise floor says what a perfect estimator would get."),
    "mean / sum: the estimator's per-token advantages reduced over each thought's tokens by their mean or sum.",
    ("Selectors (shares of failed chains): exact = reset at the true most-negative step, early = before it, "
     "late = after it, oracle_exact = at the task oracle's first wrong step, first_thought = at thought 0; "
     "the reference row resets every failed chain at thought 0, where a selector lands when it cannot choose: "
     "a selector is only informative where it beats that row. Reset points' status: what the selector read "
     "(a self-localizing selector: boxed, step_phrase, no_error, or fallback when no step could be read)."),
    "Every interval is a 95% bootstrap interval over prompts.",
]


# -- formatting ----------------------------------------------------------------------------------

def fmt_interval(iv: Interval | None, digits: int = 3, signed: bool = False) -> str:
    """``0.412 [0.380, 0.445]``; ``+0.031 [-0.010, +0.070]`` when ``signed`` (differences); a dash for None."""
    if iv is None:
        return "—"
    f = f"{'+' if signed else ''}.{digits}f"
    return f"{iv.value:{f}} [{iv.low:{f}}, {iv.high:{f}}]"


def _num(x: Any, digits: int = 3) -> str:
    """Integers with thousands separators, floats with ``digits`` decimals, a dash for missing."""
    if x is None:
        return "—"
    if isinstance(x, int) or digits == 0:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def _scored(result: BenchResult) -> list[EstimatorScores]:
    return [e for e in result.estimators if e.error is None]


def _ok_selectors(result: BenchResult) -> list[SelectorScores]:
    return [s for s in result.selectors if s.error is None]


# -- plots ---------------------------------------------------------------------------------------

def plot_scatter(result: BenchResult, path: Path) -> Path:
    """One panel per scored estimator: true A_k (x) against its per-thought credit (y, mean reduction)."""
    ests = [e for e in _scored(result) if e.points]
    if not ests:
        fig = Figure(figsize=(4, 3))  # no pyplot: no global figure state, no GUI backend
        ax = fig.subplots()
        ax.text(0.5, 0.5, "nothing scored", ha="center", va="center")
        ax.set_axis_off()
    else:
        cols = min(4, len(ests))
        rows = math.ceil(len(ests) / cols)
        fig = Figure(figsize=(3.2 * cols, 2.9 * rows))
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, e in zip(axes, ests):
            x, y = zip(*e.points)
            ax.axhline(0, color="0.8", lw=0.8, zorder=0)
            ax.axvline(0, color="0.8", lw=0.8, zorder=0)
            ax.scatter(x, y, s=6, alpha=0.4, linewidths=0)
            rho = e.scores.get("spearman/mean")
            ax.set_title(f"{e.name}: Spearman {'—' if rho is None else f'{rho.value:.3f}'}", fontsize=9)
            ax.set_xlabel("true A_k", fontsize=8)
            ax.set_ylabel("credit (mean)", fontsize=8)
            ax.tick_params(labelsize=7)
        for ax in axes[len(ests):]:
            ax.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _bars(ax: Any, items: list[tuple[str, Interval]], xlabel: str) -> None:
    """Horizontal bars, first item on top, 95% intervals as error bars."""
    if not items:
        ax.text(0.5, 0.5, "nothing scored", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    ys = list(range(len(items)))[::-1]
    vals = [iv.value for _, iv in items]
    err = [[max(0.0, iv.value - iv.low) for _, iv in items], [max(0.0, iv.high - iv.value) for _, iv in items]]
    ax.barh(ys, vals, xerr=err, capsize=3, color="C0", alpha=0.8)
    ax.set_yticks(ys, [name for name, _ in items], fontsize=8)
    ax.axvline(0, color="0.5", lw=0.8)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(alpha=0.3, axis="x")


def plot_scores(result: BenchResult, path: Path) -> Path:
    """The ranking score per estimator (best on top) and, when selectors ran, their ``exact`` share."""
    est = [(e.name, e.scores[result.rank_by]) for e in _scored(result) if result.rank_by in e.scores]
    sel = [(s.name, s.scores["exact"]) for s in _ok_selectors(result) if "exact" in s.scores]
    n = max(len(est), len(sel), 1)
    fig = Figure(figsize=(11 if sel else 5.5, max(2.5, 0.35 * n + 1.3)))
    axes = fig.subplots(1, 2 if sel else 1, squeeze=False).ravel()
    _bars(axes[0], est, f"{result.rank_by} (95% interval)")
    axes[0].set_title("estimators, best on top", fontsize=9)
    if sel:
        _bars(axes[1], sel, "exact: share of failed chains reset at the true most-negative step")
        axes[1].set_title("reset selectors", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


# -- the report's content ------------------------------------------------------------------------

def _settings_text(s: dict[str, Any]) -> str:
    named = ("model", "task", "split", "prompts", "group_size", "k", "seed", "command")
    others = ", ".join(f"{k} = {v}" for k, v in sorted(s.items()) if k not in named)
    g = lambda k: s.get(k, "?")
    return (f"How close each advantage estimator's per-thought credit, and each reset selector's reset "
            f"point, comes to Monte-Carlo ground truth on the same groups: model {g('model')}, task "
            f"{g('task')} (split {g('split')}), {g('prompts')} prompts, groups of G = {g('group_size')} "
            f"chains, K = {g('k')} continuations per thought boundary, seed {g('seed')}"
            + (f"; {others}" if others else "") + f". Command: {g('command')}")


def estimator_rows(result: BenchResult, reduction: str) -> tuple[list[str], list[list[str]]]:
    """The ranking table for one reduction: rank, name, every score as ``value [low, high]``."""
    header = ["rank", "estimator", *[f"{s}/{reduction}" + (" (lower is better)" if s == "error" else "")
                                     for s in SCORES]]
    rows = [[str(i), e.name, *[fmt_interval(e.scores.get(f"{s}/{reduction}")) for s in SCORES]]
            for i, e in enumerate(_scored(result), 1)]
    return header, rows


def _statuses(shares: dict[str, float]) -> str:
    """Status shares as ``name 0.82, ...`` (— when the selector reports none)."""
    return ", ".join(f"{k} {v:.3f}" for k, v in shares.items()) or "—"


def selector_rows(result: BenchResult) -> tuple[list[str], list[list[str]]]:
    """One row per scored selector, then the reference (always thought 0) on the same chains."""
    cols = list(SELECTOR_COLUMNS) + (["oracle_exact"] if any("oracle_exact" in s.scores for s in result.selectors)
                                     else []) + [FIRST_THOUGHT]
    ok = _ok_selectors(result)
    rows = [[s.name, str(s.chains), *[fmt_interval(s.scores.get(c)) for c in cols], _statuses(s.statuses)] for s in ok]
    if rows and result.first_thought is not None:
        rows.append([FIRST_LABEL, str(ok[0].chains), *[fmt_interval(result.first_thought.get(c)) for c in cols], "—"])
    return ["selector", "failed chains", *cols, "reset points' status"], rows


def cost_rows(result: BenchResult) -> tuple[list[str], list[list[str]]]:
    def row(name: str, kind: str, c: dict[str, float]) -> list[str]:
        return [name, kind, _num(c.get("seconds"), 2), _num(c.get("generated_tokens"), 0),
                _num(c.get("forward_tokens"), 0), _num(c.get("peak_rss_gib"), 2)]
    rows = [row("ground truth", "Monte-Carlo truth and groups", result.truth_cost)]
    rows += [row(e.name, "estimator", e.cost) for e in result.estimators]
    rows += [row(s.name, "selector", s.cost) for s in result.selectors]
    return ["part", "kind", "seconds", "generated tokens", "forward tokens", "peak GiB"], rows


def separation_items(result: BenchResult) -> list[str]:
    return [f"{s.better} vs {s.worse}: {fmt_interval(s.difference, signed=True)} — "
            + ("separated" if s.separated else "not separated") for s in result.separations]


def blocks(result: BenchResult) -> list[Block]:
    """The report as blocks (rendered to Markdown and HTML)."""
    out: list[Block] = [("h1", TITLE), ("p", _settings_text(result.settings)), ("h2", "Ground truth"),
                        ("p", ("V(s_k): mean reward of K continuations from the chain's prefix at thought boundary "
                               "s_k; true step advantage A_k = V(s_{k+1}) − V(s_k) (the last step: reward − "
                               "V(s_last)). On-policy values of this checkpoint, with Monte-Carlo noise:")),
                        ("table", ["quantity", "value"],
                         [[label, _num(result.counts.get(k))] for k, label in COUNTS]
                         + [[label, _num(result.noise.get(k))] for k, label in NOISE])]
    if result.instrument is not None:
        iv = result.instrument.get("most_negative_is_first_wrong")
        out.append(("p", ("Instrument check (the task has a step oracle): share of failed chains whose "
                          f"most-negative Monte-Carlo step is the oracle's first wrong step: {fmt_interval(iv)}.")))
        extra = [f"{k}: {fmt_interval(v)}" for k, v in result.instrument.items() if k != "most_negative_is_first_wrong"]
        out += [("ul", extra)] if extra else []
    out += [("h2", "Estimators"),
            ("p", (f"Ranked by {result.rank_by}, best first; every cell a statistic with its 95% interval. "
                   "Credit reduced per thought by the mean of its tokens' advantages:")),
            ("table", *estimator_rows(result, "mean")),
            ("p", "The same estimators, credit reduced per thought by the sum of its tokens' advantages:"),
            ("table", *estimator_rows(result, "sum"))]
    failed = [f"{e.name}: {e.error}" for e in result.estimators if e.error is not None]
    out += [("p", "Not scored:"), ("ul", failed)] if failed else []
    out += [("h2", "Where they do not separate"),
            ("p", (f"How much better each estimator is than the next one in the ranking, in {result.rank_by} "
                   "(positive = better; for error, the lower error; paired bootstrap over prompts); "
                   "separated when its 95% interval excludes zero."))]
    items = separation_items(result)
    out += [("ul", items)] if items else [("p", "Fewer than two estimators were scored.")]
    out.append(("h2", "Reset selectors"))
    header, rows = selector_rows(result)
    out += [("table", header, rows)] if rows else [("p", "No reset selector was scored.")]
    sel_failed = [f"{s.name}: {s.error}" for s in result.selectors if s.error is not None]
    out += [("p", "Not scored:"), ("ul", sel_failed)] if sel_failed else []
    out += [("h2", "Cost"), ("table", *cost_rows(result)),
            ("p", "Generated tokens: sampled by the part itself; forward tokens: through extra forward passes."),
            ("h2", "How to read the scores"), ("ul", READING),
            ("h2", "Plots"), ("img", SCATTER, "estimated against true credit per estimator"),
            ("img", SCORES_PLOT, "scores with 95% intervals")]
    return out


def to_json(result: BenchResult) -> dict[str, Any]:
    """The whole result as plain data (``bench.json``); non-finite floats become null."""
    data = dataclasses.asdict(result)
    for d, s in zip(data["separations"], result.separations):
        d["separated"] = s.separated
    return _finite(data)


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def write_report(result: BenchResult, out: str | Path) -> dict[str, Path]:
    """Write ``scatter.png``, ``scores.png``, ``report.md``, ``report.html`` and ``bench.json`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"scatter": plot_scatter(result, out / SCATTER), "scores": plot_scores(result, out / SCORES_PLOT),
             "md": out / "report.md", "html": out / "report.html", "json": out / "bench.json"}
    items = blocks(result)
    paths["md"].write_text(to_markdown(items))
    paths["html"].write_text(to_html(items, out, title=TITLE))
    paths["json"].write_text(json.dumps(to_json(result), indent=2, default=str))
    return paths


def print_table(result: BenchResult, console: Console | None = None, paths: dict[str, Path] | None = None) -> None:
    """Estimators and selectors as rich tables, then the noise and where the report is."""
    console = console or Console(width=160)
    est = Table(title=escape(f"{TITLE}: estimators (ranked by {result.rank_by})"))
    keys = [result.rank_by, *(k for k in ("error/mean", "spearman_within/mean", "blame_hit/mean") if k != result.rank_by)][:3]
    for col in ("rank", "estimator", *keys, "seconds"):
        est.add_column(escape(col), overflow="fold")
    for i, e in enumerate(_scored(result), 1):
        est.add_row(str(i), escape(e.name), *[fmt_interval(e.scores.get(k)) for k in keys],
                    _num(e.cost.get("seconds"), 2))
    for e in result.estimators:
        if e.error is not None:
            est.add_row("—", escape(e.name), f"[red]not scored:[/red] {escape(e.error)}", "", "", "")
    console.print(est)
    if result.selectors:
        sel = Table(title="reset selectors (shares of failed chains)")
        for col in ("selector", *SELECTOR_COLUMNS):
            sel.add_column(col, overflow="fold")
        sel.add_column(FIRST_THOUGHT, overflow="fold")
        for s in result.selectors:
            cells = ([fmt_interval(s.scores.get(c)) for c in (*SELECTOR_COLUMNS, FIRST_THOUGHT)] if s.error is None
                     else [f"[red]not scored:[/red] {escape(s.error)}", "", "", ""])
            sel.add_row(escape(s.name), *cells)
        if result.first_thought is not None:
            sel.add_row(escape(FIRST_LABEL), *[fmt_interval(result.first_thought.get(c))
                                               for c in (*SELECTOR_COLUMNS, FIRST_THOUGHT)])
        console.print(sel)
    console.print(f"noise: advantage reliability {_num(result.noise.get('advantage_reliability'))}, "
                  f"error floor {_num(result.noise.get('error_floor'))}")
    if paths:
        console.print(f"report: {escape(str(paths.get('md')))}  {escape(str(paths.get('html')))}  "
                      "(plots and bench.json beside them)")
