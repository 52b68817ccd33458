"""What OAR-P and OAR-G hold while they estimate, for the memory plan (``creditlab train
--dry-run``, loss.micro_batch_tokens=auto): entry points ``creditlab.advantage_memory`` ``oar_p``
and ``oar_g``, callables ``(config, step) -> {component: bytes}``. ``step`` holds the step's
numbers and shared costs (``creditlab.run.memory_phases.StepDims``): ``R`` = ``step.rows``, ``T``
the response budget, ``L = prompt + T``, ``kv`` bytes of keys and values per token, ``m`` =
``step.micro`` the handle's rows per forward (0 = all), ``r`` read positions per probe: 1 in
``last`` mode, else ``step.answer`` (16; the answer's length is not known before sampling).

* **OAR-P**: each chunk of ``c = chunk_size`` probes (0: all ``R · T`` perturbed probes) runs
  without grad; the perturbed probes continue from their clean probe's KV cache. A chunk holds the
  ``t = min(c, R)`` clean probes' cache and a copy of it for each of the ``b = min(c, m)`` probes a
  forward runs (``c`` when ``m = 0``): ``(t + b) · L · kv``; the forward's temporaries
  ``step.no_grad(b · L)``; logits at the read positions only for a block of
  ``k = min(BLOCK_CHUNKS · c, R · T)`` perturbed probes, ``k · V · (4r + 24)`` (fp32 logits, then
  the float64 mean and the KL's two log-softmaxes). ``answer_joint`` reads the continuation's
  log-probs instead: ``step.logprob_tensors(b, L)``.
* **OAR-G**: a no-grad clean pass, then one pass with autograd over ``g = chunk_size`` rows (0:
  as many as the handle's ``m`` rows and ``step.tokens`` padded tokens allow, at most ``R``) of
  ``L`` tokens: the activations an update keeps for them,
  ``g · L · step.kept``; the embeddings, their noise and their gradient ``3 · g · L · H · w``; fp32
  logits and their gradient at the read positions ``8 · g · r · V``. No weight gradient is kept.
"""

from __future__ import annotations

from typing import Any

from creditlab_oar.advantage import BLOCK_CHUNKS


def _read(config: Any, step: Any) -> int:
    return 1 if config.mode == "last" else step.answer


def oar_p_memory(config: Any, step: Any) -> dict[str, float]:
    """OAR-P's tensors while it estimates, by component (bytes; the module docstring)."""
    L, R, V = step.prompt + step.T, step.rows, step.shape.vocab
    c = int(config.chunk_size) or R * step.T
    t, b = min(c, R), (min(c, step.micro) if step.micro else c)
    block = min(BLOCK_CHUNKS * c, R * step.T)  # perturbed probes whose read-outs exist at once
    if config.mode == "answer_joint":
        logits = step.logprob_tensors(b, L)
    else:
        logits = block * V * (4 * _read(config, step) + 24)
    return {"advantage kv cache": (t + b) * L * step.kv, "advantage activations": step.no_grad(b * L),
            "advantage logits": logits}


def oar_g_memory(config: Any, step: Any) -> dict[str, float]:
    """OAR-G's tensors while it estimates, by component (bytes; the module docstring)."""
    L, R = step.prompt + step.T, step.rows
    g = int(config.chunk_size) or min(step.micro or R, max(1, step.tokens // L) if step.tokens else R)
    g = min(g, R)
    return {"advantage activations": g * L * step.kept + 3 * g * L * step.shape.hidden * step.w,
            "advantage logits": 8 * g * _read(config, step) * step.shape.vocab}
