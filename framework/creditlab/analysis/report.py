"""Render a :class:`~creditlab.analysis.compare.Comparison`: PNG plots, ``report.md``, a self-contained
``report.html`` (plots embedded), ``compare.json`` and a terminal summary (rich).

The Markdown and HTML reports are built from one list of blocks, so they always say the same.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from creditlab.analysis.compare import Comparison
from creditlab.analysis.contrasts import Test
from creditlab.analysis.group_stats import TESTED, GroupStats
from creditlab.analysis.problem_records import MIN_SEEDS_FOR_P
from creditlab.analysis.report_json import to_json
from creditlab.analysis.report_prereg import EXPLORATORY, UNDECLARED, prereg_blocks, prereg_rows
from creditlab.analysis.results_file import write_results
from creditlab.analysis.rundirs import AXES, REWARD
from creditlab.analysis.significance import BOOTSTRAP_MIN_N, EXACT_LIMIT, IQM
from creditlab.analysis.stats import MeanCI

PLOT_FILES = {"step": "curves_step.png", "tokens/trained": "curves_tokens_trained.png",
              "tokens/generated": "curves_tokens_generated.png", "time/train_s": "curves_time.png"}
FINAL_PLOT = "final.png"
Block = tuple  # ("h2", text) | ("p", text) | ("ul", [text]) | ("table", header, rows) | ("img", file, alt)


# -- formatting ----------------------------------------------------------------------------------

def fmt_ci(ci: MeanCI, digits: int = 3) -> str:
    """``0.812 ± 0.034 (n=3)``; one seed has no interval; no seed is a dash."""
    if ci.n == 0:
        return "—"
    if ci.n == 1:
        return f"{ci.mean:.{digits}f} (n=1, no CI)"
    return f"{ci.mean:.{digits}f} ± {ci.half_width:.{digits}f} (n={ci.n})"


def fmt_tokens(entry: tuple[float | None, int] | None, n: int) -> str:
    """Median tokens to threshold with the seeds that reached it, or "not reached"."""
    if entry is None or n == 0:
        return "—"
    median, reached = entry
    if median is None:
        return f"not reached ({reached}/{n})"
    return f"{median:,.0f} ({reached}/{n} reached)"


def fmt_iqm(iqm: IQM | None, digits: int = 3) -> str:
    """``0.812 [0.790, 0.830] (n=24)``, or the IQM alone below the bootstrap's minimum."""
    if iqm is None:
        return "—"
    n = f"n={iqm.runs}" + (f"x{iqm.tasks} tasks" if iqm.tasks > 1 else "")
    if iqm.low is None:
        return f"{iqm.value:.{digits}f} ({n}, no interval below n={BOOTSTRAP_MIN_N})"
    return f"{iqm.value:.{digits}f} [{iqm.low:.{digits}f}, {iqm.high:.{digits}f}] ({n})"


def fmt_p(p: float) -> str:
    """Three significant digits (``0.25``, ``0.0625``, ``1.53e-05``): never rounded to 0."""
    return f"{p:.3g}"


def fmt_test(t: Test) -> tuple[str, str, str, str, str]:
    """(difference, 95% t-interval, p, test with n, bootstrap interval) of one test; dashes when
    there was none."""
    if t.result is None:
        return "—", "—", "—", "—", "—"
    r = t.result
    boot = "—" if r.boot_low is None else f"[{r.boot_low:+.3f}, {r.boot_high:+.3f}]"
    return f"{r.diff:+.3f}", f"[{r.t_low:+.3f}, {r.t_high:+.3f}]", fmt_p(r.p_value), r.description, boot


def _span(values: list[int]) -> str:
    """``6``, ``4–6`` (runs end at different steps) or a dash."""
    if not values:
        return "—"
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


def _threshold(c: Comparison) -> str:
    thr = c.settings["threshold"]
    return "none (no baseline result)" if thr is None else f"{thr:.3f} ({c.settings['threshold_source']})"


# -- plots ---------------------------------------------------------------------------------------

