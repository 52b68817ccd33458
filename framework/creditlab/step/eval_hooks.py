"""The LightningModule's evaluation hooks, beside :mod:`creditlab.step.evaluation`: the held-out
evaluation before the first RL step, every ``eval.every`` steps (called from the step) and after
the last, its metrics logged and every problem's outcome handed to the run's problem log
(:class:`ProblemLogger`; the run's ``eval_problems.jsonl`` is :class:`creditlab.run.loggers.JsonlLogger`).
"""

from __future__ import annotations

import abc
import time
from contextlib import nullcontext
from typing import Any

from creditlab.step.distributed import rank_and_world, reduce_metrics, shard
from creditlab.step.evaluation import evaluate_problems, gather_outcomes
from creditlab.types import Max


class ProblemLogger(abc.ABC):
    """A logger that keeps each evaluation's per-problem record (one ``eval_problems.jsonl`` line,
    format: :mod:`creditlab.analysis.problem_records`); :func:`log_problems` hands records to these
    only."""

    @abc.abstractmethod
    def log_problems(self, record: dict[str, Any]) -> None:
        """Keep one evaluation's per-problem record."""


def log_problems(loggers: list[Any], record: dict[str, Any]) -> None:
    """Hand one evaluation's per-problem record to the run's :class:`ProblemLogger` (none: a module
    outside a Trainer); an evaluation that scored nothing writes no line."""
    for logger in loggers:
        if isinstance(logger, ProblemLogger) and record["ids"]:
            logger.log_problems(record)


class EvaluationHooks:
    """Evaluation of :class:`~creditlab.step.module.CreditAssignmentModule` (a mixin of it: the
    module's ``eval_cfg``, ``eval_problems``, ``parts``, ``handle``, ``seed_for``, ``log_metrics``)."""

    def on_train_start(self) -> None:
        if self.rl_step == 0 and self.eval_cfg.every > 0:
            self.run_evaluation(0)

    def on_train_end(self) -> None:
        if self.eval_cfg.every > 0 and self.rl_step % self.eval_cfg.every != 0:
            self.run_evaluation(self.rl_step)

    def run_evaluation(self, step: int) -> dict[str, float]:
        """Evaluate this rank's share of the held-out problems; log the metrics and per-problem outcomes
        (and ``time/eval_s``, the evaluation's wall-clock: the slowest rank's)."""
        t0 = time.perf_counter()
        count = self.eval_cfg.problems or len(self.eval_problems)
        mine = shard(self.eval_problems[:count], *rank_and_world())
        # Under the precision training rollouts sample in (bf16 autocast under bf16-mixed), also
        # from on_train_start/on_train_end, which Lightning runs outside it.
        precision = self._trainer.precision_plugin.train_step_context() if self._trainer else nullcontext()
        with precision:
            metrics, outcomes = evaluate_problems(
                self.parts.backend, self.parts.verifier, self.handle(step, stream=1),
                mine, self.eval_cfg, self.rollout_cfg, seed=self.seed_for(step, 2),
            )
        metrics = reduce_metrics({**metrics, "time/eval_s": Max(time.perf_counter() - t0)}, weight=len(mine))
        self.log_metrics(metrics, step)
        log_problems(self.loggers, gather_outcomes(outcomes).record(step, self.eval_cfg.samples))  # collective
        return metrics
