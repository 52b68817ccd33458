"""``trainer.precision=auto``: bf16 only where the hardware has bf16 units (issue 54, item 2).

bf16 autocast pays on a CPU only where it multiplies bf16 in hardware (AVX512-BF16, AMX); on a CPU
without them (AVX2 only, or torch's kernels restricted to AVX2 with ``ATEN_CPU_CAPABILITY=avx2``,
the stand-in for such a CPU) bf16 is emulated and fp32 is the choice. On a GPU bf16 is used where
the device supports it. The choice is made once, when the config is validated, and written into the
config in place of ``auto``: a run's ``config.yaml`` holds the precision it trained with, so a
resume on a machine that would choose differently is refused by the run-directory guard instead of
mixing two precisions in one run.

Where ``auto`` picks bf16 on a CPU, decoding follows: an ``hf`` backend left at ``backend.dtype:
auto`` decodes with bf16 matrix products (``backend.dtype=bfloat16``), the larger share of the
saving on a real model (generation and evaluations); ``precision=bf16`` (conf/precision/) sets the
same two keys by hand. ``auto`` is an opt-in; the presets keep ``32-true`` until bf16 is shown to
change no conclusion (sweeps/bf16_equivalence.yaml).
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

AUTO = "auto"
BF16 = "bf16-mixed"
FP32 = "32-true"
#: torch's kernel levels (``torch.backends.cpu.get_cpu_capability()``) at which its own bf16
#: kernels use AVX-512 (below them, bf16 runs through AVX2 or scalar conversions).
AVX512_LEVELS = ("AVX512", "AVX512_BF16", "AMX")


def cpu_bf16_units() -> list[str]:
    """The bf16 instruction sets this CPU reports, as torch sees them: ``AVX512-BF16``, ``AMX``."""
    units = []
    if torch.cpu._is_avx512_bf16_supported():
        units.append("AVX512-BF16")
    if torch.cpu._is_amx_tile_supported():
        units.append("AMX")
    return units


def on_gpu(accelerator: str) -> bool:
    """Whether ``trainer.accelerator=accelerator`` trains on a GPU (``gpu``/``cuda``, or ``auto``
    where CUDA is available)."""
    accelerator = str(accelerator).lower()
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def choose(accelerator: str) -> tuple[str, str]:
    """``(precision, why)`` for ``trainer.accelerator=accelerator``.

    A GPU (``gpu``/``cuda``, or ``auto`` where CUDA is available): bf16-mixed where the device
    supports bf16, else 32-true. Otherwise the CPU: bf16-mixed only when it reports bf16 units
    and torch's kernels are not restricted below AVX-512.
    """
    accelerator = str(accelerator).lower()
    if on_gpu(accelerator):
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return BF16, f"the GPU ({torch.cuda.get_device_name(0)}) supports bf16"
        return FP32, "the GPU does not support bf16 (or none is visible)"
    if accelerator not in ("cpu", "auto"):
        return FP32, f"accelerator {accelerator!r}: auto chooses bf16 on CPUs and CUDA GPUs only"
    units, level = cpu_bf16_units(), torch.backends.cpu.get_cpu_capability()
    if not units:
        return FP32, "this CPU reports no bf16 instructions (AVX512-BF16 or AMX): bf16 would be emulated"
    if level not in AVX512_LEVELS:
        return FP32, (f"torch's CPU kernels are restricted to {level} (ATEN_CPU_CAPABILITY), the stand-in for "
                      f"a CPU without bf16 units, though this one reports {' and '.join(units)}")
    return BF16, f"this CPU reports {' and '.join(units)} and torch's kernels use {level}"


def resolve(cfg: DictConfig) -> str | None:
    """Replace ``trainer.precision: auto`` in ``cfg`` by the precision :func:`choose` picks, and
    return a line saying what it picked and why; ``None`` when the precision is not ``auto``."""
    value: Any = OmegaConf.select(cfg, "trainer.precision", default=None)
    if str(value) != AUTO:
        return None
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu")).lower()
    precision, why = choose(accelerator)
    decode = ""
    on_cpu = accelerator in ("cpu", AUTO) and not on_gpu(accelerator)
    backend = OmegaConf.select(cfg, "backend", default=None)
    with open_dict(cfg):
        cfg.trainer.precision = precision
        if (precision == BF16 and on_cpu and backend is not None and backend.get("name") == "hf"
                and str(backend.get("dtype", "auto")) == AUTO):
            cfg.backend.dtype = "bfloat16"
            decode = "; decoding too (backend.dtype=bfloat16)"
    return f"trainer.precision=auto: {precision}{decode}, because {why}"
