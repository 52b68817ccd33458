"""KV caches for the HF backend's decoding loop: a preallocated full-attention layer, building a
cache for a model, and which caches can share a prefill between rows.

``transformers`` >= 4.56 keeps a cache as per-layer objects (``DynamicLayer``); with an older one
every function here falls back to the plain ``DynamicCache``.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers.cache_utils as cache_utils
from transformers import DynamicCache

try:  # transformers >= 4.56: per-layer cache objects
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - older transformers: plain DynamicCache only
    DynamicLayer = None


if DynamicLayer is not None:

    class PreallocatedLayer(DynamicLayer):
        """A full-attention KV cache layer written in place into a buffer of fixed capacity.

        ``DynamicLayer`` concatenates the whole cache at every step (a copy of (A, H, L, D) per
        layer and step); this layer allocates (A, H, capacity, D) once and returns views, which
        halves decoding time for small models. Keys/values: (A, H, length, D).
        """

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self.length = 0

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            b, h, _, d = key_states.shape
            self._k = key_states.new_empty(b, h, self.capacity, d)
            self._v = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({end})")
            self._k[:, :, self.length : end] = key_states
            self._v[:, :, self.length : end] = value_states
            self.length = end
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Keep (or repeat) the rows ``indices``; only the filled columns are copied."""
            if self.is_initialized:
                self._k, self._v = self._select(self._k, indices), self._select(self._v, indices)
                self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

        def _select(self, buf: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
            out = buf.new_empty((len(indices), *buf.shape[1:]))
            torch.index_select(buf[:, :, : self.length], 0, indices, out=out[:, :, : self.length])
            return out


#: Cache layer types whose rows ``batch_select_indices`` can copy exactly (shared prefill).
GATHERABLE_LAYERS: tuple[type, ...] = ()
#: Cache layer types holding every key/value of their rows (what the fused steps take over).
FULL_ATTENTION_LAYERS: tuple[type, ...] = ()
if DynamicLayer is not None:
    _sliding = getattr(cache_utils, "DynamicSlidingWindowLayer", None)
    GATHERABLE_LAYERS = tuple(
        t for t in (DynamicLayer, _sliding, PreallocatedLayer) if t is not None
    )
    FULL_ATTENTION_LAYERS = (DynamicLayer, PreallocatedLayer)



def make_cache(model: Any, capacity: int, preallocate: bool = True) -> Any:
    """A ``DynamicCache`` for ``model``; its layers preallocated (``capacity`` positions) when
    ``preallocate`` and all are full attention."""
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # pragma: no cover - older transformers
        return DynamicCache()
    layers = getattr(cache, "layers", None)
    if (
        preallocate
        and DynamicLayer is not None
        and layers
        and all(type(layer) is DynamicLayer for layer in layers)
    ):
        cache.layers = [PreallocatedLayer(capacity) for _ in layers]
    return cache


def shared_contexts(contexts: list[tuple[int, ...]]) -> tuple[list[int], list[int]] | None:
    """``(first, inverse)`` when some contexts repeat: ``first`` holds the row of each distinct
    context (in order of first appearance), ``inverse[i]`` the index in ``first`` of row
    ``i``'s context; ``None`` when every context is distinct."""
    index: dict[tuple[int, ...], int] = {}
    first: list[int] = []
    inverse = []
    for i, c in enumerate(contexts):
        j = index.setdefault(c, len(first))
        if j == len(first):
            first.append(i)
        inverse.append(j)
    return (first, inverse) if len(first) < len(contexts) else None

def plain_kv(cache: Any) -> bool:
    """Whether every cache layer holds exactly the full keys/values of its rows."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in FULL_ATTENTION_LAYERS for layer in layers)

def gatherable(cache: Any) -> bool:
    """Whether ``cache.batch_select_indices`` copies whole rows: every layer's per-row state
    is its keys/values (full-attention, sliding-window or preallocated layers; not quantized,
    linear-attention or other layers with extra per-row state)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) in GATHERABLE_LAYERS for layer in layers)
