"""Data parallelism inside one RL step: which prompts a rank owns, gradient sync, global metrics.

On R ranks (Lightning's DDP strategy) one RL step goes like this:

1. The step's P prompts are cut into R contiguous shares (:func:`shard`); each rank samples,
   scores, segments and estimates advantages for its share only. A prompt's whole group stays on
   one rank, so group advantages, and every estimator that looks at the batch group by group, see
   exactly what they would see in one process.
2. The loss denominators of each mini-batch are summed over the ranks
   (:meth:`creditlab.step.losses.MiniBatchStats.all_reduce`), every rank backpropagates its rows'
   contribution times R, and DDP averages the gradients: the update equals the single-process
   update of the global batch, for every aggregation mode (``tests/integration/test_ddp_gradients.py``).
   Every rank runs as many micro-batches as the rank with the most (an extra one runs a row with
   no trained token: an exact zero), so strategies that reduce gradients at every backward meet
   in the same collectives; under DDP every micro-batch but the last is backpropagated without
   the all-reduce (:func:`gradient_sync`): one all-reduce per optimizer step.
3. Metrics are made global (:func:`gather_floats`, :func:`all_sum`, :func:`reduce_metrics`) and
   logged by rank 0. Each value says how it combines (:class:`~creditlab.types.Sum`,
   :class:`~creditlab.types.Mean`, :class:`~creditlab.types.Max`, :class:`~creditlab.types.Min`;
   a plain float is a mean): never the key's spelling.

Every helper is the identity when ``torch.distributed`` is not initialized (one process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from creditlab.types import reduction

T = TypeVar("T")

__all__ = [
    "all_max", "all_sum", "gather_floats", "gradient_sync", "reduce_metrics", "rank_and_world",
    "shard",
]


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` without one."""
    return (dist.get_rank(), dist.get_world_size()) if _active() else (0, 1)


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """Rank ``rank``'s contiguous share of ``items``: sizes differ by at most one, the first
    ``len(items) % world`` ranks holding one more (as ``torch.tensor_split``)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    base, extra = divmod(len(items), world)
    start = rank * base + min(rank, extra)
    return list(items[start : start + base + (rank < extra)])


@contextlib.contextmanager
def gradient_sync(strategy: Any, enabled: bool) -> Iterator[None]:
    """Backward passes inside run with DDP's gradient all-reduce (``enabled``) or without it
    (gradients only accumulate locally; ``strategy.block_backward_sync()``). A strategy without
    that context (one device) always runs plainly."""
    block = getattr(strategy, "block_backward_sync", None)
    if enabled or block is None:
        yield
    else:
        with block():
            yield


def _all_reduce(values: Sequence[float], op: str) -> list[float]:
    if not _active():
        return [float(v) for v in values]
    device = None
    if dist.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return [float(v) for v in t.cpu()]


def all_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sums over the ranks (a collective: every rank calls it with as many values)."""
    return _all_reduce(values, "sum")


def all_max(values: Sequence[float]) -> list[float]:
    """Element-wise maxima over the ranks (a collective)."""
    return _all_reduce(values, "max")


def _gather_objects(obj: Any) -> list[Any]:
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_floats(values: Sequence[float]) -> list[float]:
    """Every rank's values, concatenated in rank order (a collective; lengths may differ)."""
    return [float(v) for part in _gather_objects([float(v) for v in values]) for v in part]


def reduce_metrics(metrics: dict[str, float], weight: float) -> dict[str, float]:
    """Combine every rank's ``metrics`` (a collective; the same result on every rank).

    Args:
        metrics: This rank's values; each combines as its type says
            (:func:`creditlab.types.reduction`: sum, mean, max or min; a plain float is a mean).
        weight: This rank's weight in means (e.g. its rows): exact for per-row means, an
            approximation for ratios whose denominator is not proportional to it.

    A key missing on some ranks combines over the ranks that have it; the result keeps the type
    (and so the reduction) of the first rank that has it.
    """
    parts = _gather_objects((dict(metrics), float(weight)))
    if len(parts) == 1:
        return dict(metrics)
    keys = list(dict.fromkeys(k for m, _ in parts for k in m))
    out: dict[str, float] = {}
    for key in keys:
        first = next(m[key] for m, _ in parts if key in m)
        have = [(float(m[key]), w) for m, w in parts if key in m]
        op = reduction(first)
        if op == "sum":
            value = sum(v for v, _ in have)
        elif op == "max":
            value = max(v for v, _ in have)
        elif op == "min":
            value = min(v for v, _ in have)
        else:
            total = sum(w for _, w in have)
            value = (sum(v * w for v, w in have) / total if total > 0
                     else sum(v for v, _ in have) / len(have))
        out[key] = type(first)(value) if isinstance(first, float) else value
    return out
