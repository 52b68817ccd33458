"""The policy-gradient update of one RL step (a mixin of
:class:`~creditlab.step.module.CreditAssignmentModule`): ``updates_per_batch`` optimizer steps over
mini-batches of the rollout batch, micro-batched, with global loss denominators under data
parallelism (:mod:`creditlab.step.distributed`), the shared-prompt forward
(:mod:`creditlab.step.forward`) and the losses of :mod:`creditlab.step.losses`."""

from __future__ import annotations

from typing import Any

import torch

from creditlab.step.aggregation import MiniBatchStats
from creditlab.step.distributed import all_max, gradient_sync, reduce_metrics
from creditlab.step.forward import response_logits as shared_prompt_logits
from creditlab.step.losses import LOSS_METRICS, ZERO_WITHOUT_ADVANTAGE, policy_loss
from creditlab.step.packing import columns, pack_rows
from creditlab.step.token_logprobs import response_logprobs
from creditlab.types import Max, Mean, RolloutBatch, Sum


class PolicyUpdate:
    """The update's methods (the module's ``policy``, ``loss_cfg``, ``rollout_cfg``, ``grad_clip``,
    KL reference, optimizer and Lightning's ``manual_backward``)."""

    def update(self, rollout: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """``updates_per_batch`` optimizer steps over mini-batches of the rollout batch.

        Under DDP each rank holds its own rows; denominators are summed over ranks, every rank
        runs as many micro-batches as the rank with the most (the extra ones train nothing) and
        the gradients are averaged once per mini-batch, with its last micro-batch. Returns global
        metrics.

        Args:
            rollout: The padded batch, B rows (this rank's).
            advantages: (B, T) per-token advantages.
        """
        cfg, opt = self.loss_cfg, self.optimizers()
        n_mini = cfg.updates_per_batch
        live = self.rows_with_signal(rollout, advantages) if cfg.skip_zero_advantage else None
        old = self.old_logprobs(rollout, rows=None if live is None else torch.nonzero(live).flatten()) \
            if n_mini > 1 else None
        ref = self.reference_logprobs(rollout) if cfg.kl_coef > 0 else None
        order = torch.randperm(rollout.size, generator=torch.Generator().manual_seed(self.seed_for(self.rl_step, 3)))
        order = order.to(rollout.device)
        minis = [  # each mini-batch's denominators over every rank, before any backward
            (rows, MiniBatchStats.from_mask(rollout.loss_mask[rows], cfg).all_reduce())
            for rows in torch.tensor_split(order, n_mini)
        ]
        run = [self.rows_run(rollout, rows, stats, live) for rows, stats in minis]
        ran = sum(s.num_tokens for _, s in run)
        run_tokens = max(ran, 1.0)  # what the per-token metrics average over
        sums: dict[str, float] = {}  # additive shares of each mini-batch's value, averaged over minis
        maxima: dict[str, float] = {}
        cells = 0  # response positions the micro-batches compute, padding included
        for (_, stats), (rows, run_stats) in zip(minis, run):
            chunks = self.micro_batches(rollout, rows) if len(rows) else []
            cells += sum(len(c) * self.columns(rollout, c)[1] for c in chunks)
            n_chunks = int(all_max([len(chunks)])[0])
            if live is not None:  # every parameter gets a gradient, zero if need be (AdamW steps on it)
                n_chunks = max(n_chunks, 1)
            chunks += [None] * (n_chunks - len(chunks))
            # skipped rows add exact zeros to the loss; the other shares become means over the rows run
            scale = 1.0 if live is None else stats.num_tokens / max(run_stats.num_tokens, 1.0)
            for i, mrows in enumerate(chunks):
                with gradient_sync(self.strategy, enabled=i == n_chunks - 1):
                    parts = self.backward_rows(rollout, advantages, mrows, stats, old, ref)
                self._add(sums, "train/entropy", parts.pop("entropy", 0.0) / run_tokens)
                for k, v in parts.items():
                    if LOSS_METRICS[k] == "max":
                        maxima[f"train/{k}"] = max(maxima.get(f"train/{k}", 0.0), v)
                    else:
                        self._add(sums, f"train/{k}", v / n_mini * (1.0 if k in ZERO_WITHOUT_ADVANTAGE else scale))
            grad_norm = self.clip_gradients_and_norm()
            self._add(sums, "train/grad_norm", grad_norm / n_mini)
            opt.step()
            opt.zero_grad(set_to_none=True)
            # Under bf16-mixed the whole training step is one autocast context, whose cached bf16
            # copies of weights (peft's adapters) would outlive this step: the next mini-batch
            # would run the old weights (tests/unit/test_module.py)
            torch.clear_autocast_cache()
        if live is not None and ran == 0:  # no row ran on any rank: no entropy was measured (not 0)
            sums.pop("train/entropy", None)
        out: dict[str, float] = {k: Sum(v) for k, v in sums.items()}
        out["train/grad_norm"] = Mean(sums["train/grad_norm"])  # each rank holds the same norm
        # the share of the response positions computed that are padding (this rank's, averaged)
        real = rollout.response_mask.sum() if live is None else rollout.response_mask[live].sum()
        out["train/padding"] = Mean(1.0 - float(real) / cells if cells else 0.0)
        out.update({k: Max(v) for k, v in maxima.items()})
        if live is not None:  # the loss is 0 when no row ran; this rank's share of rows skipped, averaged
            out.update({f"train/{k}": Sum(0.0) for k in ZERO_WITHOUT_ADVANTAGE if f"train/{k}" not in out})
            out["train/skipped_rows"] = Mean(1.0 - float(live.sum()) / max(rollout.size, 1))
        return reduce_metrics(out, weight=1.0)

    @staticmethod
    def rows_with_signal(rollout: RolloutBatch, advantages: torch.Tensor) -> torch.Tensor:
        """(B,) bool: the rows with a non-zero advantage on a trained token (``loss.skip_zero_advantage``
        runs only these; NaN counts as non-zero, so it still reaches the loss)."""
        return ((advantages != 0) & (rollout.loss_mask > 0)).any(dim=1)

    def rows_run(
        self, rollout: RolloutBatch, rows: torch.Tensor, stats: MiniBatchStats, live: torch.Tensor | None,
    ) -> tuple[torch.Tensor, MiniBatchStats]:
        """A mini-batch's rows that the update runs, and their denominators over every rank:
        all of them, or with ``live`` (B,) bool only the live ones (a collective then)."""
        if live is None:
            return rows, stats
        kept = rows[live[rows]]
        return kept, MiniBatchStats.from_mask(rollout.loss_mask[kept], self.loss_cfg).all_reduce()

    def backward_rows(
        self, rollout: RolloutBatch, advantages: torch.Tensor, rows: torch.Tensor | None,
        stats: MiniBatchStats, old: torch.Tensor | None, ref: torch.Tensor | None,
    ) -> dict[str, float]:
        """Backpropagate the contribution of ``rows`` (b,) to their mini-batch's loss.

        Args:
            rollout, advantages: As in :meth:`update`.
            rows: Row indices, or None when this rank has no more rows in the mini-batch than
                other ranks have micro-batches: one row is then run with no trained token (an
                exact zero that still takes part in the strategy's gradient reduction).
            stats: The whole mini-batch's denominators (every rank).
            old, ref: (B, T) old / reference log-probs, or None.

        Returns:
            The loss metric shares, plus ``entropy`` summed over the rows' trained tokens.
        """
        pad = rows is None
        rows = torch.zeros(1, dtype=torch.long, device=rollout.device) if pad else rows
        t = self.columns(rollout, rows)[1]  # the rows' longest response: every later column is padding
        mask = rollout.loss_mask[rows, :t] * (0.0 if pad else 1.0)
        logprobs, entropies = self.token_logprobs(rollout, rows)
        old_lp = old[rows, :t] if old is not None else logprobs.detach()
        ref_lp = ref[rows, :t] if ref is not None else None
        loss, parts = policy_loss(
            logprobs, old_lp, advantages[rows, :t], mask, self.loss_cfg, stats, ref_lp,
            engine_logprobs=rollout.gen_logprobs[rows, :t],
        )
        self.manual_backward(loss)
        if pad:
            return {}
        entropy = (entropies * mask).sum()
        return {**{k: float(v) for k, v in parts.items()}, "entropy": float(entropy)}

    # -- helpers -----------------------------------------------------------------------------------
    @property
    def temperature(self) -> float:
        t = self.rollout_cfg.temperature
        return t if t > 0 else 1.0

    def token_logprobs(
        self, rollout: RolloutBatch, rows: torch.Tensor, model: Any = None, with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(b, t) float32 log-probs (differentiable) and entropies (detached, or None) of the
        first ``t`` response tokens of ``rows``, ``t`` their longest response: the columns that are
        padding in every one of the rows are cut (:func:`creditlab.step.packing.columns`). Through
        the fused LM head where ``loss.fused_head`` and the model allow it
        (:mod:`creditlab.step.token_logprobs`), else from the full logits."""
        model = model if model is not None else self.policy
        start, t = self.columns(rollout, rows)
        p = rollout.prompt_len
        return response_logprobs(
            model, rollout.input_ids[rows, start : p + t], rollout.attention_mask[rows, start : p + t],
            p - start, rollout.response_ids[rows, :t], rollout.response_mask[rows, :t], self.temperature,
            fused=self.loss_cfg.fused_head, with_entropy=with_entropy,
        )

    def micro_batches(self, rollout: RolloutBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """A mini-batch's rows in micro-batches (``loss.micro_batch_size`` rows,
        ``loss.micro_batch_tokens`` padded tokens at most, ``auto`` resolved by the runner:
        :func:`creditlab.step.packing.pack_rows`)."""
        prompt, response = rollout.row_lengths
        cfg = self.loss_cfg
        at = rows.cpu()
        return pack_rows(rows, prompt[at], response[at], cfg.micro_batch_size, cfg.token_budget,
                         rollout.prompt_keys[at] if cfg.token_budget else None)

    def columns(self, rollout: RolloutBatch, rows: torch.Tensor) -> tuple[int, int]:
        """``(start, t)``: the input columns ``[start, P + t)`` and response positions ``[0, t)``
        that ``rows`` need (:func:`creditlab.step.packing.columns`)."""
        prompt, response = rollout.row_lengths
        at = rows.cpu()
        return columns(rollout.prompt_len, prompt[at], response[at])

    def response_logits(self, rollout: RolloutBatch, rows: torch.Tensor, model: Any = None) -> torch.Tensor:
        """(b, T, V) logits predicting each response token of ``rows``.

        Each distinct prompt among ``rows`` is run once and its KV cache shared by the rows (see
        :func:`creditlab.step.forward.response_logits`); equal to the plain forward's logits.
        """
        model = model if model is not None else self.policy
        ids, mask = rollout.input_ids[rows], rollout.attention_mask[rows]
        return shared_prompt_logits(model, ids, mask, rollout.prompt_len)

    @torch.no_grad()
    def old_logprobs(self, rollout: RolloutBatch, model: Any = None, rows: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) log-probs of the response tokens before any update (or under ``model``), of
        every row or of ``rows`` (b,) only (the others 0)."""
        out = torch.zeros(rollout.response_mask.shape, dtype=torch.float32, device=rollout.device)
        every = torch.arange(rollout.size, device=rollout.device) if rows is None else rows
        for chunk in self.micro_batches(rollout, every) if len(every) else []:
            lp = self.token_logprobs(rollout, chunk, model, with_entropy=False)[0]
            out[chunk, : lp.shape[1]] = lp
        return out * rollout.response_mask

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
