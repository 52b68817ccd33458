"""The estimator phases of the memory plan (:mod:`creditlab.run.memory`): what an advantage
estimator holds beside the weights, the KL reference and the optimizer state while it estimates
(gradients are freed after each optimizer step), where that is more than the update's.

An estimator's plug-in states it: a callable ``(config, step) -> {component: bytes}`` registered
under the estimator's name in entry-point group ``creditlab.advantage_memory`` (its formulas in its
module docstring), reading the step's numbers from ``step``, a :class:`StepDims`. A built-in
estimator without one holds nothing beyond the batch; a plug-in's without one is named in a note
as not modeled.

:class:`StepDims` gives the numbers and the costs such formulas share. Notation as in
:mod:`creditlab.run.memory`: ``R`` rows of the step on this rank, ``G`` the group size, ``L =
prompt + T`` the longest row, ``n`` layers, ``H`` hidden, ``I`` MLP width, ``V`` vocabulary, ``w`` /
``a`` bytes per weight / activation. Bytes:

* ``kv = 2 · n · kv_heads · head_dim · w`` of keys and values per token (a cache or its copy);
* a no-grad forward over ``N`` tokens holds one layer's temporaries at a time, ``N · (4H + 3I) ·
  a`` (as the generation's prefill): :meth:`StepDims.no_grad`;
* an autograd forward keeps ``kept`` bytes per token (the update's activations without prompt
  sharing: layers x layer + norm + aH, :mod:`creditlab.run.memory`);
* log-probs of ``b`` continuations of ``M`` tokens: with the fused head the final hidden states
  ``b · M · H · a`` and three fp32 tiles ``12 · min(c_t, b · M) · V`` (``c_t`` = 512 tokens);
  without it the logits and their log-softmax, ``8 · b · M · V``: :meth:`StepDims.logprob_tensors`;
* generated continuations: the generation phase's tensors and KV cache for ``rows`` rows (at most
  ``backend.max_batch_size`` a batch) whose context is ``context`` tokens: :attr:`StepDims.generation`;
* ``m`` = ``micro``, the policy handle's rows per forward (``loss.micro_batch_size``; 0 = all),
  and ``answer`` = 16 tokens, the longest answer a read-out assumes (answers are not known before
  they are sampled).

**credit-bench** hands every chain to each estimator at once: the same formulas with ``R`` =
prompts x ``G`` and ``m`` = ``loss.micro_batch_size`` (else ``prompts_per_step x G``), beside the
weights only (no optimizer, no reference); its Monte-Carlo truth generates 512 continuations per
sampler call (:data:`creditlab.creditbench.truth.CHUNK`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from creditlab.registry import BUILTIN_DIST, registry
from creditlab.run.memory_shape import Shape
from creditlab.step.fused_head import DEFAULT_TOKEN_CHUNK

#: Continuation requests per sampler call of credit-bench's truth (creditbench.truth.CHUNK).
BENCH_TRUTH_CHUNK = 512


@dataclass(frozen=True)
class StepDims:
    """The numbers of one rank's step that the estimator formulas read.

    Attributes:
        shape: The model's shape.
        rows: ``R``, rows of the step on this rank.
        group: ``G``, rows per group.
        prompt: The longest prompt, in tokens.
        T: The response budget, in tokens.
        w: Bytes per weight.
        a: Bytes per activation.
        kept: Bytes an autograd forward keeps per token (the update's, without prompt sharing).
        fused: Whether log-probs go through the fused head.
        micro: ``m``, the policy handle's rows per forward (0 = all).
        segments: ``S - 1``, segments per response at most (the segmenter's bound).
        generation: ``(rows, context) -> (decoding and prefill tensors, KV cache)`` of the run.
        answer: Answer tokens a read-out assumes at most.
        tokens: The handle's padded tokens per forward with autograd (the resolved
            ``loss.micro_batch_tokens``; 0 = no bound).
    """

    shape: Shape
    rows: int
    group: int
    prompt: int
    T: int
    w: int
    a: int
    kept: float
    fused: bool
    micro: int
    segments: int
    generation: Callable[[int, int], tuple[float, float]]
    answer: int = 16
    tokens: int = 0

    @property
    def kv(self) -> int:
        """Bytes of keys and values per token."""
        return 2 * self.shape.layers * self.shape.kv_heads * self.shape.head_dim * self.w

    def no_grad(self, tokens: float) -> float:
        """One layer's temporaries of a no-grad forward over ``tokens``."""
        return tokens * (4 * self.shape.hidden + 3 * self.shape.intermediate) * self.a

    def logprob_tensors(self, branches: int, tokens: int) -> float:
        """Log-prob tensors of ``branches`` continuations of ``tokens`` tokens."""
        n, V = branches * tokens, self.shape.vocab
        if self.fused:
            return n * self.shape.hidden * self.a + 12 * min(DEFAULT_TOKEN_CHUNK, n) * V
        return 8 * n * V


def segments_bound(seg_name: str, seg_config: Any, T: int, thoughts: bool, max_thoughts: int) -> int:
    """Segments per response at most: 1 (``whole``), the segmenter's ``max_segments`` when set,
    the thought cap (``thought`` with thought-by-thought rollouts), ``T // min_segment_tokens``,
    else one per token."""
    if seg_name == "whole":
        return 1
    cap = int(getattr(seg_config, "max_segments", 0) or 0)
    if cap > 0:
        return cap
    if seg_name == "thought" and thoughts:
        return max_thoughts
    return max(1, T // max(1, int(getattr(seg_config, "min_segment_tokens", 1) or 1)))


def estimator_parts(name: str, config: Any, d: StepDims) -> dict[str, float] | None:
    """Bytes of ``advantage=name``'s own tensors while it estimates, by component: its
    ``creditlab.advantage_memory`` entry called with ``(config, d)``; ``{}`` for a built-in
    estimator without one (it holds nothing beyond the batch), ``None`` for a plug-in's (unknown).

    Raises:
        RegistryError: The entry fails to import.
    """
    memory = registry("advantage_memory")
    if name in memory:
        return {k: float(v) for k, v in memory.get(name)(config, d).items()}
    entry = registry("advantage").entries.get(name)
    return {} if entry is not None and entry.dist == BUILTIN_DIST else None


def bench_phases(dims: StepDims, estimators: dict[str, tuple[Any, StepDims]], weights: float) -> tuple[dict[str, float], list[str]]:
    """credit-bench's phases beside its ``weights``: the truth's continuations and each estimator
    on every chain at once (``estimators``: name -> (config, its :class:`StepDims` with ``R`` =
    prompts x G)). Returns ``(phases, notes)``."""
    tensors, cache = dims.generation(BENCH_TRUTH_CHUNK, dims.prompt + dims.T)
    phases = {"credit-bench truth": weights + tensors + cache}
    notes = []
    for name, (config, d) in estimators.items():
        parts = estimator_parts(name, config, d)
        if parts is None:
            notes.append(f"advantage {name}: its own memory is not modeled")
        elif parts:
            phases[f"credit-bench {name}"] = weights + math.fsum(parts.values())
    return phases, notes
