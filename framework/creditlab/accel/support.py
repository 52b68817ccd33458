"""Which models the fused decoder reproduces exactly: a supported architecture, every submodule of
the exact type ``transformers`` builds, float32, full attention, no hooks (see
:mod:`creditlab.accel.fused_decode`)."""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch.nn.modules import module as nn_module

__all__ = ["SUPPORTED", "supported"]

#: CausalLM class name -> (transformers module, class name prefix of its parts).
SUPPORTED: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("transformers.models.llama.modeling_llama", "Llama"),
    "Qwen2ForCausalLM": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
}

def _classes(model: Any) -> dict[str, type] | None:
    entry = SUPPORTED.get(type(model).__name__)
    if entry is None:
        return None
    module_name, prefix = entry
    try:
        mod = importlib.import_module(module_name)
    except ImportError:  # pragma: no cover - transformers without this architecture
        return None
    names = ("ForCausalLM", "Model", "DecoderLayer", "Attention", "MLP", "RMSNorm",
             "RotaryEmbedding")
    classes = {n: getattr(mod, prefix + n, None) for n in names}
    if any(c is None for c in classes.values()) or type(model) is not classes["ForCausalLM"]:
        return None
    return classes


def _no_hooks(model: torch.nn.Module) -> bool:
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called"):
        if getattr(nn_module, name, None):
            return False
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks or "forward" in m.__dict__:
            return False
    return True


def _plain_tensor(t: Any, dtype: torch.dtype, device: torch.device) -> bool:
    return (
        t is not None and type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.dtype == dtype and t.device == device and t.layout == torch.strided
    )


def supported(model: Any) -> bool:
    """Whether ``model`` is exactly a supported architecture that the fused passes reproduce."""
    classes = _classes(model)
    if classes is None:
        return False
    base, config = getattr(model, "model", None), getattr(model, "config", None)
    if type(base) is not classes["Model"] or config is None:
        return False
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        return False
    if getattr(config, "hidden_act", None) not in ("silu", "swish"):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager", None):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    layers = list(base.layers)
    if not layers or len(layers) != config.num_hidden_layers:
        return False
    weight = model.lm_head.weight if isinstance(model.lm_head, torch.nn.Linear) else None
    if weight is None or weight.dtype != torch.float32:  # the norms compute in float32
        return False
    dtype, device = weight.dtype, weight.device
    if type(model.lm_head) is not torch.nn.Linear:
        return False
    if type(base.embed_tokens) is not torch.nn.Embedding:
        return False
    if type(base.norm) is not classes["RMSNorm"]:
        return False
    if type(base.rotary_emb) is not classes["RotaryEmbedding"]:
        return False
    if base.embed_tokens.max_norm is not None:
        return False
    linears = [model.lm_head]
    for layer in layers:
        a, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if (type(layer) is not classes["DecoderLayer"] or type(a) is not classes["Attention"]
                or type(mlp) is not classes["MLP"]):
            return False
        if (type(layer.input_layernorm) is not classes["RMSNorm"]
                or type(layer.post_attention_layernorm) is not classes["RMSNorm"]):
            return False
        if getattr(a, "sliding_window", None) is not None:
            return False
        if type(mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU"):
            return False
        linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
        linears += [mlp.gate_proj, mlp.up_proj, mlp.down_proj]
    if any(type(lin) is not torch.nn.Linear for lin in linears):
        return False
    tensors = [lin.weight for lin in linears]
    tensors += [lin.bias for lin in linears if lin.bias is not None]
    tensors += [base.embed_tokens.weight, base.norm.weight]
    tensors += [layer.input_layernorm.weight for layer in layers]
    tensors += [layer.post_attention_layernorm.weight for layer in layers]
    if not all(_plain_tensor(t, dtype, device) for t in tensors):
        return False
    return _no_hooks(model)
