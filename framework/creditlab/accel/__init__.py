"""Optional speed paths for specific model classes, outside the core: the core runs without them.

One path is kept, because the benchmark shows it pays for itself (``benchmarks/README.md``,
"Accelerators"): :class:`~creditlab.accel.fused_decode.FusedDecoder`, the HF backend's one-token
decoding steps for float32 Llama/Qwen2 models computed straight from the parameters. ``model.
accelerator`` chooses per run:

* ``auto`` (default): fused decoding where :func:`~creditlab.accel.support.supported` accepts the
  model and the installed ``transformers`` is within the tested range, else ``none``;
* ``none``: the model's own forward everywhere;
* ``fused``: fused decoding, and an error naming the reason when the model or the
  ``transformers`` version is not one it is tested with.

The tested ``transformers`` range is the ``accel`` extra of creditlab's ``pyproject.toml``
(installed metadata, so wheels carry it too). What a run used is recorded in its
``environment.json`` (``backend.accelerator``) and in the W&B run's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

import transformers
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from creditlab.accel.support import supported
from creditlab.errors import ConfigError

MODES = ("auto", "none", "fused")


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
        decoding: ``fused`` or ``none``.
        reason: Why, in a sentence (recorded with the run).
    """

    requested: str
    decoding: str
    reason: str

    def record(self) -> dict[str, str]:
        return {"requested": self.requested, "decoding": self.decoding, "reason": self.reason}


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
