"""``creditlab train | plugins | compare``.

``creditlab train [overrides] [-m]`` checks the overrides first (composing the config and
validating every section and plug-in name), so mistakes end with one clear line naming the fix
instead of a traceback; then it hands over to Hydra, which runs one job or a multirun sweep.
``creditlab compare RUN_DIR...`` aggregates finished runs into a report (docs/comparing.md;
its options: :mod:`creditlab.cli.compare_command`).

Each subcommand imports its heavy modules when it runs (the training stack imports Lightning,
~11 s on a 2-core machine; the report, matplotlib and scipy): the one place in the core where an
import sits inside a function for another reason than an optional dependency, so that
``creditlab plugins`` or a config mistake answers in seconds.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from creditlab.cli.compare_command import main as compare
from creditlab.errors import ArgumentParser, ConfigError, RegistryError, closest, exit_with
from creditlab.registry import REGISTRIES, conf_entries
from creditlab.run.compose import (
    CONF_DIR,
    SUBMITIT_MISSING,
    compose,
    searchpath_override,
    split_searchpath,
)
from creditlab.run.config import PART_KINDS, check_machine, validate
from creditlab.run.memory import GIB, PHASE_PARTS, plan_run
from creditlab.run.rundir_guard import RunDirError, check_run_dir

HYDRA_FLAGS_WITH_VALUE = {
    "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--cfg", "-c",
    "--package", "-p", "--experimental-rerun",
}
INFO_VALUES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}


def _sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists to check: every sweep at its first value, then each other value of each
    sweep (``a=1,2`` / ``range(...)`` / ``choice(...)``) once — linear, not the full grid."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    values: list[list[str]] = []
    for text, ov in zip(overrides, parsed):
        if not ov.is_sweep_override():
            values.append([text])
            continue
        prefix = "+" if ov.is_add() else ("++" if ov.is_force_add() else "")
        values.append([f"{prefix}{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()])
    base = [v[0] for v in values]
    variants = [base]
    for i, options in enumerate(values):
        variants.extend(base[:i] + [o] + base[i + 1 :] for o in options[1:])
    return variants


def _explain(exc: Exception, overrides: list[str]) -> str:
    """Turn a Hydra composition error into a message that names the fix."""
    text = str(exc)
    cause = str(exc.__cause__ or "")
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        if group == "hydra/launcher" and option.startswith("submitit"):
            return SUBMITIT_MISSING.format(option)
        registered = _registered_without_config(group, option)
        if registered:
            return registered
        options = re.findall(r"^\s+(\S+)\s*$", text, flags=re.MULTILINE)
        hint = closest(option, options)
        given = [o for o in overrides if o.lstrip("+~").startswith(f"{group}=")]
        plus = given[0][: len(given[0]) - len(given[0].lstrip("+"))] if given else ""
        return (
            f"unknown {group} '{option}'." + (f" Did you mean '{plus}{group}={hint}'?" if hint else "")
            + f" Available: {', '.join(options) or '(none)'}."
        )
    bad_key = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", cause)
    if bad_key:
        path = bad_key.group(1)
        parent, _, leaf = path.rpartition(".")
        others = [o for o in overrides if not o.lstrip("+~").startswith(path + "=")]
        try:
            node = compose(others)
            for part in filter(None, parent.split(".")):
                node = node[part]
            keys = [str(k) for k in node.keys()]
        except Exception:
            keys = []
        if leaf in keys:  # the key exists; the value (a mapping) adds keys the node does not have
            inner = re.search(r"Key '([^']+)' is not in struct", cause)
            given = next((o.lstrip("+") for o in overrides if o.lstrip("+~").startswith(path + "=")), f"{path}=...")
            return (
                f"'{path}' has no key '{inner.group(1) if inner else '?'}': a value that adds keys needs a "
                f"leading '+': '+{given}' (or one key at a time, e.g. '+{path}.<key>=<value>')."
            )
        hint = closest(leaf, keys)
        where = f"'{parent}'" if parent else "the top level"
        owners = _options_with_key(parent, leaf)
        return (
            f"unknown config key '{path}'." + (f" Did you mean '{(parent + '.') if parent else ''}{hint}'?" if hint else "")
            + (f" It is a key of {' or '.join(f'{parent}={o}' for o in owners)}: choose that option."
               if owners else "")
            + (f" Keys under {where}: {', '.join(sorted(keys))}." if keys else "")
            + f" (Add a genuinely new key with '+{path}=...'.)"
        )
    return text + (f" ({cause})" if cause else "")


def _registered_without_config(group: str, option: str) -> str | None:
    """For ``group=option`` with no ``group/option.yaml``: when ``option`` is a registered part of
    kind ``group``, what is wrong with it (its import error, or the missing config file)."""
    if group not in PART_KINDS or option not in REGISTRIES[group]:
        return None
    entry = REGISTRIES[group].entries[option]
    try:
        REGISTRIES[group].get(option)
    except RegistryError as exc:
        return str(exc)
    return (
        f"{group} '{option}' is registered by '{entry.dist}' ({entry.target}) but no config file "
        f"{group}/{option}.yaml is on the search path: the plug-in's config folder (entry-point group "
        f"'creditlab.conf') should ship one, or put 'name: {option}' in <folder>/{group}/{option}.yaml "
        f"and add hydra.searchpath=[file://<folder>]."
    )


def _options_with_key(group: str, key: str) -> list[str]:
    """The options of config group ``group`` (``conf/<group>/*.yaml``) that set ``key`` (e.g.
    ``rollout.split`` belongs to ``rollout=resets``)."""
    folder = CONF_DIR / group
    if not group or "." in group or not folder.is_dir():
        return []
    return [f.stem for f in sorted(folder.glob("*.yaml")) if key in (OmegaConf.load(f) or {})]


def _unparsable(overrides: list[str]) -> str:
    """Name the override Hydra's grammar rejects and how to quote its value."""
    parser = OverridesParser.create()
    for text in overrides:
        try:
            parser.parse_overrides([text])
        except OverrideParseException as exc:
            reason = str(exc).splitlines()[0]
            key, _, value = text.partition("=")
            return (f"cannot read the override {text!r} ({reason}); a value holding '=', ',', spaces, quotes or "
                    f"brackets must be quoted: {key}='{value}' (in a shell: \"{key}='{value}'\")")
    return "cannot read the overrides " + " ".join(overrides)


def check(overrides: list[str], machine: bool = True) -> Any:
    """Compose and validate; exit with a clear message on any mistake (``machine``: also what this
    machine lacks, e.g. GPUs). Returns the config."""
    first = None
    try:
        variants = _sweep_variants(overrides)
    except OverrideParseException:
        exit_with(_unparsable(overrides))
    for variant in variants:
        try:
            cfg = compose(variant)
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            exit_with(_explain(exc, variant))
        # A launcher other than Hydra's basic one runs the jobs elsewhere (e.g. SLURM GPU nodes).
        here = not any(o.lstrip("+~").startswith("hydra/launcher=") and not o.endswith("=basic") for o in variant)
        try:
            checked = validate(cfg)
            if here and machine and "launch" in checked:
                check_machine(cfg, checked["launch"])
        except (ConfigError, RegistryError) as exc:
            exit_with(str(exc))
        first = first if first is not None else cfg
    return first


def dry_run(cfg: Any, prompt_tokens: int | None) -> None:
    """Print what ``cfg`` resolves to and its memory estimate (:mod:`creditlab.run.memory`); no model
    is loaded and nothing is written."""
    try:
        plan, resolved = plan_run(cfg, validate(cfg), prompt_tokens)
    except (ConfigError, RegistryError) as exc:
        exit_with(str(exc))
    console = Console(width=120)
    facts = Table(title="creditlab train --dry-run", show_header=False)
    for key, value in resolved:
        facts.add_row(key, value)
    table = Table(title="memory estimate per device (docs/gpu.md: Memory before the model loads)")
    for col in ("component", "GiB", "counted in"):
        table.add_column(col, justify="right" if col == "GiB" else "left")
    for name, value in plan.parts.items():
        phases = [p for p, parts in PHASE_PARTS.items() if name in parts and p in plan.phases]
        table.add_row(name, f"{value / GIB:.3f}", ", ".join(phases) or "host memory (see the note)")
    for name, value in plan.phases.items():
        table.add_row(f"[bold]{name}[/bold]", f"[bold]{value / GIB:.3f}[/bold]", "phase total")
    console.print(facts, table)
    for note in plan.notes:
        console.print(f"note: {note}")
    phase, peak = plan.peak
    console.print(f"[bold]peak: {peak / GIB:.2f} GiB in {phase}[/bold] (the runtime: Python, torch, a CUDA context, "
                  "is not counted)")


def train(argv: list[str]) -> None:
    """Check the overrides, then run Hydra's main (one job, or a sweep with ``-m``); with
    ``--dry-run [--prompt-tokens N]``, print the resolved parts and the memory estimate instead."""
    dry = "--dry-run" in argv
    tokens = None
    if "--prompt-tokens" in argv:
        i = argv.index("--prompt-tokens")
        value = argv[i + 1] if i + 1 < len(argv) else ""
        if not dry or not value.isdigit():
            exit_with("--prompt-tokens N (the longest prompt in tokens, an integer) goes with --dry-run")
        tokens, argv = int(value), argv[:i] + argv[i + 2 :]
    argv = [a for a in argv if a != "--dry-run"]
    overrides, skip, first = [], False, None
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg in HYDRA_FLAGS_WITH_VALUE or arg in ("--info", "-i") and i + 1 < len(argv) and argv[i + 1] in INFO_VALUES:
            skip = True
        elif not arg.startswith("-"):
            overrides.append(arg)
            first = i if first is None else first
    if not any(a in ("--help", "-h", "--cfg", "-c", "--info", "-i", "--hydra-help") for a in argv):
        cfg = check(overrides, machine=not dry)  # a dry run may plan for another machine
        if dry:  # the first combination of a sweep
            return dry_run(cfg, tokens)
        if not {"-m", "--multirun"} & set(argv):  # before Hydra creates the folder and its log
            try:
                check_run_dir(cfg.run_dir)
            except RunDirError as exc:
                exit_with(str(exc))
    from creditlab.run.hydra_main import main as hydra_main  # the training stack (see the module doc)

    # Hydra's argparse wants the overrides in one run: the search path joins the user's overrides
    # (a user's own hydra.searchpath is merged into it, not left to replace it).
    at = first if first is not None else len(argv)
    user, rest = split_searchpath(argv[at:])
    sys.argv = ["creditlab train", *argv[:at], *searchpath_override(user), *rest]
    hydra_main()


def plugins(argv: list[str]) -> None:
    """Print every registered part (kind, name, distribution, version, module:attr, whether it
    imports: else its import error, repeated on stderr) and every plug-in config folder (``conf``)."""
    table = Table(title="creditlab plug-ins")
    for col in ("kind", "name", "distribution", "version", "target"):
        table.add_column(col, overflow="fold")  # long names wrap, never cut to "…"
    table.add_column("import", overflow="fold", max_width=40)  # an error wraps within its row
    broken = []
    for kind, reg in REGISTRIES.items():
        try:
            entries = list(reg)
        except RegistryError as exc:
            table.add_row(kind, "[red]error[/red]", "", "", str(exc), "")
            broken.append(str(exc))
            continue
        for e in entries:
            problem = reg.problem(e.name)
            table.add_row(kind, e.name, e.dist, e.version, e.target, f"[red]{problem}[/red]" if problem else "ok")
            if problem:
                broken.append(f"{kind} '{e.name}' from '{e.dist}' ({e.target}): {problem}")
    for e, path in conf_entries():  # config folders on Hydra's search path (creditlab.conf)
        table.add_row("conf", e.name, e.dist, e.version, path, "")
    Console(width=200).print(table)
    for line in broken:  # besides the table (which may wrap), one line each on stderr
        print(f"creditlab: plug-in unusable: {line}", file=sys.stderr)


def credit_bench(argv: list[str]) -> None:
    """Score every estimator and reset selector against Monte-Carlo ground truth (docs/credit-bench.md)."""
    parser = ArgumentParser(
        prog="creditlab credit-bench",
        description="Sample groups, value every thought boundary by K Monte-Carlo continuations, and score each "
        "advantage estimator and reset selector against that truth, without training. Other arguments are "
        "run-config overrides as for creditlab train (model=..., task=..., seed=..., rollout.group_size=...).",
    )
    parser.add_argument("--prompts", type=int, default=64, help="prompts of the split (default: 64)")
    parser.add_argument("--k", type=int, default=32, help="continuations per state (default: 32)")
    parser.add_argument("--split", default="test", help="task split (default: test)")
    parser.add_argument("--estimators", default=None, help="comma-separated estimator names (default: all registered)")
    parser.add_argument("--selectors", default=None, help="comma-separated reset selectors (default: all but none)")
    parser.add_argument("--sign-threshold", type=float, default=0.25, help="|A_k| above which signs are scored (default: 0.25)")
    parser.add_argument("--min-reliability", type=float, default=0.5, help="refuse below this truth reliability (default: 0.5)")
    parser.add_argument("--bootstrap", type=int, default=1000, help="prompt resamples for intervals (default: 1000)")
    parser.add_argument("--rank-by", default="error/mean", help="score/reduction to rank by (default: error/mean, the scale-matched error)")
    parser.add_argument("--out", default="credit-bench", help="report folder (default: ./credit-bench)")
    args, overrides = parser.parse_known_args(argv)
    if unknown := [o for o in overrides if o.startswith("-")]:
        exit_with(f"unknown option {unknown[0]}; see creditlab credit-bench --help")

    from creditlab.creditbench import Bench, BenchSettings, print_table, write_report

    names = {k: tuple(n.strip() for n in v.split(",") if n.strip()) if v else None
             for k, v in (("estimators", args.estimators), ("selectors", args.selectors))}
    settings = BenchSettings(args.prompts, args.k, args.split, names["estimators"], names["selectors"],
                             args.sign_threshold, args.min_reliability, args.bootstrap, args.rank_by)
    try:
        bench = Bench(overrides, settings)
        with Progress(transient=True) as bar:
            task = bar.add_task("Monte-Carlo continuations", total=None)
            result = bench.run(lambda done, total: bar.update(task, completed=done, total=total))
    except (HydraException, OmegaConfBaseException) as exc:
        exit_with(_explain(exc, overrides))
    except (ConfigError, RegistryError, ValueError) as exc:
        exit_with(str(exc))
    result.settings["command"] = "creditlab credit-bench " + " ".join(argv)
    print_table(result, paths=write_report(result, args.out))


COMMANDS = {"train": train, "plugins": plugins, "compare": compare, "credit-bench": credit_bench}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            hint = closest(argv[0], list(COMMANDS))
            print(f"creditlab: unknown command '{argv[0]}'." + (f" Did you mean '{hint}'?" if hint else ""), file=sys.stderr)
        print("usage: creditlab {train,plugins,compare,credit-bench} [args]\n"
              "  train [key=value ...] [-m]   run (or sweep with -m) the composed config\n"
              "  train --dry-run [key=value ...]   the resolved parts and a memory estimate, no run\n"
              "  plugins                      list registered parts\n"
              "  compare RUN_DIR... [--by method] [--baseline grpo]   report comparing runs\n"
              "  credit-bench [key=value ...] [--k 32]   score estimators against Monte-Carlo truth", file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    main()
