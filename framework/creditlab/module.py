"""The RL step as a LightningModule: rollouts -> rewards -> segments -> advantages -> update.

The step never branches on the method: every estimator receives the same
:class:`~creditlab.types.RolloutBatch` and :class:`~creditlab.interfaces.PolicyHandle`, every reset
selector the same failed trajectories (through the planner). A method is a config preset.

Randomness is a pure function of ``(seed, rl_step)``: a run resumed from a checkpoint draws the
same prompts and samples as an uninterrupted one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch

from creditlab.credit import CreditMetrics
from creditlab.evaluation import EvalConfig, evaluate
from creditlab.interfaces import AdvantageEstimator, GenerationBackend, Segmenter, Verifier
from creditlab.losses import LossConfig, MiniBatchStats, entropy_from_logits, gather_logprobs, policy_loss
from creditlab.policy import ModelPolicyHandle
from creditlab.rollout import RolloutConfig, RolloutPlanner, collate, with_segments
from creditlab.types import Problem, RolloutBatch


@dataclass
class Parts:
    """The plug-in parts of one run, built through the registries."""

    backend: GenerationBackend
    verifier: Verifier
    segmenter: Segmenter
    advantage: AdvantageEstimator
    planner: RolloutPlanner


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A 63-bit seed derived from the run seed, the RL step and a stream id."""
    return (seed * 1_000_003 + step * 7_919 + stream * 104_729) % (2**63 - 1)


