"""Fused decoding steps for float32 Llama/Qwen2 models: the one-token steps of
:class:`~creditlab.backends.hf.HFBackend` computed straight from the model's parameters, with
about half the ops of the model's forward (``model.accelerator=fused``; ``auto`` picks it where
:func:`~creditlab.accel.support.supported`). The matrix products run in float32, or in bfloat16
from bfloat16 copies of the weights (``backend.dtype=bfloat16``: 2-3x the float32 throughput on
a CPU with bfloat16 units, benchmarks/README.md), the rest in float32.

For a small model most of a decoding step's time is not the matrix products but the module
machinery and the elementwise ops around them. :class:`FusedDecoder` runs a batch of A rows, one
new column each: q/k/v come from one matrix product and gate/up from another (the weights are
concatenated and transposed once per ``generate`` call, within a memory budget; above it the
module weights are used in place); the rotary embedding is computed once per step and applied to
q and k together; attention for one query is two batched products and a softmax over keys/values
the decoder keeps itself (no 4-D mask, no cache object). Rows that share a long context (a GRPO
group's prompt) keep one copy of its keys/values and attend to it once per group, so the prompt is
not re-read once per row.

The logits equal the model's forward up to float rounding: the formulas of RMSNorm, the rotary
embedding, attention, the MLP and the residuals are the model's own; what differs is how some are
evaluated (fused products, ``addcmul`` for the rotary embedding, q scaled before ``q·k``). Used only
for models of the exact classes in :data:`~creditlab.accel.support.SUPPORTED` whose every submodule is of the exact type
``transformers`` builds, in float32, with full attention in every layer, SiLU, the ``sdpa`` or
``eager`` attention implementation, ``pretraining_tp == 1`` and no hooks on any module; for any
other model :func:`supported` is False and the backend runs the model's own forward. It reads
``transformers`` internals (module classes, the rotary embedding's call, cache layers): the
versions it is tested against are the ``accel`` extra of creditlab's ``pyproject.toml``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from creditlab.accel.fused_layer import Layer, rms_norm, signed_sin
from creditlab.accel.support import base_linear, inner_model, is_lora, supported
from creditlab.step.forward import dynamic_rope

__all__ = ["FusedDecoder"]

#: Default budget for the concatenated/transposed weight copies (see ``FusedDecoder.build``).
DEFAULT_COPY_BUDGET_MB = 512.0
#: Default context width from which rows sharing a context share its keys/values in decoding
#: (see ``FusedDecoder.start``).
DEFAULT_MIN_SHARED_CONTEXT = 32
#: Columns first allocated per row for generated tokens (all of ``max_new`` when fewer): a long
#: budget that rows rarely fill (thoughts decoded in one pass) takes memory only as it is used.
FIRST_ROOM = 128


class FusedDecoder:
    """Decoding steps of one supported model, one forward batch at a time.

    Usage: ``dec = FusedDecoder.build(model)`` (after the weights last changed: fused weight copies
    are snapshots); per batch, prefill its distinct contexts with the model, ``dec.start(
    prefill_cache, inverse, context_mask, max_new)``, then ``dec.step(tokens, positions)`` once
    per new token and ``dec.select(keep)`` to drop finished rows.

    Keys/values: when rows share contexts of at least ``min_shared_context`` tokens they live in two
    parts, the prefilled contexts stored once per *distinct* context (U, H_kv, W, D) and the
    generated tokens per row (A, H_kv, max_new, D); attention reads each shared context once for
    the whole group (its rows' queries stacked into one product) and combines both parts in one
    softmax, so a group's prompt is not re-read once per row. Otherwise every row has one buffer
    (A, H_kv, W + max_new, D) holding a copy of its context, and attention is one product each
    for scores and output.
    """

    def __init__(self, model: Any, fuse: bool, dtype: torch.dtype = torch.float32) -> None:
        model = inner_model(model)  # under a peft wrapper: the causal LM it adapts
        cfg = model.config
        base = model.model
        self.model = model
        self.embed = base.embed_tokens.weight
        self.rotary = base.rotary_emb
        self.norm = base.norm
        self.lm_head = model.lm_head
        #: The LM head's weight in the products' dtype (the module's own tensor in float32).
        self.head_weight = model.lm_head.weight.to(dtype)
        first = base.layers[0].self_attn
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = first.head_dim
        self.scaling = first.scaling
        self.layers = [Layer(layer, fuse, dtype) for layer in base.layers]
        self.fused_weights = fuse
        self.dtype = dtype

    @classmethod
    def build(
        cls, model: Any, copy_budget_mb: float = DEFAULT_COPY_BUDGET_MB,
        dtype: torch.dtype = torch.float32,
    ) -> FusedDecoder | None:
        """A decoder for ``model``, or ``None`` when the model is not exactly supported, or when
        ``dtype`` is not float32 and its weight copies would exceed ``copy_budget_mb``.

        Args:
            model: The causal LM (in eval mode, as during generation).
            copy_budget_mb: Concatenate and transpose the projection weights into copies when
                they take at most this many MB; otherwise use the module weights in place.
            dtype: The matrix products' dtype: float32 (the model's own), or bfloat16 (weight
                copies in bfloat16, including the LM head's; norms, the rotary embedding,
                attention, the residual stream and the keys/values stay float32).

        A ``peft`` model with plain LoRA adapters is decoded from copies of its effective
        weights (``W + scaling·B·A``), so it needs the copies too.
        """
        if not supported(model):
            return None
        size = dtype.itemsize
        linears = [lin for layer in inner_model(model).model.layers
                   for lin in (*layer.self_attn.children(), *layer.mlp.children())
                   if isinstance(lin, torch.nn.Module) and hasattr(lin, "in_features")]
        params = size * sum(base_linear(lin).weight.numel() for lin in linears)
        fuse = params <= copy_budget_mb * 2**20
        if not fuse and (dtype != torch.float32 or any(is_lora(lin) for lin in linears)):
            return None  # bfloat16 and LoRA need the copies
        return cls(model, fuse=fuse, dtype=dtype)

    # -- state -------------------------------------------------------------------------------------
    def start(
        self,
        prefill_cache: Any,
        inverse: torch.Tensor,
        context_mask: torch.Tensor | None,
        max_new: int,
        min_shared_context: int = DEFAULT_MIN_SHARED_CONTEXT,
    ) -> None:
        """Take the prefilled keys/values and make room for ``max_new`` generated tokens (for
        :data:`FIRST_ROOM` at first, twice as many each time they fill up).

        Args:
            prefill_cache: The model's cache after prefilling U contexts (left-padded to width W):
                every layer holds ``keys``/``values`` (U, H_kv, W, D).
            inverse: (A,) long, the context of each row.
            context_mask: (U, W) bool, False at padding; ``None`` when there is none.
            max_new: Tokens the steps may append per row.
            min_shared_context: Keep each context's keys/values once and attend to them once per
                group when rows share contexts and W is at least this; otherwise copy them to
                every row (two products less per layer and step: cheaper for short contexts).
        """
        kp = [layer.keys.float() for layer in prefill_cache.layers]  # float32 whatever the
        vp = [layer.values.float() for layer in prefill_cache.layers]  # prefill computed in
        u, h_kv, w, d = kp[0].shape
        if any(k.shape != (u, h_kv, w, d) for k in kp + vp):
            raise ValueError("prefill cache layers of different shapes")
        a = len(inverse)
        self._w, self._n, self._mask, self._max_new = w, 0, context_mask, max_new
        self._rope = None  # cos/sin tables by position, made at the first step
        self._split = u < a and w >= min_shared_context
        room = min(max_new, FIRST_ROOM)  # columns for generated tokens; grown when they fill up
        if self._split:
            self._kp, self._vp = kp, vp
            self._kg = [kp[0].new_empty((a, h_kv, room, d)) for _ in kp]
            self._vg = [kp[0].new_empty((a, h_kv, room, d)) for _ in kp]
        else:  # one buffer per row: context columns [0, W), then the generated ones
            self._kp = self._vp = None
            self._kg, self._vg = [], []
            for src, dst in ((kp, self._kg), (vp, self._vg)):
                for x in src:
                    buf = x.new_empty((a, h_kv, w + room, d))
                    torch.index_select(x, 0, inverse, out=buf[:, :, :w])
                    dst.append(buf)
        self._regroup(inverse)

    def _room(self) -> int:
        """Columns allocated for generated tokens."""
        return self._kg[0].shape[2] - (0 if self._split else self._w)

    def _grow(self) -> None:
        """Twice the room for generated tokens (at most ``max_new``), the written columns copied."""
        filled = self._n + (0 if self._split else self._w)
        extra = min(self._room(), self._max_new - self._room())

        def grown(x: torch.Tensor) -> torch.Tensor:
            out = x.new_empty((x.shape[0], x.shape[1], x.shape[2] + extra, x.shape[3]))
            out[:, :, :filled] = x[:, :, :filled]
            return out

        self._kg = [grown(k) for k in self._kg]
        self._vg = [grown(v) for v in self._vg]
        self._regroup(self._inverse)  # the padding bias spans the new columns

    def _regroup(self, inverse: torch.Tensor) -> None:
        """Row -> context map; each context's rows get consecutive query slots."""
        self._inverse = inverse
        self._bias = None
        if self._mask is not None:  # (A, 1, 1, W [+ max_new]): -inf at padding keys
            width = self._w + (0 if self._split else self._kg[0].shape[2] - self._w)
            bias = self._kg[0].new_zeros((len(inverse), width))
            bias[:, : self._w].masked_fill_(~self._mask.index_select(0, inverse), float("-inf"))
            self._bias = bias[:, None, None, :]
        if not self._split:
            return
        u = self._kp[0].shape[0]
        counts = torch.bincount(inverse, minlength=u)
        g = int(counts.max())
        self._g = g
        if len(inverse) == u * g and torch.equal(
            inverse, torch.arange(u, device=inverse.device).repeat_interleave(g)
        ):
            self._slot = None  # rows are already in slot order
        else:
            order = torch.argsort(inverse, stable=True)
            start = torch.cumsum(counts, 0) - counts
            rank = torch.empty_like(inverse)
            rank[order] = torch.arange(len(inverse), device=inverse.device) - start[inverse[order]]
            self._slot = inverse * g + rank

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows ``keep`` (and the contexts they use)."""
        inverse = self._inverse.index_select(0, keep)
        filled = self._n + (0 if self._split else self._w)  # columns written so far

        def kept(x: torch.Tensor) -> torch.Tensor:  # only the written columns are copied
            out = x.new_empty((len(keep), *x.shape[1:]))
            torch.index_select(x[:, :, :filled], 0, keep, out=out[:, :, :filled])
            return out

        self._kg = [kept(k) for k in self._kg]
        self._vg = [kept(v) for v in self._vg]
        if self._split:
            used, inverse = torch.unique(inverse, return_inverse=True)
            if len(used) < self._kp[0].shape[0]:
                self._kp = [k.index_select(0, used) for k in self._kp]
                self._vp = [v.index_select(0, used) for v in self._vp]
                if self._mask is not None:
                    self._mask = self._mask.index_select(0, used)
        self._regroup(inverse)

    def row_kv(self, b: int, fed: int) -> torch.Tensor:
        """(layers, 2, H_kv, C + fed, D): batch row ``b``'s keys/values, those of its context's C
        real (unmasked) positions, then those of its first ``fed`` generated tokens."""
        u = int(self._inverse[b])
        real = None if self._mask is None else self._mask[u].nonzero().squeeze(1)
        out = []
        for i in range(len(self.layers)):
            pair = []
            for ctx, gen in ((self._kp, self._kg), (self._vp, self._vg)):
                if self._split:
                    c, g = ctx[i][u], gen[i][b, :, :fed]
                else:
                    c, g = gen[i][b, :, : self._w], gen[i][b, :, self._w : self._w + fed]
                if real is not None:
                    c = c.index_select(1, real)
                pair.append(torch.cat([c, g], dim=1))
            out.append(torch.stack(pair))
        return torch.stack(out)

    def _to_slots(self, x: torch.Tensor) -> torch.Tensor:
        """(A, H_kv, G, *) per row -> (U, H_kv, g * G, *) per context (unused slots are 0)."""
        a, h, grp = x.shape[:3]
        u, g = self._kp[0].shape[0], self._g
        if self._slot is not None:
            x = x.new_zeros((u * g, *x.shape[1:])).index_copy_(0, self._slot, x)
        x = x.view(u, g, h, grp, *x.shape[3:]).transpose(1, 2)
        return x.reshape(u, h, g * grp, *x.shape[4:])

    def _from_slots(self, x: torch.Tensor, grp: int) -> torch.Tensor:
        """Inverse of :meth:`_to_slots`: (U, H_kv, g * G, *) -> (A, H_kv, G, *)."""
        u, h = x.shape[:2]
        g = self._g
        x = x.view(u, h, g, grp, *x.shape[3:]).transpose(1, 2).reshape(u * g, h, grp, *x.shape[3:])
        return x if self._slot is None else x.index_select(0, self._slot)

    def _rotary(self, h: torch.Tensor, positions: torch.Tensor, steps_left: int):
        """(A, 1, D) cos and signed sin (see :func:`~creditlab.accel.fused_layer.signed_sin`) at ``positions``.

        The model's rotary module computes each position's values elementwise from the position
        alone, so for static RoPE types they are tabulated once (at the first step, up to the
        last position the remaining steps can reach) and looked up; dynamic types (which rescale
        with the longest position seen) are computed at every step as the model would.
        """
        if dynamic_rope(self.model):  # the model's own call at every step, as in its decoding
            cos, sin = self.rotary(h, positions[:, None])
            return cos, signed_sin(sin)
        if self._rope is None:
            end = int(positions.max()) + steps_left
            cos, sin = self.rotary(h, torch.arange(end, device=h.device)[None])
            self._rope = (cos[0], signed_sin(sin[0]))
        cos, sin = self._rope
        return cos.index_select(0, positions)[:, None], sin.index_select(0, positions)[:, None]

    # -- one step ----------------------------------------------------------------------------------
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run one new token per row and append its keys/values; return (A, V) logits.

        Args:
            tokens: (A,) long, the new token of each row.
            positions: (A,) long, its position id.
        """
        a = tokens.shape[0]
        h_q, h_kv, d = self.heads, self.kv_heads, self.head_dim
        group = h_q // h_kv
        n, w = self._n, self._w
        if n >= self._max_new:
            raise RuntimeError(f"more decoding steps than the {n} allocated")
        if n >= self._room():
            self._grow()
        h = F.embedding(tokens, self.embed)
        cos, sin = self._rotary(h, positions, self._max_new - n)
        half = d // 2
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.norm1)
            qkv = layer.qkv(x).view(a, h_q + 2 * h_kv, d)
            qk = qkv[:, : h_q + h_kv]
            qk = torch.addcmul(qk * cos, qk.roll(half, -1), sin)  # qk*cos + rotate_half(qk)*sin
            kg, vg = self._kg[i], self._vg[i]
            col = n if self._split else w + n
            kg[:, :, col] = qk[:, h_q:]
            vg[:, :, col] = qkv[:, h_q + h_kv :]
            kg, vg = kg[:, :, : col + 1], vg[:, :, : col + 1]
            q = (qk[:, :h_q] * self.scaling).view(a, h_kv, group, d)
            if not self._split:
                scores = torch.matmul(q, kg.transpose(-1, -2))  # (A, H_kv, G, W + n + 1)
                if self._bias is not None:
                    scores = scores + self._bias[..., : col + 1]
                out = torch.matmul(torch.softmax(scores, dim=-1), vg)
            else:
                # scores against the context (once per context) and the generated tokens (per row)
                s_ctx = self._from_slots(
                    torch.matmul(self._to_slots(q), self._kp[i].transpose(-1, -2)), group)
                if self._bias is not None:
                    s_ctx = s_ctx + self._bias
                scores = torch.cat([s_ctx, torch.matmul(q, kg.transpose(-1, -2))], dim=-1)
                probs = torch.softmax(scores, dim=-1)  # (A, H_kv, G, W + n + 1)
                out = self._from_slots(
                    torch.matmul(self._to_slots(probs[..., :w]), self._vp[i]), group)
                out = out + torch.matmul(probs[..., w:], vg)  # (A, H_kv, G, D)
            h = h + layer.o_proj(out.reshape(a, h_q * d))
            h = h + layer.mlp(rms_norm(h, layer.norm2))
        self._n = n + 1
        x = rms_norm(h, self.norm)
        if self.dtype == torch.float32:
            return self.lm_head(x)
        logits = F.linear(x.to(self.dtype), self.head_weight).float()
        return logits if self.lm_head.bias is None else logits.add_(self.lm_head.bias)