def plot_curves(c: Comparison, out: Path) -> list[Path]:
    """One PNG per x-axis: evaluation metric (left) and train reward (right), mean ± 95% CI."""
    colors = {g.label: f"C{i % 10}" for i, g in enumerate(c.groups)}
    written = []
    for axis, name in PLOT_FILES.items():
        panels = [(c.settings["metric"], f"held-out {c.settings['metric']}"), (REWARD, "train reward (mean of the last 10 steps)")]
        if not any(c.curves[(axis, m)] for m, _ in panels):
            continue
        fig = Figure(figsize=(11, 4))  # no pyplot: no global figure state, no GUI backend
        axes = fig.subplots(1, 2)
        for ax, (metric, title) in zip(axes, panels):
            for label, b in c.curves[(axis, metric)].items():
                style = "-" if b.interpolated or len(b.x) > 12 else "o-"
                ax.plot(b.x, b.mean, style, color=colors[label], label=f"{label} (n={b.n})", ms=4)
                if b.n > 1:
                    ax.fill_between(b.x, b.mean - b.half, b.mean + b.half, color=colors[label], alpha=0.18)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel(AXES[axis] + (" (seeds interpolated)" if axis != "step" else ""))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle("mean over seeds, shaded: 95% t-interval", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        written.append(out / name)
    if any(g.used for g in c.groups):
        written.append(_plot_final(c, out / FINAL_PLOT, colors))
    return written


def _plot_final(c: Comparison, path: Path, colors: dict[str, str]) -> Path:
    """Per-seed final accuracy (dots, seed labelled) with the group mean and 95% CI (bar)."""
    fig = Figure(figsize=(max(4.0, 1.3 * len(c.groups) + 2), 3.6))
    ax = fig.subplots()
    for i, g in enumerate(c.groups):
        vals = g.values.get("final", [])
        for j, (seed, v) in enumerate(vals):
            x = i + (j - (len(vals) - 1) / 2) * 0.06
            ax.plot(x, v, "o", color=colors[g.label], alpha=0.6, ms=5)
            ax.annotate(str(seed), (x, v), fontsize=6, xytext=(3, 0), textcoords="offset points")
        if g.final.n:
            err = 0 if math.isnan(g.final.half_width) else g.final.half_width
            ax.errorbar(i + 0.25, g.final.mean, yerr=err, fmt="s", color="black", capsize=4, ms=5)
    ax.set_xticks(range(len(c.groups)), [g.label for g in c.groups], rotation=20, fontsize=8)
    ax.set_ylabel(f"final {c.settings['metric']}")
    ax.set_title("final accuracy per seed (dots) and mean ± 95% CI (square)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


# -- the report's content ------------------------------------------------------------------------

def group_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """The per-group results table."""
    header = ["group", "n", "seeds", f"final {c.settings['metric']} (mean ± 95% CI)",
              "final IQM [95% stratified bootstrap CI]", "final step",
              "AUC (mean ± 95% CI)", "trained tokens to threshold", "generated tokens to threshold",
              "median s/step"]
    rows = []
    for g in c.groups:
        n = len(g.used)
        steps = sorted(set(g.final_steps))
        rows.append([
            g.label + (" (baseline)" if g.label == c.baseline else ""), str(n),
            ", ".join(str(s) for s, _ in g.values.get("final", [])) or "—",
            fmt_ci(g.final), fmt_iqm(g.iqm.get("final")), _span(steps), fmt_ci(g.auc),
            fmt_tokens(g.to_threshold.get("tokens/trained"), n),
            fmt_tokens(g.to_threshold.get("tokens/generated"), n),
            "—" if g.step_time is None else f"{g.step_time:.3f}",
        ])
    return header, rows


def _holm(c: Comparison, p_holm: float | None) -> list[str]:
    """The Holm p cell (none with ``--no-holm``)."""
    return [("—" if p_holm is None else fmt_p(p_holm))] if c.settings.get("holm", True) else []


def holm_sentence(c: Comparison, n: int, what: str) -> str:
    """Which family the Holm column corrects (or that nothing is corrected)."""
    if not c.settings.get("holm", True):
        return (f"No correction for multiple comparisons (--no-holm): among {n} tests some p-values below 0.05 are "
                "expected by chance.")
    return (f"Holm p: Holm-adjusted over the {n} test(s) with a p in this table (the family: {what}); a difference "
            "is claimed at level alpha only where it is <= alpha. Each table is its own family: no correction "
            "spans the report's tables, so a claim that reads several of them is not covered at alpha.")


def test_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """The seed-level tests (the primary ones): Holm p beside the raw p."""
    holm = ["Holm p"] if c.settings.get("holm", True) else []
    header = ["group", "quantity", f"difference vs {c.baseline}", "95% t-interval", "p (two-sided, exact)", *holm,
              "test, n", f"95% bootstrap CI (n ≥ {BOOTSTRAP_MIN_N})", "pairing"]
    rows = []
    for t in c.tests:
        diff, ci, p, test, boot = fmt_test(t)
        rows.append([t.label, TESTED.get(t.quantity, t.quantity), diff, ci, p, *_holm(c, t.p_holm), test, boot, t.note])
    return header, rows


def problem_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    """The per-problem (seeds x problems) tests against the baseline."""
    holm = ["Holm p"] if c.settings.get("holm", True) else []
    header = ["group", f"difference vs {c.baseline}", "95% t-interval (crossed)", "p (two-sided, crossed t)", *holm,
              "df", "seeds x problems", "compared at", "pairing"]
    rows = []
    for t in c.problem_tests:
        r = t.result
        cells = (["—"] * (5 + len(holm)) if r is None else
                 [f"{r.diff:+.3f}", f"[{r.low:+.3f}, {r.high:+.3f}]", fmt_p(r.p_value) if r.seeds >= MIN_SEEDS_FOR_P
                  else f"— (needs {MIN_SEEDS_FOR_P} seeds)", *_holm(c, t.p_holm), f"{r.df:.3g}", f"{r.seeds} x {r.problems}"])
        rows.append([t.label, *cells, t.at, t.note])
    return header, rows


def credit_rows(groups: list[GroupStats]) -> tuple[list[str], list[list[str]]]:
    keys = sorted({k for g in groups for k in g.credit})
    rows = [[g.label, *[fmt_ci(g.credit[k]) if k in g.credit else "—" for k in keys]] for g in groups if g.credit]
    return ["group", *keys], rows


def run_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["run", "group", "seed", "status", "steps", f"last {c.settings['metric']}", "counted", "detail"]
    rows = []
    for r in c.runs:
        ys = r.curve(c.settings["metric"])[1]
        steps = f"{r.steps}/{r.max_steps if r.max_steps is not None else '?'}"
        rows.append([r.name, r.group, str(r.seed), r.status, steps, f"{ys[-1]:.3f}" if ys else "—",
                     "yes" if r.used else f"no: {r.reason}", r.detail])
    return header, rows


def blocks(c: Comparison, images: list[Path]) -> list[Block]:
    """The report as blocks (rendered to Markdown and HTML)."""
    s = c.settings
    x = EXPLORATORY  # only a declared section is confirmatory; with none, every table here is exploratory
    out: list[Block] = [
        ("h1", "creditlab compare"),
        ("p", f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from {', '.join(s['paths'])}: {len(c.runs)} run(s), "
              f"{len(c.groups)} group(s) by {', '.join(s['by'])}; baseline '{c.baseline}'; "
              f"metric {s['metric']}; threshold {_threshold(c)}; {s['resamples']} resamples (bootstrap intervals, "
              f"Monte Carlo tests), seed {s['seed']}."),
    ]
    out += prereg_blocks(c.prereg) if c.prereg else []
    out += prereg_blocks(c.later) if c.later else []
    if not (c.prereg or c.later):
        out += [("p", UNDECLARED)]
    if c.warnings:
        out += [("h2", "Warnings"), ("ul", c.warnings)]
    out += [("h2", f"{x}Results per group"), ("table", *group_rows(c)),
            ("p", "n: seeds counted. Final: each seed's last evaluation. IQM: mean of the middle 50% of the "
                  "seeds' final values (rliable; 3 seeds: their mean), its interval a bootstrap over seeds, "
                  f"shown from n={BOOTSTRAP_MIN_N}. AUC: area under the evaluation "
                  "curve divided by its step range (the average accuracy during training). Tokens to "
                  "threshold: median over seeds of the tokens at the first evaluation at or above the "
                  "threshold (seeds that never reach it count as infinite). See docs/comparing.md.")]
    if c.tests:
        out += [("h2", f"{x}Against the baseline '{c.baseline}': exact seed-level tests (primary)"),
                ("table", *test_rows(c)),
                ("p", "p: two-sided randomization test, exact over every arrangement where they number at "
                      f"most {EXACT_LIMIT:,} (else Monte Carlo). Paired seeds: sign-flip test of the per-seed differences (n pairs: "
                      "smallest possible p 2/2^n, 0.25 for 3 seeds). Unpaired: permutation test over every "
                      "split of the pooled values. Interval: paired or Welch t-interval; a bootstrap interval "
                      f"is added from n={BOOTSTRAP_MIN_N}, where it is no longer too narrow. "
                      + holm_sentence(c, sum(t.result is not None for t in c.tests), "every group x quantity here")
                      + " See docs/comparing.md.")]
    if c.problem_tests:
        budget = c.settings.get("at_equal")
        out += [("h2", f"{x}Per problem against the baseline '{c.baseline}' (secondary; seeds x problems, {s['metric']}, "
                       + (f"at exactly equal {budget}, interpolated between evaluations)" if budget
                          else "at the last evaluations)")),
                ("table", *problem_rows(c)),
                ("p", "Every run scores the same held-out problems (eval_problems.jsonl). For each seed both "
                      "groups ran and each problem: the group's outcome minus the baseline's (greedy 0/1 for "
                      "eval/pass@1, correct/samples for eval/sample_accuracy), at the step or budget in 'compared "
                      "at' (at a budget, each run read linearly between its two evaluations around it). "
                      "Mean over seeds x problems; interval and p from a t-test with the crossed random-effects "
                      "variance var_seed/S + var_problem/P + var_resid/(S P) (components from the two-way ANOVA "
                      "mean squares), on S - 1 degrees of freedom (df) when a seed component is estimated, else "
                      "Welch-Satterthwaite's, and never smaller than the t-test of the seed means' p, so both "
                      "run-to-run and problem-to-problem variance count. "
                      f"No p below {MIN_SEEDS_FOR_P} seeds. It is secondary: the exact seed-level test above is the "
                      "test; this one gains power from the problems and rests on a model. "
                      + holm_sentence(c, sum(t.result is not None and t.result.seeds >= MIN_SEEDS_FOR_P
                                             for t in c.problem_tests), "every group here") + " See docs/comparing.md.")]
    header, rows = credit_rows(c.groups)
    out += [("h2", f"{x}Credit quality (train/credit/*, averaged over each run, then over seeds)")]
    out += [("table", header, rows)] if rows else [("p", "No train/credit/* metrics in these runs.")]
    out += [("h2", f"{x}Plots")] + [("img", p.name, p.stem) for p in images]
    out += [("p", "Step axis: seeds aligned on the evaluation steps they share. Token and time axes: each "
                  "seed linearly interpolated onto a 100-point grid over the range every seed covers."),
            ("h2", "Runs"), ("table", *run_rows(c))]
    return out


# -- renderers -----------------------------------------------------------------------------------

def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(items: list[Block]) -> str:
    lines: list[str] = []
    for kind, *rest in items:
        if kind in ("h1", "h2"):
            lines += [("# " if kind == "h1" else "## ") + rest[0], ""]
        elif kind == "p":
            lines += [rest[0], ""]
        elif kind == "ul":
            lines += [f"- {_md_cell(x)}" for x in rest[0]] + [""]
        elif kind == "table":
            header, rows = rest
            lines += ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in rows] + [""]
        elif kind == "img":
            lines += [f"![{rest[1]}]({rest[0]})", ""]
    return "\n".join(lines)


def to_html(items: list[Block], out: Path, title: str = "creditlab compare") -> str:
    e = html.escape
    body: list[str] = []
    for kind, *rest in items:
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{e(rest[0])}</{kind}>")
        elif kind == "ul":
            body.append("<ul class='warn'>" + "".join(f"<li>{e(x)}</li>" for x in rest[0]) + "</ul>")
        elif kind == "table":
            header, rows = rest
            body.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
                        + "".join("<tr>" + "".join(f"<td>{e(x)}</td>" for x in row) + "</tr>" for row in rows)
                        + "</table>")
        elif kind == "img":
            data = base64.b64encode((out / rest[0]).read_bytes()).decode()
            body.append(f"<p><img alt='{e(rest[1])}' src='data:image/png;base64,{data}'></p>")
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:13px;margin:0.5em 0}"
             "td,th{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}"
             "th{background:#f3f3f3}.warn li{color:#8a4b00}img{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def write_report(c: Comparison, out: str | Path) -> dict[str, Path]:
    """Write plots, ``report.md``, ``report.html``, ``compare.json`` and the runs it read
    (``results.jsonl.gz``, :mod:`creditlab.analysis.results_file`) into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results, too_big = write_results(c.runs, out / "results.jsonl.gz")
    if too_big and too_big not in c.warnings:
        c.warnings.append(too_big)
    images = plot_curves(c, out)
    items = blocks(c, images)
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "compare.json", "results": results}
    paths["md"].write_text(to_markdown(items))
    paths["html"].write_text(to_html(items, out))
    paths["json"].write_text(json.dumps(to_json(c), indent=2, default=str))
    return paths


def print_summary(c: Comparison, paths: dict[str, Path], console: Any = None) -> None:
    """Groups, tests and warnings as rich tables on the terminal."""
    console = console or Console(width=160)
    x = EXPLORATORY.lower()
    declared = [(f"{'later declaration' if p.later else 'pre-registered comparison'} ({p.source})", prereg_rows(p))
                for p in (c.prereg, c.later) if p is not None]
    if not declared:
        console.print(escape(UNDECLARED))
    for title, (header, rows) in (*declared, (f"{x}creditlab compare", group_rows(c)),
                                  (f"{x}against baseline '{c.baseline}': exact seed-level tests (primary)", test_rows(c)),
                                  (f"{x}per problem against '{c.baseline}' (secondary, seeds x problems)",
                                   problem_rows(c))):
        if not rows:
            continue
        table = Table(title=escape(title))
        for col in header:
            table.add_column(escape(col), overflow="fold")
        for row in rows:
            table.add_row(*map(escape, row))
        console.print(table)
    for warning in c.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")
    console.print(f"threshold: {escape(_threshold(c))}")
    console.print(f"report: {paths['md']}  {paths['html']}  (plots and compare.json beside them)")
