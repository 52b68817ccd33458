"""Tolerances that follow from floating-point arithmetic, for tests that compare two computations
of the same quantity which may round differently.

**Where they apply.** Fused against unfused, cached against uncached, packed against whole,
chunked or micro-batched against whole, a KV-cached step against a full forward, and the same
code on another CPU's kernels (AVX-512, AVX2 or torch's SSE4 baseline; ``ATEN_CPU_CAPABILITY``,
``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``). Each of these sums the same terms in another
order, so the two results agree only up to rounding, and a bound that one machine's kernels happen
to meet is not a bound. Such tests carry the ``numerics`` marker, and ``.ci/run`` runs them again
under the AVX2 and baseline kernels.

**Where they do not.** A computation that is the same by construction (a refactor, a resume, a
copy, a cache hit, the same kernels on the same inputs in the same order, integer or boolean
results) keeps exact equality (``rtol=0, atol=0``). Values computed by hand in float64 keep their
float64 bounds. A tolerance here never stands in for an invariant.

**The model.** A sum of ``n`` terms rounded in any order, with unit roundoff ``u = eps / 2``, is
within ``gamma_n * sum|x_i|`` of the exact sum, ``gamma_n = n u / (1 - n u)`` (Higham, *Accuracy
and Stability of Numerical Algorithms*, 2nd ed., 2002, section 4.2). That worst case is far from
what happens: with rounding errors treated as independent and of mean zero, the error is at most
``lam * sqrt(n) * u * sum|x_i|`` except with a probability that falls like ``exp(-lam**2 / 2)``
(Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput.
41(5), 2019). Two computations, each within that of the exact value, differ by at most twice it::

    tol = lam * sqrt(n) * eps * scale

- ``n`` (``length``): the terms rounded along the path to one compared number. For a network it is
  the lengths of every reduction on that path added up (:func:`lm_length`), for a sum of ``k``
  per-token values it is ``k`` plus the path to one of them.
- ``scale``: stands for ``sum|x_i|``. By default the largest magnitude of the expected tensor, so a
  gradient is compared against the scale of its tensor, never elementwise against a constant such
  as 1e-6 (an element that cancels to near 0 still carries the rounding of its large terms).
- ``lam`` = :data:`LAMBDA` = 5, chosen by measurement, not by the theorem. The theorem's own
  guarantee (probability at least ``1 - 2n exp(-lam**2 / 2)``) is void at ``lam = 5`` for ``n`` in
  the thousands, and the model leaves out the normalisations and softmaxes a chain of reductions
  passes through, while the scale (a tensor's largest magnitude) overstates ``sum|x_i|`` for most
  elements. Measured on three kernel sets (AVX-512, AVX2, torch's baseline), every comparison of
  the suite stayed below 0.14 of its tolerance, and a real bug (a pad attended to) lands about
  10^4 tolerances away (``docs/testing.md``, ``tests/unit/test_numerics.py``).

Set ``CREDITLAB_NUMERICS_LOG=FILE`` to append, for every comparison, the observed largest
difference, the tolerance and their ratio (the headroom) as a JSON line.

Usage::

    from tests.numerics import approx_fp, assert_close_fp, lm_length

    n = lm_length(model.config, seq_len=ids.shape[1])
    assert_close_fp(fused_logprobs, plain_logprobs, length=n)
    n_grad = lm_length(model.config, seq_len=ids.shape[1], backward=True, tokens=int(mask.sum()))
    assert_close_fp(grad, grad_ref, length=n_grad)            # against max|grad_ref|
    assert entropy_sum == approx_fp(ref_sum, length=tokens + n)  # relative to |ref_sum|
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence

import pytest
import torch

#: The multiple of ``sqrt(n) * eps * scale`` that two orders of the same sum may differ by.
LAMBDA: float = 5.0


def tolerance(scale: float, length: int, dtype: torch.dtype = torch.float32) -> float:
    """The largest difference allowed between two roundings of one quantity.

    Args:
        scale: Magnitude of the terms summed (``sum|x_i|``, or a tensor's largest magnitude).
        length: Terms rounded along the path to the compared number (``n >= 1``).
        dtype: The floating-point type both computations ran in.

    Returns:
        ``LAMBDA * sqrt(length) * eps(dtype) * scale``.
    """
    if length < 1:
        raise ValueError(f"length must be a count of terms >= 1, got {length}")
    return LAMBDA * math.sqrt(length) * torch.finfo(dtype).eps * abs(float(scale))


def lm_length(config, seq_len: int, *, backward: bool = False, tokens: int = 0) -> int:
    """Terms rounded along the path from a decoder-only LM's inputs to one logit, log-prob or
    entropy (and, with ``backward``, on to a parameter's or an input's gradient).

    Per layer: two RMSNorms (``hidden`` squares each), the q/k/v projections (``hidden``), the
    attention scores (``head_dim``), the softmax's sum and the weighted sum of values (``seq_len``
    each), the output projection (``hidden``), the MLP's gate/up (``hidden``) and down
    (``intermediate``) projections. Then the final norm and the head (``hidden`` each) and the
    log-softmax or entropy over the vocabulary (``vocab``). The backward pass runs the chain again,
    and a weight's gradient sums over the ``tokens`` positions that use it.

    Args:
        config: A ``transformers`` config with ``hidden_size``, ``intermediate_size``,
            ``num_hidden_layers``, ``num_attention_heads`` and ``vocab_size``.
        seq_len: Longest sequence (prompt and response) in the batch.
        backward: Also count the backward pass.
        tokens: Positions a weight's gradient sums over (e.g. ``int(mask.sum())``).
    """
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    per_layer = 2 * hidden + hidden + head_dim + 2 * seq_len + hidden + hidden + inter
    forward = config.num_hidden_layers * per_layer + 2 * hidden + config.vocab_size
    return 2 * forward + tokens if backward else forward


def _log(diff: float, tol: float, where: str | None) -> None:
    path = os.environ.get("CREDITLAB_NUMERICS_LOG")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    row = {"test": test, "where": where, "capability": torch.backends.cpu.get_cpu_capability(),
           "diff": diff, "tol": tol,
           "ratio": diff / tol if tol else (0.0 if diff == 0 else math.inf)}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def assert_close_fp(actual: torch.Tensor, expected: torch.Tensor, *, length: int,
                    scale: float | None = None, dtype: torch.dtype | None = None,
                    msg: str | None = None) -> None:
    """``torch.testing.assert_close`` within :func:`tolerance` (absolute, ``rtol=0``).

    Args:
        actual, expected: Tensors of the same shape and dtype (any shape).
        length: Terms rounded along the path to one element (:func:`lm_length` for a model).
        scale: Magnitude of the terms; default ``expected.abs().max()``, the tensor's scale.
        dtype: The arithmetic's type; default ``expected.dtype``.
        msg: Prefix of the failure message (e.g. the parameter's name).
    """
    if scale is None:
        scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    tol = tolerance(scale, length, dtype or expected.dtype)
    if actual.shape == expected.shape and actual.numel():
        _log(float((actual.detach().double() - expected.detach().double()).abs().max()), tol, msg)
    why = (f"tolerance {tol:.3g} = {LAMBDA:g} * sqrt({length}) * eps({dtype or expected.dtype}) * "
           f"scale {scale:.4g} (tests/numerics.py)")
    torch.testing.assert_close(actual, expected, rtol=0, atol=tol,
                               msg=lambda m: f"{msg + ': ' if msg else ''}{m}\n{why}")


def approx_fp(expected: float | Sequence[float], *, length: int, scale: float | None = None,
              dtype: torch.dtype = torch.float32, where: str | None = None):
    """``pytest.approx(expected)`` within :func:`tolerance` (absolute).

    Args:
        expected: A number or a sequence of numbers.
        length: Terms rounded along the path to one of them (a sum of ``k`` per-token values:
            ``k`` plus the path to one value).
        scale: Magnitude of the terms; default the largest ``|expected|`` (for a sum of
            non-negative terms such as entropies, ``sum|x_i|`` is the sum itself).
        dtype: The arithmetic's type (default float32).
        where: A label for ``CREDITLAB_NUMERICS_LOG``.
    """
    values = _floats(expected)
    if scale is None:
        scale = max((abs(v) for v in values), default=0.0)
    return _LoggedApprox(expected, tolerance(scale, length, dtype), where)


def _floats(x) -> list[float]:
    """A number or a sequence of numbers as a list of floats."""
    return [float(x)] if isinstance(x, (int, float)) else [float(v) for v in x]


class _LoggedApprox:
    """``pytest.approx`` that also records its headroom when compared."""

    def __init__(self, expected, tol: float, where: str | None):
        self.expected, self.tol, self.where = expected, tol, where
        self._approx = pytest.approx(expected, rel=0, abs=tol)

    def __eq__(self, actual) -> bool:
        got, want = _floats(actual), _floats(self.expected)
        if len(got) == len(want) and got:
            _log(max(abs(a - b) for a, b in zip(got, want)), self.tol, self.where)
        return self._approx == actual

    def __repr__(self) -> str:
        return f"{self._approx!r} (tolerance {self.tol:.3g}, tests/numerics.py)"


def headroom(paths: Sequence[str]) -> str:
    """A Markdown table from ``CREDITLAB_NUMERICS_LOG`` files: per test, the tolerances used and,
    per kernel set, the largest ratio of an observed difference to its tolerance."""
    worst: dict[str, dict[str, float]] = {}
    tols: dict[str, list[float]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                test = row["test"].split("[")[0]
                per = worst.setdefault(test, {})
                per[row["capability"]] = max(per.get(row["capability"], 0.0), row["ratio"])
                tols.setdefault(test, []).append(row["tol"])
    caps = sorted({c for per in worst.values() for c in per})
    lines = ["| test | tolerances | " + " | ".join(f"worst ratio, {c}" for c in caps) + " |",
             "|---|---|" + "---|" * len(caps)]
    for test in sorted(worst):
        low, high = min(tols[test]), max(tols[test])
        span = f"{low:.1e}" if low == high else f"{low:.1e} to {high:.1e}"
        cells = " | ".join(f"{worst[test].get(c, float('nan')):.3f}" for c in caps)
        lines.append(f"| `{test}` | {span} | {cells} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tests.numerics LOG...: the headroom table
    import sys

    print(headroom(sys.argv[1:]))
