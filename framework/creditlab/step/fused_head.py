"""The LM head, the per-token log-probability and the entropy in one pass, by tiles: the
``(N, V)`` logits are never held, only one tile's ``(token_chunk, vocab_chunk)`` at a time.

Given the final hidden states ``h (N, H)`` at the positions that predict each target, the LM head
``W (V, H)`` (and bias ``b (V,)``), the targets ``y (N,)`` and a temperature ``τ``, with
``z = (h Wᵀ + b) / τ`` (``(N, V)``, never built whole)::

    logprob = z[y] - logsumexp(z)          (N,) float32
    entropy = logsumexp(z) - Σ_v p_v z_v   (N,) float32,  p = softmax(z)

equal (up to float rounding) to :func:`creditlab.step.losses.gather_logprobs` and
:func:`~creditlab.step.losses.entropy_from_logits` on the full logits. The forward runs over
token chunks and, within each, over vocabulary tiles with an online logsumexp (a running max
``m``, ``s = Σ e^{z-m}`` and ``u = Σ e^{z-m} (z-m)``, so ``entropy = log s - u/s``); it saves for
the backward only ``h``, ``W``, ``b``, ``y`` and two ``(N,)`` vectors (logsumexp, entropy). The
backward recomputes each tile's logits and turns them into ``∂L/∂z`` for both outputs::

    ∂logprob/∂z_v = 1[v = y] - p_v
    ∂entropy/∂z_v = -p_v (log p_v + entropy) = -p_v (z_v - Σ_u p_u z_u)

so ``∂L/∂z_v = g_lp (1[v = y] - p_v) - g_H p_v (log p_v + entropy)`` for the incoming per-token
gradients ``g_lp`` and ``g_H`` (either may be absent: an entropy only logged costs nothing), then
``∂L/∂h = (∂L/∂z / τ) W``, ``∂L/∂W = (∂L/∂z / τ)ᵀ h``, ``∂L/∂b = Σ_n ∂L/∂z / τ``.

Precision: the head's matmul runs in the inputs' dtype (as the model's own ``lm_head`` does), its
output tile is upcast to float32 at once, and everything after it (logsumexp, entropy, the logits
gradient, the ``∂L/∂h``, ``∂L/∂W`` and ``∂L/∂b`` accumulators over tiles) is float32; the
gradients are cast to the inputs' dtypes once, at the end. Under autocast the inputs are cast to
the autocast dtype first (what autocast does to ``lm_head``), then autocast is off inside.

Memory: besides the float32 gradient accumulators (``(N, H)`` and, when ``W`` trains, ``(V, H)``;
``W`` tied to the input embedding trains through the same Parameter, nothing special), the peak
is about three ``(token_chunk, vocab_chunk)`` float32 tiles (the logits, and ``e^{z-m}`` or ``p``)
plus, for half-precision inputs, a float32 copy of one ``(vocab_chunk, H)`` weight tile in the
backward (CPU; CUDA multiplies half-precision tiles into float32 outputs directly).

Sources of the idea (no code taken from them): verl's ``FusedLinearForPPO``
(``verl/utils/experimental/torch_functional.py``: per-token log-probs and entropy by token
chunks, logits recomputed in the backward) and Liger-Kernel's fused linear cross-entropy
(``liger_kernel/ops/fused_linear_cross_entropy.py``: the head fused with the loss, by chunks).

Why not a library's: Liger's fused PPO/GRPO losses take the loss inside the kernel (their own
clipping and advantages), not per-token log-probs and entropy for arbitrary losses downstream
(our estimators' per-token advantages, reference KL, entropy bonus); verl's is a whole trainer's
dependency. TRL (``>= 1.16``, installed here) ships ``trl.kernels.ChunkedLogProbFunction``, which
does fit (log-probs and entropy with a recomputing backward, fp32 gradient accumulation, Triton
on CUDA and torch ops elsewhere), but TRL is only in creditlab's optional ``bench`` extra, its
token tile is a module constant (4096) and its forward rounds each logits tile to the inputs'
dtype. So the core owns this torch implementation, and ``backend="trl"`` hands the same call to
TRL's kernel where it is installed (the CUDA fast path; tested here against the same reference
through its torch fallback).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

__all__ = ["DEFAULT_TOKEN_CHUNK", "FusedHeadFunction", "fused_logprob_entropy", "trl_available"]

#: Tokens per chunk: a (512, 151_936) float32 logits tile is 311 MB.
DEFAULT_TOKEN_CHUNK = 512
#: TRL's vocabulary tile when ``vocab_chunk`` is None (its own trainer's default).
_TRL_VOCAB_CHUNK = 32768


def _mm_out_dtype() -> bool:
    """Whether ``torch.mm(..., out_dtype=torch.float32)`` exists (CUDA, torch >= 2.8)."""
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 8)


_MM_OUT_DTYPE = _mm_out_dtype()


def _mm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` as float32: ``a`` a float32 gradient tile, ``b`` a tile in the inputs' dtype.

    On CUDA a half-precision ``b`` is multiplied with ``a`` in that dtype into a float32 output
    (float32 accumulation in the GEMM, as autograd's unfused bf16 backward rounds the logits
    gradient to bf16 too); elsewhere ``b`` is upcast (a float32 copy of the tile).
    """
    if b.dtype == a.dtype:
        return a @ b
    if b.is_cuda and _MM_OUT_DTYPE and b.dtype in (torch.float16, torch.bfloat16):
        try:
            return torch.mm(a.to(b.dtype), b, out_dtype=torch.float32)
        except (RuntimeError, TypeError):  # a build without this overload: upcast instead
            pass
    return a @ b.to(a.dtype)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype: float64 for float64 inputs (``gradcheck``), float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _tiles(v: int, vocab_chunk: int | None) -> list[tuple[int, int]]:
    step = v if not vocab_chunk or vocab_chunk >= v else vocab_chunk
    return [(a, min(a + step, v)) for a in range(0, v, max(step, 1))]


