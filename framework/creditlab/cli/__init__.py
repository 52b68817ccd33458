"""``creditlab train | plugins | compare | credit-bench | eval``: one module per subcommand.

``creditlab train [overrides] [-m]`` checks the overrides first (composing the config and
validating every section and plug-in name: :mod:`creditlab.cli.overrides`), so mistakes end with
one clear line naming the fix instead of a traceback; then it hands over to Hydra, which runs one
job or a multirun sweep (:mod:`creditlab.cli.train_command`). ``creditlab compare RUN_DIR...``
aggregates finished runs into a report (docs/comparing.md; its options:
:mod:`creditlab.cli.compare_command`). ``creditlab plugins``: :mod:`creditlab.cli.plugins_command`;
``creditlab credit-bench``: :mod:`creditlab.cli.credit_bench_command`; ``creditlab eval``:
:mod:`creditlab.cli.eval_command`.

Each subcommand imports its heavy modules when it runs (the training stack imports Lightning,
~11 s on a 2-core machine; the report, matplotlib and scipy): the one place in the core where an
import sits inside a function for another reason than an optional dependency, so that
``creditlab plugins`` or a config mistake answers in seconds.
"""

from __future__ import annotations

import os
import sys

from creditlab.cli.compare_command import main as compare
from creditlab.cli.credit_bench_command import credit_bench
from creditlab.cli.eval_command import evaluate
from creditlab.cli.plugins_command import plugins
from creditlab.cli.train_command import train
from creditlab.errors import closest

COMMANDS = {"train": train, "plugins": plugins, "compare": compare, "credit-bench": credit_bench, "eval": evaluate}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            hint = closest(argv[0], list(COMMANDS))
            print(f"creditlab: unknown command '{argv[0]}'." + (f" Did you mean '{hint}'?" if hint else ""), file=sys.stderr)
        print("usage: creditlab {train,plugins,compare,credit-bench,eval} [args]\n"
              "  train [key=value ...] [-m]   run (or sweep with -m) the composed config\n"
              "  train --dry-run [key=value ...] [--memory-gib M]   the resolved parts and a memory estimate, no run\n"
              "  train --plan [-m] [key=value ...] [--calibrate-steps 4]   each run's predicted wall-clock\n"
              "  plugins                      list registered parts\n"
              "  compare RUN_DIR... [--by method] [--baseline grpo]   report comparing runs\n"
              "  credit-bench [key=value ...] [--k 32] [--dry-run]   score estimators against Monte-Carlo truth\n"
              "  eval [key=value ...] [--data FILE] [--samples 4]   held-out accuracy without training", file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")
    COMMANDS[argv[0]](argv[1:])
