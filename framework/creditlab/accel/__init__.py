"""Optional speed paths for specific model classes, outside the core: the core runs without them.

``model.accelerator`` chooses one per run (``benchmarks/README.md``, "Accelerators", has the
measurements behind each):

* ``auto`` (default): fused decoding (:class:`~creditlab.accel.fused_decode.FusedDecoder`, the HF
  backend's one-token steps for float32 Llama/Qwen2 models computed straight from the parameters)
  where :func:`~creditlab.accel.support.supported` accepts the model and the installed
  ``transformers`` is within the tested range; else ``none``. No start-up cost.
* ``none``: the model's own forward everywhere.
* ``fused``: fused decoding, and an error naming the reason when the model or the
  ``transformers`` version is not one it is tested with.
* ``compile``: ``torch.compile(model.forward, dynamic=True)`` for decoding and training alike (a
  well-kept library instead of hand-written kernels): much faster steps once compiled, but the
  first compile takes minutes on a CPU, so it pays on long runs only.

The tested ``transformers`` range of the fused path is the ``accel`` extra of creditlab's
``pyproject.toml`` (installed metadata, so wheels carry it too). What a run used is recorded in its
``environment.json`` (``accelerator``, and ``backend.accelerator`` for the decoding path) and in
the W&B run's config.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
import transformers
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from creditlab.accel.support import supported
from creditlab.errors import ConfigError

MODES = ("auto", "none", "fused", "compile")


def tested_transformers() -> SpecifierSet | None:
    """The ``transformers`` versions the fused path is tested against (the ``accel`` extra of the
    installed creditlab), or ``None`` when creditlab's metadata is not installed."""
    try:
        requires = metadata.requires("creditlab") or []
    except metadata.PackageNotFoundError:
        return None
    for text in requires:
        req = Requirement(text)
        if req.name == "transformers" and req.marker is not None and req.marker.evaluate({"extra": "accel"}):
            return req.specifier
    return None


@dataclass(frozen=True)
class Choice:
    """The speed path a run uses.

    Attributes:
        requested: ``model.accelerator``.
        path: ``fused`` (fused decoding), ``compile`` (the compiled model forward) or ``none``.
        reason: Why, in a sentence (recorded with the run).
    """

    requested: str
    path: str
    reason: str

    def record(self) -> dict[str, str]:
        return {"requested": self.requested, "path": self.path, "reason": self.reason}


def choose(mode: str, model: Any) -> Choice:
    """The speed path for ``model`` under ``model.accelerator=mode``.

    Raises:
        ConfigError: ``mode`` is not one of :data:`MODES`, or ``fused`` for a model or a
            ``transformers`` version the fused decoder is not tested with.
    """
    if mode not in MODES:
        raise ConfigError(f"model.accelerator must be one of {', '.join(MODES)}; got '{mode}'.")
    if mode == "none":
        return Choice(mode, "none", "model.accelerator=none")
    if mode == "compile":
        return Choice(mode, "compile", "torch.compile(model.forward, dynamic=True)")
    name = type(model).__name__
    if not supported(model):
        why = (f"{name} is not a float32 Llama/Qwen2 model of the exact transformers classes the "
               "fused decoder reproduces")
        if mode == "fused":
            raise ConfigError(f"model.accelerator=fused: {why}. Use model.accelerator=auto or none.")
        return Choice(mode, "none", why)
    tested, have = tested_transformers(), Version(transformers.__version__)
    if tested is not None and have not in tested:
        why = f"transformers {have} is outside the tested range {tested}"
        if mode == "fused":
            raise ConfigError(f"model.accelerator=fused: {why}. Use model.accelerator=auto or none, "
                              "or install a tested transformers (pip install 'creditlab[accel]').")
        return Choice(mode, "none", why)
    return Choice(mode, "fused", f"{name} is supported" + (f" (transformers {have})" if tested else ""))


def compile_model(model: Any, mode: str) -> Any:
    """``model`` with its forward compiled (``torch.compile(model.forward, dynamic=True)``) when
    ``mode`` is ``compile``, else ``model`` unchanged. The parameters and their names are the
    model's own (checkpoints and weight syncs are unaffected); only the call is compiled.

    Inductor's cache goes to a folder of this process's CPU kernels,
    ``<tmp>/torchinductor_<user>_<capability>``, unless ``TORCHINDUCTOR_CACHE_DIR`` names another
    than torch's default: torch 2.13 reuses code generated under one ``ATEN_CPU_CAPABILITY`` under
    another, and a kernel cached with AVX2 then fails to build with the baseline's headers
    (``'at::vec' has not been declared``; seen here)."""
    if mode == "compile":
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
        default = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
        if os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR", default)) == os.path.abspath(default):
            capability = torch.backends.cpu.get_cpu_capability().lower()
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}_{capability}"  # torch sets the default at import
        model.forward = torch.compile(model.forward, dynamic=True)
    return model
