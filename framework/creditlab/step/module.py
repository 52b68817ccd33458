"""The RL step as a LightningModule: rollouts -> rewards -> segments -> advantages -> update.

The step never branches on the method: the rollout strategy builds the step's trajectories through
the run's sampler, every estimator receives the same :class:`~creditlab.types.RolloutBatch` and
:class:`~creditlab.interfaces.PolicyHandle`. A method is a config preset.

Randomness is a pure function of ``(seed, rl_step, rank)``: a run resumed from a checkpoint draws
the same prompts and samples as an uninterrupted one.

Data parallel (Lightning's DDP; :mod:`creditlab.step.distributed`): each rank runs the step on its share
of the prompts, the loss denominators are global and DDP averages the gradients, so the update is
the single-process update of the global batch; metrics are global and rank 0 logs them.

The module's policy-gradient update is :mod:`creditlab.step.update`, its evaluation hooks
:mod:`creditlab.step.eval_hooks` (mixins of :class:`CreditAssignmentModule`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import torch

from creditlab.interfaces import (
    AdvantageEstimator,
    GenerationBackend,
    Part,
    ResetSelector,
    RolloutStrategy,
    Segmenter,
    Verifier,
)
from creditlab.step.credit import CreditMetrics
from creditlab.step.distributed import rank_and_world, reduce_metrics, shard
from creditlab.step.eval_hooks import EvaluationHooks
from creditlab.step.evaluation import EvalConfig
from creditlab.step.losses import LossConfig
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import RolloutSampler, collate, with_segments
from creditlab.step.step_metrics import batch_metrics, one_writer_per_key, warn_if_no_answers
from creditlab.step.update import PolicyUpdate
from creditlab.types import Advantages, Problem, RolloutBatch, RolloutConfig, Trajectory


@dataclass
class Parts:
    """The plug-in parts of one run (built through the registries) and the sampler behind its
    rollout strategy."""

    backend: GenerationBackend
    verifier: Verifier
    segmenter: Segmenter
    advantage: AdvantageEstimator
    rollout: RolloutStrategy
    sampler: RolloutSampler
    reset_selector: ResetSelector

    def named(self) -> list[tuple[str, Part | RolloutSampler]]:
        """``(kind, part)`` of every part whose ``metrics()`` are logged as ``train/<kind>/*``."""
        return [
            ("backend", self.backend), ("advantage", self.advantage), ("verifier", self.verifier),
            ("segmenter", self.segmenter), ("rollout", self.sampler), ("rollout", self.rollout),
            ("reset_selector", self.reset_selector),
        ]


def step_seed(seed: int, step: int, stream: int = 0, rank: int = 0) -> int:
    """A 63-bit seed derived from the run seed, the RL step, a stream id and the data-parallel
    rank (rank 0 draws what a single process draws)."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729 + rank * 15_485_863) % (2**63 - 1)


class CreditAssignmentModule(EvaluationHooks, PolicyUpdate, L.LightningModule):
    """Trains ``model`` with the given parts.

    Args:
        model: The policy (``transformers`` causal LM); registered as ``self.policy``.
        tokenizer: Its tokenizer.
        parts: Backend, verifier, segmenter, estimator, rollout strategy, sampler, selector.
        problems_for_step: ``step -> list[Problem]`` (the datamodule's, deterministic in step).
        eval_problems: Held-out problems for periodic evaluation.
        loss: Loss settings; rollout: sampling settings; eval_cfg: evaluation settings.
        optimizer: ``params -> torch.optim.Optimizer`` (a Hydra partial).
        seed: The run seed.
        grad_clip: Max gradient norm (0 = off).
        reference: Frozen reference policy for a KL penalty, or None.
        names: The configured names of the run's parts (``task``, ``verifier``), for messages.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        parts: Parts,
        problems_for_step: Any,
        eval_problems: Sequence[Problem],
        loss: LossConfig,
        rollout: RolloutConfig,
        eval_cfg: EvalConfig,
        optimizer: Any,
        seed: int,
        grad_clip: float = 1.0,
        reference: Any | None = None,
        names: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.names = {"task": "?", "verifier": type(getattr(parts, "verifier", None)).__name__, **(names or {})}
        self._answers_checked = False
        self.automatic_optimization = False
        self.policy = model
        self.tokenizer = tokenizer
        self.parts = parts
        self.problems_for_step = problems_for_step
        self.eval_problems = list(eval_problems)
        self.loss_cfg, self.rollout_cfg, self.eval_cfg = loss, rollout, eval_cfg
        self.make_optimizer = optimizer
        self.seed = seed
        self.grad_clip = grad_clip
        self._reference = [reference] if reference is not None else []  # not a submodule: see _apply
        self.credit = CreditMetrics(tokenizer, rollout.delimiter, rollout.success_reward)
        self.counters = {"tokens/trained": 0.0, "tokens/generated": 0.0, "time/train_s": 0.0}
        # Frozen parameters (a LoRA run's base weights) are not checkpointed: they are reloaded
        # from the model's path, so resuming restores exactly what training changed.
        self.frozen_keys = {  # tied weights too: each name of a shared tensor is a state-dict key
            f"policy.{n}" for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad
        }
        self.strict_loading = not self.frozen_keys

    # -- Lightning plumbing ----------------------------------------------------------------------
    def _apply(self, fn: Any, recurse: bool = True) -> CreditAssignmentModule:
        """Device and dtype moves (``.to``, ``.cuda``, Lightning's placement) reach the KL
        reference too: it is kept out of the submodules so that it is neither checkpointed nor
        trained nor wrapped by a strategy, but it must run where the policy runs."""
        for reference in self._reference:
            reference._apply(fn, recurse)
        return super()._apply(fn, recurse)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(params=[p for p in self.policy.parameters() if p.requires_grad])

    @property
    def strategy(self) -> Any:
        """Lightning's strategy (None outside a Trainer, e.g. in unit tests)."""
        return self._trainer.strategy if self._trainer is not None else None

    @property
    def rl_step(self) -> int:
        """RL steps (rollout batches) done; Lightning counts optimizer steps."""
        return self.global_step // self.loss_cfg.updates_per_batch

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["creditlab_counters"] = dict(self.counters)
        for key in self.frozen_keys:
            checkpoint["state_dict"].pop(key, None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.counters.update(checkpoint.get("creditlab_counters", {}))
        saved, own = set(checkpoint["state_dict"]), set(self.state_dict())
        missing, unexpected = own - saved - self.frozen_keys, saved - own
        if missing or unexpected:  # loading is not strict when frozen keys are left out
            raise RuntimeError(
                f"checkpoint does not match the model: missing {sorted(missing)[:5]}, unexpected "
                f"{sorted(unexpected)[:5]} (was it written with other model or LoRA settings?)"
            )

    def seed_for(self, step: int, stream: int = 0) -> int:
        """The seed of ``stream`` at RL step ``step`` on this rank."""
        return step_seed(self.seed, step, stream, rank_and_world()[0])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def handle(self, step: int, stream: int = 0) -> ModelPolicyHandle:
        rng = torch.Generator().manual_seed(self.seed_for(step, stream))
        return ModelPolicyHandle(
            self.policy, self.tokenizer, self.parts.backend, rng,
            self.rollout_cfg.temperature, self.loss_cfg.micro_batch_size,
            rollout_fn=self.parts.sampler, chat_template=self.rollout_cfg.chat_template,
            fused_head=self.loss_cfg.fused_head, micro_batch_tokens=self.loss_cfg.token_budget,
        )

    # -- the RL step -----------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> None:
        step, t0 = self.rl_step, time.perf_counter()
        ctx = self.handle(step)
        self.parts.backend.reset_metrics()  # train/backend/* is this step's, not the evaluation's

        # 1. Rollouts for this rank's share of the step's prompts (all of them in one process):
        #    the rollout strategy places what the sampler generates and the verifier scores.
        problems = shard(self.problems_for_step(step), *rank_and_world())
        trajectories = self.parts.rollout.collect(problems, ctx, self.parts.sampler, self.seed_for(step))
        t_gen = time.perf_counter() - t0
        if not self._answers_checked:
            self._answers_checked = True
            self.warn_if_no_answers(trajectories)

        # 2. Pad into tensors, segment, estimate per-token advantages.
        #    The batch is moved to the policy's device once; so are the advantages (an estimator
        #    may build them on the host).
        rollout = collate(trajectories, self.tokenizer.pad_token_id, self.rollout_cfg.truncation, self.device)
        rollout = with_segments(rollout, self.parts.segmenter.segment(rollout))
        advantages = self.parts.advantage.estimate(rollout, ctx)
        assert advantages.values.shape == rollout.loss_mask.shape, "estimator returned wrong shape"
        advantages = replace(advantages, values=advantages.values.to(rollout.device))

        # 3. Policy-gradient updates on the batch (the backend's caches freed first).
        self.parts.backend.release()
        t1 = time.perf_counter()
        update_metrics = self.update(rollout, advantages.values)
        t_train = time.perf_counter() - t1

        # 4. Sync generation weights, then log the global metrics (rank 0 writes them).
        self.parts.backend.load_weights(None)
        generated = self.parts.sampler.take_generated_tokens() + ctx.generated_tokens
        metrics = self.step_metrics(rollout, generated)
        metrics.update(update_metrics)
        metrics.update(reduce_metrics(self.part_metrics(rollout, advantages), weight=rollout.size))
        self.counters["time/train_s"] += time.perf_counter() - t0
        metrics.update({
            "time/step_s": time.perf_counter() - t0, "time/generate_s": t_gen,
            "time/update_s": t_train, **self.counters,
        })
        self.log_metrics(metrics, step + 1)
        self.log("reward", metrics["train/reward/mean"], prog_bar=True, logger=False)
        if self.eval_cfg.every > 0 and (step + 1) % self.eval_cfg.every == 0:
            self.log("eval_acc", self.run_evaluation(step + 1)["eval/pass@1"], prog_bar=True, logger=False)

    def warn_if_no_answers(self, trajectories: Sequence[Trajectory]) -> bool:
        """See :func:`creditlab.step.step_metrics.warn_if_no_answers`."""
        return warn_if_no_answers(trajectories, self.names)

    def step_metrics(self, rollout: RolloutBatch, generated: int) -> dict[str, float]:
        """Reward and length statistics of the global batch (every rank's rows); updates the token
        counters (``generated`` = every token this rank sampled this step, trained or not)."""
        metrics, trained, generated = batch_metrics(rollout, generated)
        self.counters["tokens/trained"] += trained
        self.counters["tokens/generated"] += generated
        return metrics

    def part_metrics(self, rollout: RolloutBatch, advantages: Advantages) -> dict[str, float]:
        """This rank's estimator, credit and part metrics (``train/<kind>/<key>``; raises
        :class:`~creditlab.step.step_metrics.MetricClash` when two channels write one key)."""
        channels = [
            ("advantage", f"{type(self.parts.advantage).__name__}.estimate()", dict(advantages.metrics)),
            ("credit", "CreditMetrics", self.credit(rollout, advantages.values)),
        ]
        channels += [(kind, f"{type(part).__name__}.metrics()", part.metrics()) for kind, part in self.parts.named()]
        return one_writer_per_key(channels)
