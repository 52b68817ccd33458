"""The ``arith_tiny`` model's shape without building it (entry point
``creditlab.model_recipe_config``): the ``LlamaConfig`` and tokenizer that
:func:`creditlab_arith.model.build_tiny_model` trains with, for ``creditlab train --dry-run``'s
memory estimate before the model loads. No training, no weights, nothing written.

``tests/unit/test_memory_plan.py`` checks it against a built checkpoint's ``config.json``; keep it
equal to the config ``creditlab_arith.model._train`` builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import LlamaConfig

from creditlab_arith.model import resolve_args
from creditlab_arith.task import ArithTask
from creditlab_arith.tokenizer import build_char_tokenizer


def tiny_model_shape(args: Mapping[str, Any] | None = None) -> tuple[LlamaConfig, Any]:
    """``(config, tokenizer)`` of the model ``build_tiny_model(args)`` builds.

    Raises:
        ValueError: On an unknown recipe or task argument (as the recipe itself).
    """
    resolved = resolve_args(args)
    tokenizer = build_char_tokenizer(ArithTask.Config(**resolved["task"]).delimiter)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=resolved["hidden_size"],
        intermediate_size=resolved["intermediate_size"],
        num_hidden_layers=resolved["layers"],
        num_attention_heads=resolved["heads"],
        num_key_value_heads=resolved["heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return config, tokenizer
