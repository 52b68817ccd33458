"""``creditlab credit-bench``: score estimators and reset selectors against Monte-Carlo ground truth
(docs/credit-bench.md). :mod:`creditlab.creditbench` is imported when the command runs (see
:mod:`creditlab.cli`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from rich.progress import Progress

from creditlab.cli.overrides import explain
from creditlab.errors import ArgumentParser, ConfigError, RegistryError, exit_with
from creditlab.registry import REGISTRIES
from creditlab.run.memory import GIB, available_memory, bench_plan, load_shape, prompt_tokens, usable


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
    parser.add_argument("--dry-run", action="store_true", help="print the memory the bench will hold, per phase, "
                        "without loading the model (docs/gpu.md: Memory before the model loads)")
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
        if args.dry_run:
            return dry_run(bench)
        if warning := memory_warning(bench):
            print(warning, file=sys.stderr)
        with Progress(transient=True) as bar:
            task = bar.add_task("Monte-Carlo continuations", total=None)
            result = bench.run(lambda done, total: bar.update(task, completed=done, total=total))
    except (HydraException, OmegaConfBaseException) as exc:
        exit_with(explain(exc, overrides))
    except (ConfigError, RegistryError, ValueError) as exc:
        exit_with(str(exc))
    result.settings["command"] = "creditlab credit-bench " + " ".join(argv)
    print_table(result, paths=write_report(result, args.out))


def memory_warning(bench: Any) -> str | None:
    """A warning when the plan's upper bound (:func:`plan`) exceeds this machine's usable memory,
    naming the phases and the settings that shrink them; ``None`` when it fits or cannot be known.
    A warning, not a refusal: real chains are usually shorter than the bound, but a bench over it
    may be killed for memory long after it started (a real-model bench was, at 37 min)."""
    p = plan(bench)
    memory = p.memory
    if memory is None:
        return None
    over = {k: v for k, v in p.phases.items() if v > usable(memory[0])}
    if not over:
        return None
    names = ", ".join(f"{k} {v / GIB:.1f} GiB" for k, v in sorted(over.items(), key=lambda kv: -kv[1]))
    return (f"warning: the bench may not fit in memory: its upper bound is over the {usable(memory[0]) / GIB:.1f} "
            f"GiB usable here ({names}; every chain and continuation at its {bench.checked['rollout'].response_budget}"
            "-token budget). See --dry-run; fewer --prompts, a smaller --k, rollout.group_size, or a smaller "
            "rollout.max_thoughts x rollout.max_thought_tokens (line-by-line sampling) shrink it.")


@dataclass(frozen=True)
class Plan:
    """The bench's memory plan: ``phases`` in bytes, the plan's ``notes``, this machine's
    ``memory`` (``(bytes, where it was read)``, ``None`` when unknown), the longest ``prompt``
    (text) and the model shape's ``source``."""

    phases: dict[str, float]
    notes: list[str]
    memory: tuple[float, str] | None
    prompt: str
    source: str


def plan(bench: Any) -> Plan:
    """The bench's phases (:func:`creditlab.run.memory.bench_plan`): its truth's continuations
    and each estimator on every chain at once, beside the weights; no model loads."""
    checked = bench.checked
    shape, tokenizer, source = load_shape(checked["model"])
    prompt, how = prompt_tokens(bench.problems, tokenizer, checked["rollout"].chat_template)
    names = {e.target: e.name for e in REGISTRIES["segmenter"]}
    estimators = {}
    for name, sections in bench.estimators.items():
        (_, est_cfg), (seg_cls, seg_cfg) = sections["advantage"], sections["segmenter"]
        estimators[name] = (est_cfg, names.get(f"{seg_cls.__module__}:{seg_cls.__qualname__}", ""), seg_cfg)
    memory = available_memory(str(OmegaConf.select(bench.cfg, "trainer.accelerator", default="cpu")))
    phases, notes = bench_plan(bench.cfg, checked, shape, prompt, len(bench.problems), estimators, memory)
    return Plan(phases, list(notes), memory, f"{prompt} {how}", source)


def dry_run(bench: Any) -> None:
    """Print the bench's memory plan (:func:`plan`)."""
    p, rollout = plan(bench), bench.checked["rollout"]
    memory = p.memory
    print(f"creditlab credit-bench --dry-run: {len(bench.problems)} prompts x {rollout.group_size} chains, "
          f"prompt <= {p.prompt}, response <= {rollout.response_budget} tokens; shape: {p.source}")
    for phase, value in sorted(p.phases.items(), key=lambda kv: -kv[1]):
        over = memory is not None and value > usable(memory[0])
        print(f"  {phase:<34} {value / GIB:9.3f} GiB" + ("  (does not fit this machine)" if over else ""))
    for note in p.notes:
        print(f"note: {note}")
    print(f"note: an upper bound: every chain and continuation at its response budget ({rollout.response_budget} "
          "tokens), every state and answer distinct; real chains are usually much shorter")
    if memory is not None:
        print(f"memory: {memory[0] / GIB:.1f} GiB ({memory[1]}), {usable(memory[0]) / GIB:.1f} GiB usable")
