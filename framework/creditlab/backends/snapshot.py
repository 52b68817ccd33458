"""The policy snapshot a generation engine with its own copy of the weights loads: a private
folder with the model's config, its tokenizer and one safetensors file of weights, rewritten in
place after every update (e.g. for :class:`~creditlab.backends.vllm.VLLMBackend`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def snapshot_folder(parent: str | None = None) -> Path:
    """A new private folder under ``parent``; ``None`` = ``/dev/shm`` when writable (memory, so a
    weight sync does not touch the disk), else the system temp folder."""
    if parent is None:
        shm = Path("/dev/shm")
        parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="creditlab-vllm-", dir=parent))


def write_snapshot(
    folder: Path, model_config: Any, tokenizer: Any, state_dict: dict[str, torch.Tensor], dtype: torch.dtype
) -> Path:
    """Write the model's config, tokenizer and weights (:func:`write_weights`) into ``folder``."""
    model_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_weights(state_dict, folder, dtype)
    return folder


def write_weights(state_dict: dict[str, torch.Tensor], folder: Path, dtype: torch.dtype) -> Path:
    """Write ``state_dict`` as ``folder/model.safetensors`` (floating tensors cast to ``dtype``;
    tensors sharing storage, e.g. tied embeddings, copied) and delete any other weight file there,
    so the folder holds exactly these weights. Returns the file."""
    tensors, storages = {}, set()
    for name, t in state_dict.items():
        t = t.detach().to("cpu", dtype if t.is_floating_point() else t.dtype)
        ptr = t.untyped_storage().data_ptr()
        if ptr in storages:
            t = t.clone()
        storages.add(ptr)
        tensors[name] = t.contiguous()
    target = folder / "model.safetensors"
    for old in folder.glob("*.safetensors*"):
        if old != target:
            old.unlink()
    tmp = folder / "model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, target)
    return target
