"""Data parallelism inside one RL step: which prompts a rank owns, gradient sync, global metrics.

On R ranks (Lightning's DDP strategy) one RL step goes like this:

1. The step's P prompts are cut into R contiguous shares (:func:`shard`); each rank samples,
   scores, segments and estimates advantages for its share only. A prompt's whole group stays on
   one rank, so group advantages, and every estimator that looks at the batch group by group, see
   exactly what they would see in one process.
2. The loss denominators of each mini-batch are summed over the ranks
   (:meth:`creditlab.losses.MiniBatchStats.all_reduce`), every rank backpropagates its rows'
   contribution times R, and DDP averages the gradients: the update equals the single-process
   update of the global batch, for every aggregation mode (``tests/integration/test_ddp_gradients.py``).
   Every rank runs as many micro-batches as the rank with the most (an extra one runs a row with
   no trained token: an exact zero), so strategies that reduce gradients at every backward meet
   in the same collectives; under DDP every micro-batch but the last is backpropagated without
   the all-reduce (:func:`gradient_sync`): one all-reduce per optimizer step.
3. Metrics are made global (:func:`gather_floats`, :func:`all_sum`, :func:`reduce_metrics`) and
   logged by rank 0.

Every helper is the identity when ``torch.distributed`` is not initialized (one process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")

__all__ = [
    "all_max", "all_sum", "gather_floats", "gradient_sync", "reduce_metrics", "reduction",
    "rank_and_world", "shard",
]


def _active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` without one."""
    import torch.distributed as dist

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
    import torch.distributed as dist

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
    import torch.distributed as dist

    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_floats(values: Sequence[float]) -> list[float]:
    """Every rank's values, concatenated in rank order (a collective; lengths may differ)."""
    return [float(v) for part in _gather_objects([float(v) for v in values]) for v in part]


#: Last words of a leaf name (split on ``_``) that mark a rate or a mean: averaged over ranks.
MEAN_LAST_WORDS = frozenset({
    "mean", "rate", "frac", "fraction", "std", "relative", "position", "rank", "accuracy", "avg",
    "ratio", "success", "exact", "early", "late", "mass", "credit",
})
#: Whole leaf names of in-repo rates that the word rules miss, and of counts they would average.
MEAN_LEAVES = frozenset({"clean_prefix", "neg_mass_before", "neg_mass_at", "neg_mass_after"})
COUNT_LEAVES = frozenset({"with_negative_mass"})


def reduction(key: str) -> str:
    """How a metric combines over ranks, from its name: ``max``, ``min``, ``mean`` or ``sum``.

    The leaf (the part after the last ``/``) decides: a ``max``/``min`` word takes the extreme;
    a rate or a mean (last word in :data:`MEAN_LAST_WORDS`, e.g. ``*_rate``, ``*_frac``,
    ``abs_mean``; an ``x_per_y``; ``pass@k``; :data:`MEAN_LEAVES`) is averaged; anything else is a
    count (``groups``, ``zero_std_groups``, ``*_tokens``, ``scored``) and summed. Plug-in
    authors: name rates and means accordingly (docs/scaling.md).
    """
    leaf = key.rsplit("/", 1)[-1]
    words = leaf.replace("@", "_").split("_")
    if "max" in words:
        return "max"
    if "min" in words:
        return "min"
    if leaf in COUNT_LEAVES:
        return "sum"
    if words[-1] in MEAN_LAST_WORDS or "per" in words or "pass@" in leaf or leaf in MEAN_LEAVES:
        return "mean"
    return "sum"


def reduce_metrics(
    metrics: dict[str, float], weight: float, ops: dict[str, str] | None = None
) -> dict[str, float]:
    """Combine every rank's ``metrics`` (a collective; the same result on every rank).

    Args:
        metrics: This rank's values.
        weight: This rank's weight in means (e.g. its rows): exact for per-row means, an
            approximation for ratios whose denominator is not proportional to it.
        ops: ``key -> "sum" | "mean" | "max" | "min"``; other keys by :func:`reduction`.

    A key missing on some ranks combines over the ranks that have it.
    """
    ops = ops or {}
    parts = _gather_objects((dict(metrics), float(weight)))
    if len(parts) == 1:
        return dict(metrics)
    keys = list(dict.fromkeys(k for m, _ in parts for k in m))
    out: dict[str, float] = {}
    for key in keys:
        have = [(float(m[key]), w) for m, w in parts if key in m]
        op = ops.get(key) or reduction(key)
        if op == "sum":
            out[key] = sum(v for v, _ in have)
        elif op == "max":
            out[key] = max(v for v, _ in have)
        elif op == "min":
            out[key] = min(v for v, _ in have)
        else:
            total = sum(w for _, w in have)
            out[key] = (sum(v * w for v, w in have) / total if total > 0
                        else sum(v for v, _ in have) / len(have))
    return out
