"""``creditlab eval``: held-out accuracy of a model preset, a warm start or a run's checkpoint,
without training (:mod:`creditlab.run.evaluate`; docs/real-problems.md)."""

from __future__ import annotations

from pathlib import Path

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from creditlab.cli.overrides import explain
from creditlab.errors import ArgumentParser, ConfigError, InputError, RegistryError, exit_with


def evaluate(argv: list[str]) -> None:
    """Greedy and sampled accuracy with 95% intervals, and every problem's answers."""
    parser = ArgumentParser(
        prog="creditlab eval",
        description="Answer a task's held-out problems (or a file's) with a model and score them, without "
        "training. Other arguments are run-config overrides as for creditlab train (model=..., task=..., "
        "seed=..., rollout.max_new_tokens=...), or run_dir=DIR for a run's newest checkpoint.",
    )
    parser.add_argument("--data", default=None, help="JSONL of question/answer rows, answers ending in '#### <number>' "
                        "(GSM8K's format); read by task word_problems")
    parser.add_argument("--split", default="test", help="task split (default: test)")
    parser.add_argument("--problems", type=int, default=0, help="the first N problems (default: 0, all)")
    parser.add_argument("--samples", type=int, default=4, help="sampled answers per problem (default: 4; 0: greedy only)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the rollout's)")
    parser.add_argument("--batch-size", type=int, default=64, help="requests per generate call (default: 64)")
    parser.add_argument("--out", default="eval", help="folder for records.jsonl and summary.json (default: ./eval)")
    args, overrides = parser.parse_known_args(argv)
    if unknown := [o for o in overrides if o.startswith("-")]:
        exit_with(f"unknown option {unknown[0]}; see creditlab eval --help")

    from creditlab.run.evaluate import Accuracy, EvalRequest, evaluate_model, noise_line

    request = EvalRequest(args.split, args.data, args.problems, args.samples, args.temperature, args.batch_size)
    try:
        summary = evaluate_model(overrides, request, Path(args.out))
    except (HydraException, OmegaConfBaseException) as exc:
        exit_with(explain(exc, overrides))
    except (ConfigError, RegistryError, InputError, FileNotFoundError, ValueError) as exc:
        exit_with(str(exc))
    print(Accuracy(**summary["greedy"]).line("greedy"))
    if "sampled" in summary:
        print(Accuracy(**summary["sampled"]).line("sampled") + f", temperature {summary['temperature']:g}")
        if "noise" in summary:
            print(noise_line(summary))
    print(f"records: {Path(args.out) / 'records.jsonl'}; summary: {Path(args.out) / 'summary.json'} "
          f"({summary['seconds']:.0f} s)")
