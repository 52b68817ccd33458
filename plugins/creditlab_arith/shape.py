"""The ``arith_tiny`` model's shape without building it (entry point
``creditlab.model_recipe_config``): the ``LlamaConfig`` and tokenizer that
:func:`creditlab_arith.model.build_tiny_model` trains with, for ``creditlab train --dry-run``'s
memory estimate before the model loads. No training, no weights, nothing written.

Both build the config with :func:`creditlab_arith.model.tiny_config`;
``tests/unit/test_memory_plan.py`` checks it against a built checkpoint's ``config.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import LlamaConfig

from creditlab_arith.model import resolve_args, tiny_config
from creditlab_arith.task import ArithTask
from creditlab_arith.tokenizer import build_char_tokenizer


def tiny_model_shape(args: Mapping[str, Any] | None = None) -> tuple[LlamaConfig, Any]:
    """``(config, tokenizer)`` of the model ``build_tiny_model(args)`` builds.

    Raises:
        ValueError: On an unknown recipe or task argument (as the recipe itself).
    """
    resolved = resolve_args(args)
    tokenizer = build_char_tokenizer(ArithTask.Config(**resolved["task"]).delimiter)
    return tiny_config(resolved, tokenizer), tokenizer
