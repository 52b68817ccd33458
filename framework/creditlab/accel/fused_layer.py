"""One decoder layer's weights as :class:`~creditlab.accel.fused_decode.FusedDecoder`'s steps read
them (fused, transposed copies or the module's own tensors), and the elementwise formulas of a
Llama/Qwen2 step that are not matrix products (RMSNorm, the rotary embedding's signed sine).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from creditlab.accel.support import base_linear, effective_weight

__all__ = ["Layer", "rms_norm", "signed_sin"]


def rms_norm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    """``LlamaRMSNorm.forward`` / ``Qwen2RMSNorm.forward`` for float32 (``F.rms_norm`` runs the
    same ops: ``weight * (x * rsqrt(mean(x²) + eps))``)."""
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``rotate_half(x) * sin == x.roll(D/2, -1) * signed_sin(sin)`` (``rotate_half`` negates the
    second half and swaps the halves)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


class Layer:
    """The weights one decoder layer's step reads (fused copies or the module's own tensors)."""

    def __init__(self, layer: Any, fuse: bool, dtype: torch.dtype = torch.float32) -> None:
        a, mlp = layer.self_attn, layer.mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.fused = fuse
        if fuse:  # weight copies in ``dtype`` (LoRA merged in); biases stay float32
            qkv = [base_linear(p) for p in (a.q_proj, a.k_proj, a.v_proj)]
            self.w_qkv = torch.cat([effective_weight(p) for p in (a.q_proj, a.k_proj, a.v_proj)]
                                   ).t().to(dtype).contiguous()
            self.b_qkv = (
                torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)
                           for p in qkv])
                if any(p.bias is not None for p in qkv) else None
            )
            gu = [base_linear(p) for p in (mlp.gate_proj, mlp.up_proj)]
            self.w_gu = torch.cat([effective_weight(p) for p in (mlp.gate_proj, mlp.up_proj)]
                                  ).t().to(dtype).contiguous()
            self.b_gu = (
                torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)
                           for p in gu])
                if any(p.bias is not None for p in gu) else None
            )
            self.w_o = effective_weight(a.o_proj).t().to(dtype).contiguous()
            self.b_o = base_linear(a.o_proj).bias
            self.w_down = effective_weight(mlp.down_proj).t().to(dtype).contiguous()
            self.b_down = base_linear(mlp.down_proj).bias
        else:
            self.q, self.k, self.v, self.o = a.q_proj, a.k_proj, a.v_proj, a.o_proj
            self.gate, self.up, self.down = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.inter = mlp.gate_proj.out_features

    @staticmethod
    def _mm(x: torch.Tensor, w_t: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """(A, in) float32 @ (in, out) + (out,): float32, the product in ``w_t``'s dtype."""
        if w_t.dtype == torch.float32:
            return torch.addmm(b, x, w_t) if b is not None else torch.mm(x, w_t)
        y = torch.mm(x.to(w_t.dtype), w_t).float()
        return y.add_(b) if b is not None else y

    def qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self._mm(x, self.w_qkv, self.b_qkv)
        return torch.cat([F.linear(x, p.weight, p.bias) for p in (self.q, self.k, self.v)], dim=-1)

    def o_proj(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return self._mm(x, self.w_o, self.b_o)
        return F.linear(x, self.o.weight, self.o.bias)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            gu = self._mm(x, self.w_gu, self.b_gu)
            act = F.silu(gu[:, : self.inter]) * gu[:, self.inter :]
            return self._mm(act, self.w_down, self.b_down)
        act = F.silu(F.linear(x, self.gate.weight, self.gate.bias)) * F.linear(
            x, self.up.weight, self.up.bias)
        return F.linear(act, self.down.weight, self.down.bias)