def _logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a: int, b: int,
    temperature: float,
) -> torch.Tensor:
    """(n, b - a) ``(h W[a:b]ᵀ + bias[a:b]) / τ`` in the accumulation dtype: the matmul in the
    inputs' dtype, its output upcast (a fresh tensor either way: in-place ops change nothing
    else)."""
    z = F.linear(h, weight[a:b], None if bias is None else bias[a:b])
    z = z.to(_acc(z.dtype))
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_stats(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, y: torch.Tensor,
    temperature: float, tiles: list[tuple[int, int]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logsumexp, target logit, entropy), each (n,) in the accumulation dtype, of one token
    chunk ``h (n, H)``, ``y (n,)``, folding the vocabulary tiles with an online logsumexp."""
    m = s = u = None
    target = torch.zeros(h.shape[0], dtype=_acc(h.dtype), device=h.device)
    for a, b in tiles:
        z = _logits(h, weight, bias, a, b, temperature)  # (n, b - a)
        local = y - a
        inside = (local >= 0) & (local < b - a)
        picked = z.gather(1, local.clamp(0, b - a - 1).unsqueeze(1)).squeeze(1)
        target = torch.where(inside, picked, target)
        m_new = z.amax(1) if m is None else torch.maximum(m, z.amax(1))
        d = z.sub_(m_new.unsqueeze(1))  # z - m_new <= 0, in place
        e = d.exp()
        s_t = e.sum(1)
        u_t = d.mul_(e).sum(1)  # Σ e^{d} d
        if m is None:
            m, s, u = m_new, s_t, u_t
        else:  # rescale the running sums from the old max to the new one
            r = torch.exp(m - m_new)
            u = r * (u + (m - m_new) * s) + u_t
            s = r * s + s_t
            m = m_new
        del z, d, e
    log_s = torch.log(s)
    return m + log_s, target, log_s - u / s


class FusedHeadFunction(torch.autograd.Function):
    """``(logprob, entropy)`` of ``softmax((h Wᵀ + b) / τ)`` at the targets, tile by tile.

    ``apply(hidden (N, H), weight (V, H), bias (V,) | None, targets (N,) long, temperature,
    token_chunk, vocab_chunk | None)`` -> ``(logprob (N,), entropy (N,))``, both float32
    (float64 for float64 inputs).
    Prefer :func:`fused_logprob_entropy`, which checks its arguments and handles autocast.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
        targets: torch.Tensor, temperature: float, token_chunk: int, vocab_chunk: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # an output with no gradient (an entropy only logged) costs nothing in the backward
        ctx.set_materialize_grads(False)
        n = hidden.shape[0]
        tiles = _tiles(weight.shape[0], vocab_chunk)
        acc = _acc(hidden.dtype)
        lse, target, entropy = (torch.empty(n, dtype=acc, device=hidden.device) for _ in range(3))
        for s in range(0, n, token_chunk):
            e = min(s + token_chunk, n)
            lse[s:e], target[s:e], entropy[s:e] = _chunk_stats(
                hidden[s:e], weight, bias, targets[s:e], temperature, tiles)
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature, ctx.token_chunk, ctx.tiles = temperature, token_chunk, tiles
        return target - lse, entropy

    @staticmethod
    @once_differentiable
    def backward(  # type: ignore[override]
        ctx, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        if g_lp is None and g_ent is None:
            return None, None, None, None, None, None, None
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = lse.dtype
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        tau, n = ctx.temperature, hidden.shape[0]
        g_lp = None if g_lp is None else g_lp.to(acc)
        g_ent = None if g_ent is None else g_ent.to(acc)
        for s in range(0, n, ctx.token_chunk):
            e = min(s + ctx.token_chunk, n)
            h, y = hidden[s:e], targets[s:e]
            for a, b in ctx.tiles:
                grad_z = _grad_logits(
                    _logits(h, weight, bias, a, b, tau), y - a, lse[s:e],
                    entropy[s:e], None if g_lp is None else g_lp[s:e],
                    None if g_ent is None else g_ent[s:e])
                if tau != 1.0:
                    grad_z.div_(tau)  # ∂L/∂(h Wᵀ + b)
                if grad_h is not None:
                    grad_h[s:e] += _mm_f32(grad_z, weight[a:b])
                if grad_w is not None:
                    grad_w[a:b] += _mm_f32(grad_z.t(), h)
                if grad_b is not None:
                    grad_b[a:b] += grad_z.sum(0)
                del grad_z

        def cast(g: torch.Tensor | None, like: torch.Tensor | None) -> torch.Tensor | None:
            return None if g is None or like is None else g.to(like.dtype)

        return (cast(grad_h, hidden), cast(grad_w, weight), cast(grad_b, bias),
                None, None, None, None)


def _grad_logits(
    z: torch.Tensor, local: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
    g_lp: torch.Tensor | None, g_ent: torch.Tensor | None,
) -> torch.Tensor:
    """(n, w) float32 ``∂L/∂z`` of one tile from its logits ``z (n, w)`` (overwritten),
    ``local = y - tile start (n,)`` and the (n,) logsumexp, entropy and incoming gradients."""
    logp = z.sub_(lse.unsqueeze(1))  # log p, in place
    p = logp.exp()
    if g_ent is not None:  # -p (g_lp + g_H (log p + H))
        grad = logp.add_(entropy.unsqueeze(1)).mul_(g_ent.unsqueeze(1))
        if g_lp is not None:
            grad.add_(g_lp.unsqueeze(1))
        grad.mul_(p).neg_()
    else:  # -p g_lp
        grad = p.mul_(g_lp.unsqueeze(1)).neg_()
    if g_lp is not None:  # + g_lp at the target, where it falls in this tile
        rows = ((local >= 0) & (local < z.shape[1])).nonzero().squeeze(1)
        grad[rows, local[rows]] += g_lp[rows]
    return grad


def trl_available() -> bool:
    """Whether TRL's chunked log-prob kernel (``trl.kernels.ChunkedLogProbFunction``) imports."""
    try:
        from trl.kernels import ChunkedLogProbFunction  # noqa: F401
    except Exception:  # noqa: BLE001 - absent, or an older TRL without it
        return False
    return True


def fused_logprob_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    token_chunk: int = DEFAULT_TOKEN_CHUNK,
    vocab_chunk: int | None = None,
    backend: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``targets`` and entropies under ``softmax((hidden Wᵀ + b) / τ)``,
    differentiable in ``hidden``, ``weight`` and ``bias``, without the full logits.

    Args:
        hidden: (..., H) final hidden states at the predicting positions (any leading shape).
        weight: (V, H) the LM head (``lm_head.weight``; the input embedding when tied).
        targets: (...) long, each in [0, V): the token each position predicts.
        bias: (V,) the head's bias, or None.
        temperature: τ > 0, the sampling temperature.
        token_chunk: Tokens per chunk (>= 1); peak memory scales with it.
        vocab_chunk: Vocabulary tile width (>= 1), or None for the whole vocabulary per chunk.
        backend: ``torch`` (this module) or ``trl`` (TRL's kernel; its token tile is its own,
            ``token_chunk`` is ignored; ``vocab_chunk`` None means 32768).

    Returns:
        ``(logprob, entropy)``, each (...) float32 (float64 for float64 inputs), shaped like
        ``targets``.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature}.")
    if token_chunk < 1 or (vocab_chunk is not None and vocab_chunk < 1):
        raise ValueError(
            f"token_chunk and vocab_chunk must be >= 1; got {token_chunk}, {vocab_chunk}.")
    if backend not in ("torch", "trl"):
        raise ValueError(f"backend must be 'torch' or 'trl'; got {backend!r}.")
    if (weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]
            or hidden.shape[:-1] != targets.shape):
        raise ValueError(
            f"want hidden (..., H), weight (V, H), targets (...); got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)}, {tuple(targets.shape)}.")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be (V,) = ({weight.shape[0]},); got {tuple(bias.shape)}.")
    lead = targets.shape
    h, y = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    device = h.device.type
    if torch.is_autocast_enabled(device):  # what autocast would do to lm_head, made explicit
        dtype = torch.get_autocast_dtype(device)
        h, weight = h.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    if h.dtype != weight.dtype or (bias is not None and bias.dtype != weight.dtype):
        raise ValueError(f"hidden, weight and bias must share a dtype; got {h.dtype}, "
                         f"{weight.dtype}, {None if bias is None else bias.dtype}.")
    with torch.autocast(device, enabled=False):
        if backend == "trl":
            from trl.kernels import ChunkedLogProbFunction

            lp, ent, *_ = ChunkedLogProbFunction.apply(
                h, weight, bias, y, float(temperature), vocab_chunk or _TRL_VOCAB_CHUNK, None, 1.0,
                ("entropy",))
        else:
            lp, ent = FusedHeadFunction.apply(
                h, weight, bias, y, float(temperature), int(token_chunk), vocab_chunk)
    return lp.reshape(lead), ent.reshape(lead)
