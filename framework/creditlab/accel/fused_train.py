"""The fused training forward of :func:`creditlab.forward.response_logits` for models that
:func:`creditlab.fused.supported` accepts: each distinct prompt once, prompt and response tokens
through every projection, norm and MLP as one batch, and hand-written backward passes for RMSNorm
and the rotary embedding (see :mod:`creditlab.fused` for what "fused" covers and why the results
equal the model's forward up to float rounding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from creditlab.accel.fused import _signed_sin

__all__ = ["shared_prompt_logits"]


class _RMSNorm(torch.autograd.Function):
    """``weight * (x * rsqrt(mean(x²) + eps))`` (the model's formula) for float32 ``x``; the mean
    of squares comes from one norm reduction (no squared copy)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        norm = torch.linalg.vector_norm(x, 2, dim=-1, keepdim=True)
        rstd = torch.rsqrt(norm.square_().div_(x.shape[-1]).add_(eps))
        xn = x * rstd
        ctx.save_for_backward(xn, rstd, weight)
        return weight * xn

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        xn, rstd, weight = ctx.saved_tensors
        d_weight = None
        if ctx.needs_input_grad[1]:
            d_weight = (grad * xn).reshape(-1, xn.shape[-1]).sum(0)
        d_x = None
        if ctx.needs_input_grad[0]:
            gw = grad * weight
            dot = (gw * xn).mean(-1, keepdim=True)
            # d/dx [x * rstd] applied to gw: rstd * (gw - xn * mean(gw * xn))
            d_x = torch.addcmul(gw, xn, dot, value=-1).mul_(rstd)
        return d_x, d_weight, None


def _rms(x: torch.Tensor, norm: Any) -> torch.Tensor:
    return _RMSNorm.apply(x, norm.weight, norm.variance_epsilon)


class _Rotary(torch.autograd.Function):
    """``x * cos + rotate_half(x) * sin`` (the model's formula) as ``x * cos + roll(x) * ss``
    with ``ss = _signed_sin(sin)``; its adjoint is ``g * cos + roll(g) * roll(ss)``. cos/sin get
    no gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, ss: torch.Tensor, ss_rolled: torch.Tensor):
        half = x.shape[-1] // 2
        ctx.save_for_backward(cos, ss_rolled)
        return torch.addcmul(x * cos, x.roll(half, -1), ss)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        cos, ss_rolled = ctx.saved_tensors
        half = grad.shape[-1] // 2
        return torch.addcmul(grad * cos, grad.roll(half, -1), ss_rolled), None, None, None


class _Split(torch.autograd.Function):
    """``(x[:n], x[n:])`` whose backward concatenates the two gradients (autograd's slice backward
    would zero-fill a full-size gradient for each part and add them)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, n: int):
        ctx.n, ctx.shape = n, x.shape
        return x[:n], x[n:]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g1: torch.Tensor | None, g2: torch.Tensor | None):
        shape, n = ctx.shape, ctx.n
        if g1 is None:
            g1 = g2.new_zeros((n, *shape[1:]))
        if g2 is None:
            g2 = g1.new_zeros((shape[0] - n, *shape[1:]))
        return torch.cat([g1, g2]), None


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(b, H_kv, s, d) -> (b, H_kv * n_rep, s, d), as ``transformers``' ``repeat_kv``."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def _train_layers(model: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  n_ctx: int, ctx_len: int, ctx_mask: torch.Tensor, inverse: torch.Tensor,
                  rows: int, resp_len: int, resp_mask: torch.Tensor) -> torch.Tensor:
    """All decoder layers over N = n_ctx * ctx_len + rows * resp_len tokens (N, D): the distinct
    prompts' tokens, then the response tokens. Every projection, norm and MLP runs once over all N
    tokens; attention runs per part: the prompts causally over themselves, the responses over
    their gathered prompt and causally over themselves."""
    cfg = model.config
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    rep = n_q // n_kv
    split = n_ctx * ctx_len
    cos = cos[:, None]  # (N, 1, d): broadcast over heads
    ss = _signed_sin(sin)[:, None]
    ss_rolled = ss.roll(ss.shape[-1] // 2, -1)
    for layer in model.model.layers:
        a, mlp = layer.self_attn, layer.mlp
        d = a.head_dim
        x = _rms(h, layer.input_layernorm)
        q = F.linear(x, a.q_proj.weight, a.q_proj.bias).view(-1, n_q, d)
        k = F.linear(x, a.k_proj.weight, a.k_proj.bias).view(-1, n_kv, d)
        v = F.linear(x, a.v_proj.weight, a.v_proj.bias).view(-1, n_kv, d)
        q, k = _Rotary.apply(q, cos, ss, ss_rolled), _Rotary.apply(k, cos, ss, ss_rolled)

        def parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """(n_ctx, heads, ctx_len, d) and (rows, heads, resp_len, d) views of (N, heads, d)."""
            c, r = _Split.apply(t, split)
            return (c.view(n_ctx, ctx_len, t.shape[1], d).transpose(1, 2),
                    r.view(rows, resp_len, t.shape[1], d).transpose(1, 2))

        (qc, qr), (kc, kr), (vc, vr) = parts(q), parts(k), parts(v)
        o_ctx = F.scaled_dot_product_attention(
            qc, _repeat_kv(kc, rep), _repeat_kv(vc, rep), attn_mask=ctx_mask, scale=a.scaling)
        keys = torch.cat([kc.index_select(0, inverse), kr], dim=2)
        values = torch.cat([vc.index_select(0, inverse), vr], dim=2)
        o_resp = F.scaled_dot_product_attention(
            qr, _repeat_kv(keys, rep), _repeat_kv(values, rep), attn_mask=resp_mask,
            scale=a.scaling)
        attn = torch.cat([o_ctx.transpose(1, 2).reshape(split, n_q * d),
                          o_resp.transpose(1, 2).reshape(rows * resp_len, n_q * d)])
        h = h + F.linear(attn, a.o_proj.weight, a.o_proj.bias)
        x = _rms(h, layer.post_attention_layernorm)
        act = F.silu(F.linear(x, mlp.gate_proj.weight, mlp.gate_proj.bias)) * F.linear(
            x, mlp.up_proj.weight, mlp.up_proj.bias)
        h = h + F.linear(act, mlp.down_proj.weight, mlp.down_proj.bias)
    return h


def _positions(mask: torch.Tensor) -> torch.Tensor:
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def shared_prompt_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
) -> torch.Tensor:
    """(b, T, V) float logits predicting each response token, each distinct prompt run once.

    The same computation as the shared-prompt path of :func:`creditlab.forward.response_logits`
    (which checks the preconditions: a :func:`supported` model, no dropout, ``T >= 2``): the
    distinct prompts ``input_ids[first, :P]``, and the response columns but the last attending
    to their row's prompt (its keys/values gathered by ``inverse``) and causally to themselves.
    Both parts go through each projection, norm and MLP together, as one batch of tokens.

    Args:
        model: A :func:`supported` causal LM.
        input_ids: (b, P+T) long, left-padded prompt then right-padded response.
        attention_mask: (b, P+T), 1 on real tokens.
        prompt_len: P >= 1.
        first: (U,) one row of each distinct prompt; inverse: (b,) each row's index in ``first``.
    """
    p = int(prompt_len)
    base = model.model
    dev = input_ids.device
    u, b = len(first), input_ids.shape[0]
    ctx = attention_mask[first, :p].bool()  # (U, P)
    full = attention_mask[:, :-1].bool()  # (b, P + t): the mask of every column that is run
    t = full.shape[1] - p
    ids = torch.cat([input_ids[first, :p].reshape(-1), input_ids[:, p:-1].reshape(-1)])
    pos = torch.cat([_positions(ctx).reshape(-1), _positions(full)[:, p:].reshape(-1)])
    h = base.embed_tokens(ids)  # (N, D)
    cos, sin = base.rotary_emb(h[None], pos[None])
    causal = torch.ones(p, p, dtype=torch.bool, device=dev).tril()
    ctx_mask = causal[None, None] & ctx[:, None, None, :]  # (U, 1, P, P)
    cols = torch.arange(p + t, device=dev)
    causal = cols[None, :] <= (p + torch.arange(t, device=dev))[:, None]  # (t, P + t)
    resp_mask = causal[None, None] & full[:, None, None, :]  # (b, 1, t, P + t)
    h = _train_layers(model, h, cos[0], sin[0], u, p, ctx_mask, inverse, b, t, resp_mask)
    h = _rms(h, base.norm)
    last = torch.arange(1, u + 1, device=dev) * p - 1  # each prompt's last position
    head = model.lm_head(h.index_select(0, last)).index_select(0, inverse)  # (b, V)
    logits = model.lm_head(h[u * p :]).view(b, t, -1)
    return torch.cat([head[:, None], logits], dim=1).float()
