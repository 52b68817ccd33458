"""``creditlab compare RUN_DIR...``: its options, then the comparison (:mod:`creditlab.analysis.compare`)
and the report (:mod:`creditlab.analysis.report`); docs/comparing.md explains every number.

The report's modules (matplotlib, scipy) are imported when the command runs, as the other subcommands
do (:mod:`creditlab.cli`), so that ``creditlab --help`` answers at once.
"""

from __future__ import annotations

from creditlab.errors import ArgumentParser, exit_with


def parser() -> ArgumentParser:
    """The options of ``creditlab compare``."""
    p = ArgumentParser(
        prog="creditlab compare",
        description="Compare runs grouped by config keys (seeds are the replicates): tables, learning curves "
        "with 95% confidence bands and exact sign-flip tests against a baseline, Holm-corrected; a comparison "
        "the runs pre-registered is tested first, the rest labelled exploratory. See docs/comparing.md.",
    )
    p.add_argument("paths", nargs="+", metavar="RUN_DIR", help="run directories or folders holding them (e.g. multirun/<date>)")
    p.add_argument("--by", default=None, help="comma-separated config keys defining a group (default: the declared by, else method)")
    p.add_argument("--baseline", default=None, help="group to test against (default: the declared baseline, else grpo if "
                   "present, else the first group)")
    p.add_argument("--threshold", type=float, default=None, help="accuracy for tokens-to-threshold (default: the baseline's final mean)")
    p.add_argument("--metric", default=None, help="evaluation metric (default: the declared metric, else eval/pass@1)")
    p.add_argument("--out", default="compare", help="output folder (default: ./compare)")
    p.add_argument("--bootstrap", type=int, default=10000, help="resamples for bootstrap intervals and Monte Carlo tests (default: 10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of those resamples (default: 0)")
    p.add_argument("--include-unfinished", action="store_true",
                   help="also count running, killed, crashed and partial runs that have evaluations")
    p.add_argument("--at-equal", default=None, metavar="KEY",
                   help="compare each pair of runs at an equal budget of a cumulative counter, e.g. tokens/trained "
                   "(default: at their last evaluations)")
    p.add_argument("--prereg", default=None, metavar="FILE",
                   help="a later declaration: a committed YAML file with a preregistration block, tested in its own "
                   "section on the runs started after its commit (the runs' own config.yaml stays the pre-registration)")
    p.add_argument("--no-prereg", action="store_true", help="no pre-registered section: an exploratory comparison only")
    p.add_argument("--no-holm", action="store_true", help="report raw p-values only (default: a Holm-adjusted p beside each; a declared Holm "
                   "correction then reads 'not as declared')")
    return p


def main(argv: list[str]) -> None:
    """Aggregate run directories over seeds, test each group against a baseline, write a report."""
    args = parser().parse_args(argv)
    by = None if args.by is None else [k.strip() for k in args.by.split(",") if k.strip()]
    if by == []:
        exit_with("--by needs at least one config key, e.g. --by method or --by method,rollout.split")
    if args.bootstrap < 1:
        exit_with(f"--bootstrap must be a positive number of resamples, got {args.bootstrap}")
    if args.prereg is not None and args.no_prereg:
        exit_with("--prereg FILE and --no-prereg contradict each other: give one (--no-prereg: no declared section)")

    from creditlab.analysis.compare import CompareError, compare  # the report's modules (see the module doc)
    from creditlab.analysis.report import print_summary, write_report

    try:
        result = compare(args.paths, by, args.baseline, args.threshold, args.metric, args.bootstrap, args.seed,
                         args.include_unfinished, args.at_equal, args.prereg, not args.no_prereg, not args.no_holm)
    except CompareError as exc:
        exit_with(str(exc))
    print_summary(result, write_report(result, args.out))
