"""The estimator phases of the memory plan (:mod:`creditlab.run.memory`): what an advantage
estimator holds beside the weights, the KL reference and the optimizer state while it estimates
(gradients are freed after each optimizer step), where that is more than the update's.

Notation as in :mod:`creditlab.run.memory`: ``R`` rows of the step on this rank, ``G`` the group
size, ``L = prompt + T`` the longest probe or row, ``n`` layers, ``H`` hidden, ``I`` MLP width,
``V`` vocabulary, ``w`` / ``a`` bytes per weight / activation, ``kv = 2 · n · kv_heads ·
head_dim · w`` bytes of keys and values per token, ``m`` the policy handle's rows per forward
(``loss.micro_batch_size``; 0 = all). A no-grad forward over ``N`` tokens holds one layer's
temporaries at a time, ``N · (4H + 3I) · a`` (as the generation's prefill). Read-outs assume an
answer of at most ``ANSWER = 16`` tokens (the plan cannot see the answers before they are
sampled). Bytes:

* **OAR-P** (``oar_p``): each chunk of ``c = advantage.chunk_size`` probes (0: all ``R · T``
  perturbed probes) runs no-grad; the perturbed probes continue from their clean probe's KV cache.
  The chunk holds the ``t = min(c, R)`` clean probes' cache and a copy of it for each of the
  ``b = min(c, m)`` probes a forward runs (``c`` when ``m = 0``), ``(t + b) · L · kv``, the
  forward's temporaries ``b · L · (4H + 3I) · a``, and logits only at the read positions,
  ``c · V · (4r + 24)`` (``r`` = 1 in ``last`` mode, else ``ANSWER``: fp32 logits, then the
  float64 mean and the KL's two log-softmaxes). ``answer_joint`` reads log-probs of the
  continuation instead: the log-prob tensors below with ``b`` branches of ``L`` tokens.
* **OAR-G** (``oar_g``): one no-grad clean pass, then one pass with autograd over
  ``g = advantage.chunk_size`` rows (0: all probed rows, at most ``R``) of ``L`` tokens: the
  activations an update keeps for ``g · L`` tokens without prompt sharing (``g · L · (k + norm +
  aH)``, ``k`` the kept bytes per token and layer stack of :mod:`~creditlab.run.memory`), the
  embeddings, their noise and their gradient ``3 · g · L · H · w``, and fp32 logits and their
  gradient at the read positions ``8 · g · r · V``. No weight gradient is kept.
* **RREDCoT** (``rredcot``): one ``branch_logprobs`` call per ``j = advantage.max_rows`` branches
  (0: all ``J = R · S · A``; ``S`` states per row = 1 + the segmenter's segments at most, ``A = G``
  answers per pool), no grad. The call's trunks (``t = R``, or ``min(R, j)`` with ``max_rows``)
  run once, ``t · L · kv`` of cache and ``t · L · (4H + 3I) · a`` of temporaries; each of the
  ``b = min(j, m)`` branches of a forward gets a copy of its trunk's cache and continues it by
  ``M = ANSWER + 8`` tokens (cue, answer, suffix), ``b · (L + M) · kv``; then the log-prob tensors.
* **log-prob tensors** of ``b`` branches of ``M`` tokens: with the fused head the final hidden
  states ``b · M · H · a`` and three fp32 tiles ``12 · min(c_t, b · M) · V`` (``c_t`` = 512 tokens);
  without it the logits and their log-softmax, ``8 · b · M · V``.
* **MC values** (``mc_value``): ``advantage.rollouts`` continuations of each of the ``R · S``
  states, generated as rollouts are (the generation phase's formulas) for ``min(R · S · K,
  backend.max_batch_size)`` rows whose context is the prompt and up to ``T`` response tokens.
* **IBPO** (``ibpo``) with ``mode=repair``: one repair a row, generated as rollouts are for ``R``
  rows whose context is the prompt and two attempts, ``prompt + 2T`` (the repair prompt's own
  words not counted); in ``contrast`` mode nothing.
* **credit-bench** hands every chain to each estimator at once: the formulas above with ``R`` =
  prompts x ``G`` and ``m`` = ``loss.micro_batch_size`` (else ``prompts_per_step x G``), beside the
  weights only (no optimizer, no reference); its Monte-Carlo truth generates 512 continuations
  per sampler call (:data:`creditlab.creditbench.truth.CHUNK`).

Estimators not named here (GRPO, Dr. GRPO, the controls) hold nothing beyond the batch; a
third-party one is named in a note as not modeled.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from creditlab.run.memory_shape import Shape
from creditlab.step.fused_head import DEFAULT_TOKEN_CHUNK

#: Answer tokens the read-outs assume at most (the answers are not known before sampling).
ANSWER = 16
#: Estimators that hold nothing beyond the batch while they estimate (IBPO: in ``contrast`` mode).
PLAIN = ("grpo", "dr_grpo", "oracle_credit", "sham_credit", "anti_credit", "reward_flip")
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
    """Bytes of ``advantage=name``'s own tensors while it estimates, by component (the module
    docstring has the formulas); ``{}`` for an estimator that holds nothing beyond the batch,
    ``None`` for one the plan does not know."""
    L, R, V = d.prompt + d.T, d.rows, d.shape.vocab
    if name in PLAIN or (name == "ibpo" and getattr(config, "mode", "contrast") != "repair"):
        return {}
    if name == "oar_p":
        c = int(config.chunk_size) or R * d.T
        t = min(c, R)
        b = min(c, d.micro) if d.micro else c
        if config.mode == "answer_joint":
            logits = d.logprob_tensors(b, L)
        else:
            logits = c * V * (4 * (1 if config.mode == "last" else ANSWER) + 24)
        return {"advantage kv cache": (t + b) * L * d.kv, "advantage activations": d.no_grad(b * L),
                "advantage logits": logits}
    if name == "oar_g":
        g = min(int(config.chunk_size) or R, R)
        r = 1 if config.mode == "last" else ANSWER
        return {"advantage activations": g * L * d.kept + 3 * g * L * d.shape.hidden * d.w,
                "advantage logits": 8 * g * r * V}
    if name == "rredcot":
        M = ANSWER + 8
        branches = R * (1 + d.segments) * d.group
        j = min(int(config.max_rows) or branches, branches)
        t = min(R, j) if config.max_rows else R
        b = min(j, d.micro) if d.micro else j
        return {"advantage kv cache": t * L * d.kv + b * (L + M) * d.kv,
                "advantage activations": d.no_grad(t * L), "advantage logits": d.logprob_tensors(b, M)}
    if name == "ibpo":  # repair: one request per row, its prompt holding two attempts
        tensors, cache = d.generation(R, d.prompt + 2 * d.T)
        return {"advantage generation tensors": tensors, "advantage kv cache": cache}
    if name == "mc_value":
        states = R * max(1, d.segments)
        tensors, cache = d.generation(states * int(config.rollouts), d.prompt + d.T)
        return {"advantage generation tensors": tensors, "advantage kv cache": cache}
    return None


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
