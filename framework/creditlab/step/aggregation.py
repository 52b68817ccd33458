"""Aggregating per-token losses over a mini-batch, invariant to how the batch is split.

Shapes: ``B`` sequences (``b`` in one micro-batch), ``T`` response positions. A position is
*trained* when its ``loss_mask > 0``; the mask value is used as a weight (``ℓ·M``).

**Normalization invariant to micro-batching, gradient accumulation and data parallel.** The
denominators (trained-token count, count of sequences with >= 1 trained token, the constant
``T_max``) are computed ONCE for the whole mini-batch into :class:`MiniBatchStats`. Each call of
:func:`aggregate` / :func:`policy_loss` returns one micro-batch's *contribution*: the sum of the
contributions of all micro-batches of a rank, times ``1/world_size`` summed over ranks, equals the
full mini-batch loss. Gradients: backward each contribution (accumulating into ``.grad``) and let
DDP *average* gradients over ranks — contributions are multiplied by ``stats.world_size`` so that
this average is exactly the full-batch gradient. With ``world_size=1``: sum of contributions =
full loss.

**Aggregation modes** (``Σ_t`` over a sequence's trained tokens, ``mean_i`` over the N sequences
with at least one trained token — sequences with no trained token contribute 0 and are not
counted; an all-masked mini-batch gives loss 0):

* ``token-mean``: ``Σ_{i,t} ℓM / Σ_{i,t} M``.
* ``seq-mean-token-mean``: ``mean_i [Σ_t ℓM / Σ_t M]``.
* ``seq-mean-token-sum``: ``mean_i Σ_t ℓM``.
* ``seq-mean-token-sum-norm``: ``mean_i Σ_t ℓM / T_max`` = ``Σ_{i,t} ℓM / (N·T_max)``.
  Deviation from METHODS.md's table (``Σ_{i,t} ℓM / T_max``): we keep the ``1/G`` mean over
  sequences of the Dr. GRPO objective (arXiv 2503.20783, eq. for Dr. GRPO), so the scale does not
  grow with the mini-batch size. ``T_max`` is ``LossConfig.norm_constant`` (the generation budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class MiniBatchStats:
    """Denominators of one mini-batch (all micro-batches, all ranks), computed once.

    Attributes:
        num_seqs: Sequences with at least one trained token.
        num_tokens: ``Σ M`` over the mini-batch (the trained-token count for 0/1 masks).
        norm_constant: ``T_max`` for ``seq-mean-token-sum-norm`` (else unused, may be None).
        world_size: Data-parallel ranks whose gradients DDP averages; contributions are scaled by
            it so that the average equals the full-batch gradient.
    """

    num_seqs: int
    num_tokens: float
    norm_constant: float | None = None
    world_size: int = 1

    @classmethod
    def from_mask(
        cls, loss_mask: torch.Tensor, cfg: Any = None, world_size: int = 1
    ) -> MiniBatchStats:
        """Stats from the whole mini-batch's mask.

        Args:
            loss_mask: (B, T) mask of the WHOLE mini-batch (every micro-batch, every rank). On a
                real multi-process run, build each rank's stats from its shard and combine them
                with :meth:`all_reduce` instead.
            cfg: A :class:`~creditlab.step.losses.LossConfig` (supplies ``norm_constant``), or None.
            world_size: Number of data-parallel ranks.
        """
        m = loss_mask.detach().to(torch.float64)
        return cls(
            num_seqs=int(((m > 0).any(dim=-1)).sum()),
            num_tokens=float(torch.where(m > 0, m, torch.zeros_like(m)).sum()),
            norm_constant=cfg.norm_constant if cfg is not None else None,
            world_size=world_size,
        )

    @classmethod
    def combine(cls, parts: list[MiniBatchStats], world_size: int = 1) -> MiniBatchStats:
        """Sum the counts of disjoint shards (e.g. each rank's ``from_mask`` of its shard)."""
        return cls(
            num_seqs=sum(p.num_seqs for p in parts),
            num_tokens=sum(p.num_tokens for p in parts),
            norm_constant=parts[0].norm_constant if parts else None,
            world_size=world_size,
        )

    def all_reduce(self, group: object | None = None) -> MiniBatchStats:
        """Sum the counts over the ranks of ``torch.distributed`` (identity when not running).

        A collective: every rank must call it, with the stats of its own shard.
        """
        if not (dist.is_available() and dist.is_initialized()):
            return self
        device = None
        if dist.get_backend(group) == "nccl":  # NCCL reduces CUDA tensors only
            device = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([float(self.num_seqs), self.num_tokens], dtype=torch.float64,
                         device=device)
        dist.all_reduce(t, group=group)
        return MiniBatchStats(
            int(t[0].item()), float(t[1].item()), self.norm_constant, dist.get_world_size(group)
        )


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, cfg: Any, stats: MiniBatchStats
) -> torch.Tensor:
    """One micro-batch's contribution to the mini-batch loss (see the module docstring).

    Args:
        per_token: (b, T) per-token loss; any value at untrained positions (even inf/NaN).
        mask: (b, T) loss mask of this micro-batch (weights; trained where > 0).
        cfg: A :class:`~creditlab.step.losses.LossConfig` (supplies ``agg``).
        stats: Denominators of the whole mini-batch.

    Returns:
        Scalar: ``world_size · Σ_{rows of this micro-batch} (row numerator) / denominator``;
        always connected to ``per_token``'s graph (0 when nothing is trained).
    """
    trained = mask > 0
    weighted = torch.where(trained, per_token, torch.zeros_like(per_token)) * torch.where(
        trained, mask, torch.zeros_like(mask)
    ).to(per_token.dtype)
    row_sum = weighted.sum(-1)  # (b,)
    if cfg.agg == "token-mean":
        total, denom = row_sum.sum(), stats.num_tokens
    elif cfg.agg == "seq-mean-token-mean":
        row_tokens = torch.where(trained, mask, torch.zeros_like(mask)).sum(-1).to(row_sum.dtype)
        total = (row_sum / row_tokens.clamp(min=torch.finfo(row_sum.dtype).tiny)).sum()
        denom = stats.num_seqs
    elif cfg.agg == "seq-mean-token-sum":
        total, denom = row_sum.sum(), stats.num_seqs
    elif cfg.agg == "seq-mean-token-sum-norm":
        if stats.norm_constant is None:
            raise ValueError("seq-mean-token-sum-norm needs stats.norm_constant (T_max).")
        total, denom = row_sum.sum(), stats.num_seqs * stats.norm_constant
    else:
        raise ValueError(f"agg must be one of {', '.join(AGG_MODES)}; got {cfg.agg!r}.")
    if denom <= 0:  # nothing trained anywhere: a zero that still backpropagates (DDP needs it)
        return total * 0.0
    return total * (stats.world_size / float(denom))


def micro_batch_slices(n: int, micro_batch_size: int) -> list[slice]:
    """Row slices of a mini-batch of ``n`` rows; ``micro_batch_size=0`` gives one slice."""
    size = n if micro_batch_size <= 0 else micro_batch_size
    return [slice(i, min(i + size, n)) for i in range(0, n, max(size, 1))]
