"""Which models the fused decoder reproduces exactly: a supported architecture, every submodule of
the exact type ``transformers`` builds, float32, full attention, no hooks (see
:mod:`creditlab.accel.fused_decode`), possibly wrapped by ``peft`` with plain LoRA adapters on its
linear layers (whose effective weight ``W + Σ scaling·B·A`` the decoder copies)."""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch.nn.modules import module as nn_module

__all__ = ["SUPPORTED", "base_linear", "effective_weight", "inner_model", "is_lora", "supported"]

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


def inner_model(model: Any) -> Any:
    """The causal LM under a ``peft`` wrapper (``get_base_model()``), else ``model`` itself."""
    if callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config"):
        return model.get_base_model()
    return model


def is_lora(module: Any) -> bool:
    """Whether ``module`` is a ``peft`` LoRA linear layer."""
    return type(module).__name__ == "Linear" and type(module).__module__ == "peft.tuners.lora.layer"


def _plain_lora(module: Any) -> bool:
    """A LoRA layer whose output is exactly ``base(x) + Σ_active scaling·B(A(x))`` in eval mode:
    an exact ``nn.Linear`` base, unmerged, no DoRA or other variant, no LoRA bias, no
    ``fan_in_fan_out``, every active adapter a pair of exact bias-free ``nn.Linear``."""
    active = [a for a in module.active_adapters if a in module.lora_A]
    return (
        type(module.base_layer) is torch.nn.Linear and not module.merged_adapters
        and not module.lora_variant and not any(module.lora_bias.values())
        and not getattr(module, "fan_in_fan_out", False)
        and all(type(m[a]) is torch.nn.Linear and m[a].bias is None
                for a in active for m in (module.lora_A, module.lora_B))
    )


def base_linear(module: Any) -> torch.nn.Linear:
    """The ``nn.Linear`` holding a linear layer's base weight and bias (a LoRA layer's base)."""
    return module.base_layer if is_lora(module) else module


def effective_weight(module: Any) -> torch.Tensor:
    """(out, in): the weight a linear layer computes with: its own, or for a LoRA layer with
    adapters enabled ``W + Σ_active get_delta_weight(a)`` (peft's ``scaling·B·A``)."""
    base = base_linear(module)
    if base is module or module.disable_adapters:
        return base.weight
    active = [a for a in module.active_adapters if a in module.lora_A]
    return base.weight + sum(module.get_delta_weight(a) for a in active)


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
    wrapper, model = model, inner_model(model)
    if wrapper is not model and not _no_hooks(wrapper):
        return False
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
    lora = [lin for lin in linears if is_lora(lin)]
    if any(type(lin) is not torch.nn.Linear and not is_lora(lin) for lin in linears):
        return False
    if not all(_plain_lora(lin) for lin in lora):
        return False
    bases = [base_linear(lin) for lin in linears]
    tensors = [lin.weight for lin in bases]
    tensors += [lin.bias for lin in bases if lin.bias is not None]
    tensors += [m.weight for lin in lora for m in (*lin.lora_A.values(), *lin.lora_B.values())]
    tensors += [base.embed_tokens.weight, base.norm.weight]
    tensors += [layer.input_layernorm.weight for layer in layers]
    tensors += [layer.post_attention_layernorm.weight for layer in layers]
    if not all(_plain_tensor(t, dtype, device) for t in tensors):
        return False
    return _no_hooks(model)