class CreditAssignmentModule(L.LightningModule):
    """Trains ``model`` with the given parts.

    Args:
        model: The policy (``transformers`` causal LM); registered as ``self.policy``.
        tokenizer: Its tokenizer.
        parts: Backend, verifier, segmenter, estimator and planner.
        problems_for_step: ``step -> list[Problem]`` (the datamodule's, deterministic in step).
        eval_problems: Held-out problems for periodic evaluation.
        loss: Loss settings; rollout: sampling settings; eval_cfg: evaluation settings.
        optimizer: ``params -> torch.optim.Optimizer`` (a Hydra partial).
        seed: The run seed.
        grad_clip: Max gradient norm (0 = off).
        reference: Frozen reference policy for a KL penalty, or None.
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
    ) -> None:
        super().__init__()
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
        self._reference = [reference] if reference is not None else []  # not a submodule
        self.credit = CreditMetrics(tokenizer, rollout.delimiter, rollout.success_reward)
        self.counters = {"tokens/trained": 0.0, "tokens/generated": 0.0, "time/train_s": 0.0}

    # -- Lightning plumbing ----------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(params=[p for p in self.policy.parameters() if p.requires_grad])

    @property
    def rl_step(self) -> int:
        """RL steps (rollout batches) done; Lightning counts optimizer steps."""
        return self.global_step // self.loss_cfg.updates_per_batch

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["creditlab_counters"] = dict(self.counters)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.counters.update(checkpoint.get("creditlab_counters", {}))

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    def handle(self, step: int, stream: int = 0) -> ModelPolicyHandle:
        rng = torch.Generator().manual_seed(step_seed(self.seed, step, stream))
        return ModelPolicyHandle(
            self.policy, self.tokenizer, self.parts.backend, rng,
            self.rollout_cfg.temperature, self.loss_cfg.micro_batch_size,
            rollout_fn=self.parts.planner.sample_and_score,
        )

    def on_train_start(self) -> None:
        if self.rl_step == 0 and self.eval_cfg.every > 0:
            self.run_evaluation(0)

    def on_train_end(self) -> None:
        if self.eval_cfg.every > 0 and self.rl_step % self.eval_cfg.every != 0:
            self.run_evaluation(self.rl_step)

    def run_evaluation(self, step: int) -> dict[str, float]:
        metrics = evaluate(
            self.parts.backend, self.parts.verifier, self.handle(step, stream=1),
            self.eval_problems, self.eval_cfg, self.rollout_cfg, seed=step_seed(self.seed, step, 2),
        )
        self.log_metrics(metrics, step)
        return metrics

    # -- the RL step -----------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> None:
        step, t0 = self.rl_step, time.perf_counter()
        ctx = self.handle(step)
        self.parts.backend.metrics()  # drop the evaluation's counts: train/backend/* is this step's

        # 1. Rollouts: the planner samples groups (and resets), the verifier scores them.
        problems = self.problems_for_step(step)
        trajectories = self.parts.planner.collect(problems, ctx, seed=step_seed(self.seed, step))
        t_gen = time.perf_counter() - t0

        # 2. Pad into tensors, segment, estimate per-token advantages.
        rollout = collate(trajectories, self.tokenizer.pad_token_id, self.rollout_cfg.truncation)
        rollout = with_segments(rollout, self.parts.segmenter.segment(rollout))
        advantages = self.parts.advantage.estimate(rollout, ctx)
        assert advantages.values.shape == rollout.loss_mask.shape, "estimator returned wrong shape"

        # 3. Policy-gradient updates on the batch.
        t1 = time.perf_counter()
        update_metrics = self.update(rollout, advantages.values)
        t_train = time.perf_counter() - t1

        # 4. Sync generation weights, then log.
        self.parts.backend.load_weights(None)
        generated = self.parts.planner.take_generated_tokens() + ctx.generated_tokens
        metrics = self.step_metrics(rollout, generated)
        metrics.update(update_metrics)
        metrics.update({f"train/advantage/{k}": v for k, v in advantages.metrics.items()})
        metrics.update({f"train/credit/{k}": v for k, v in self.credit(rollout, advantages.values).items()})
        for kind, part in (
            ("backend", self.parts.backend),
            ("advantage", self.parts.advantage), ("verifier", self.parts.verifier),
            ("segmenter", self.parts.segmenter), ("rollout", self.parts.planner),
            ("reset_selector", self.parts.planner.reset_selector),
        ):
            if part is None:
                continue
            metrics.update({f"train/{kind}/{k}": v for k, v in part.metrics().items()})
        self.counters["time/train_s"] += time.perf_counter() - t0
        metrics.update({
            "time/step_s": time.perf_counter() - t0, "time/generate_s": t_gen,
            "time/update_s": t_train, **self.counters,
        })
        self.log_metrics(metrics, step + 1)
        self.log("reward", metrics["train/reward/mean"], prog_bar=True, logger=False)
        if self.eval_cfg.every > 0 and (step + 1) % self.eval_cfg.every == 0:
            self.log("eval_acc", self.run_evaluation(step + 1)["eval/pass@1"], prog_bar=True, logger=False)

    def update(self, rollout: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """``updates_per_batch`` optimizer steps over mini-batches of the rollout batch.

        Args:
            rollout: The padded batch, B rows.
            advantages: (B, T) per-token advantages.
        """
        cfg, opt = self.loss_cfg, self.optimizers()
        n_mini = cfg.updates_per_batch
        old = self.old_logprobs(rollout) if n_mini > 1 else None
        ref = self.reference_logprobs(rollout) if cfg.kl_coef > 0 else None
        order = torch.randperm(rollout.size, generator=torch.Generator().manual_seed(step_seed(self.seed, self.rl_step, 3)))
        sums: dict[str, float] = {}
        for rows in torch.tensor_split(order, n_mini):
            stats = MiniBatchStats.from_mask(rollout.loss_mask[rows], cfg)
            micro = cfg.micro_batch_size or len(rows)
            for mrows in torch.split(rows, micro):
                logits = self.response_logits(rollout, mrows)
                logprobs = gather_logprobs(logits, rollout.response_ids[mrows], self.temperature)
                old_lp = old[mrows] if old is not None else logprobs.detach()
                ref_lp = ref[mrows] if ref is not None else None
                loss, parts = policy_loss(
                    logprobs, old_lp, advantages[mrows], rollout.loss_mask[mrows], cfg, stats, ref_lp,
                    engine_logprobs=rollout.gen_logprobs[mrows],
                )
                self.manual_backward(loss)
                with torch.no_grad():
                    ent = (entropy_from_logits(logits.detach(), self.temperature) * rollout.loss_mask[mrows]).sum()
                self._add(sums, "train/entropy", float(ent) / max(float(rollout.loss_mask.sum()), 1.0))
                for k, v in parts.items():  # shares of the mini-batch value: sum, mean over minis
                    if k.endswith("_max"):  # maxima combine by max
                        sums[f"train/{k}"] = max(sums.get(f"train/{k}", 0.0), float(v))
                    else:
                        self._add(sums, f"train/{k}", float(v) / n_mini)
            self._add(sums, "train/grad_norm", self.clip_gradients_and_norm() / n_mini)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return sums

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def temperature(self) -> float:
        t = self.rollout_cfg.temperature
        return t if t > 0 else 1.0

    def response_logits(self, rollout: RolloutBatch, rows: torch.Tensor, model: Any = None) -> torch.Tensor:
        """(b, T, V) logits predicting each response token of ``rows``.

        Each distinct prompt among ``rows`` is run once and its KV cache shared by the rows (see
        :func:`creditlab.forward.response_logits`); equal to the plain forward's logits.
        """
        from creditlab.forward import response_logits

        model = model if model is not None else self.policy
        ids, mask = rollout.input_ids[rows], rollout.attention_mask[rows]
        return response_logits(model, ids, mask, rollout.prompt_len)

    @torch.no_grad()
    def old_logprobs(self, rollout: RolloutBatch, model: Any = None) -> torch.Tensor:
        """(B, T) log-probs of the response tokens before any update (or under ``model``)."""
        micro = self.loss_cfg.micro_batch_size or rollout.size
        out = []
        for rows in torch.split(torch.arange(rollout.size), micro):
            logits = self.response_logits(rollout, rows, model)
            out.append(gather_logprobs(logits, rollout.response_ids[rows], self.temperature))
        return torch.cat(out) * rollout.response_mask

    def reference_logprobs(self, rollout: RolloutBatch) -> torch.Tensor:
        return self.old_logprobs(rollout, model=self._reference[0])

    def clip_gradients_and_norm(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if not params:
            return 0.0
        max_norm = self.grad_clip if self.grad_clip > 0 else float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    @staticmethod
    def _add(sums: dict[str, float], key: str, value: float) -> None:
        sums[key] = sums.get(key, 0.0) + value

    def step_metrics(self, rollout: RolloutBatch, generated: int) -> dict[str, float]:
        """Reward and length statistics; updates the token counters (``generated`` = every token
        sampled this step, trained or not)."""
        rewards = rollout.rewards
        lengths = rollout.response_mask.sum(1)
        self.counters["tokens/trained"] += float(rollout.loss_mask.sum())
        self.counters["tokens/generated"] += float(generated)
        return {
            "train/reward/mean": float(rewards.mean()),
            "train/reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
            "train/response_length/mean": float(lengths.mean()),
            "train/response_length/max": float(lengths.max()),
            "train/rows": float(rollout.size),
            "train/tokens_generated": float(generated),
        }
