"""CPU checks for what a GPU run would reveal: tensors made on an implied device.

On a CPU-only machine every tensor lands on the CPU, so code that forgets the policy's device
still runs; on a GPU the same code fails with ``Expected all tensors to be on the same device``
(or silently trains on the CPU). :class:`ImplicitDeviceAudit` makes that mistake visible on a CPU:
inside it, a tensor factory (``torch.zeros``, ``torch.tensor``, ``torch.arange``, ...) called from
creditlab's own code or a plug-in without a ``device=`` argument raises :class:`ImplicitDevice`
naming the file and line. It is the strict form of running the step with the default device set
to ``meta``: a tensor made on the default device is caught where it is made, not where it meets
the model's tensors (meta tensors cannot run a causal LM's forward, which reads values from its
masks). Tensors meant to stay on the host say so (``device="cpu"``); ``*_like``/``new_*`` follow
their input and are not checked, nor are factories given a ``generator`` (it fixes the device).

Usage::

    with ImplicitDeviceAudit():
        run(cfg, out_dir)          # raises ImplicitDevice at the first device-less factory
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

#: Factories whose result lands on the default device unless told otherwise.
FACTORIES = frozenset({
    torch.zeros, torch.ones, torch.full, torch.empty, torch.tensor, torch.as_tensor, torch.arange,
    torch.randperm, torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace,
})
_TORCH = str(Path(torch.__file__).parent)


class ImplicitDevice(AssertionError):
    """A tensor factory was called without ``device=`` from audited code."""


def _default_roots() -> tuple[str, ...]:
    """creditlab's package and the repository's plug-ins (``plugins/creditlab_*``)."""
    package = Path(__file__).resolve().parents[1]  # framework/creditlab
    return (str(package) + "/", str(package.parents[1] / "plugins") + "/")


class ImplicitDeviceAudit(TorchFunctionMode):
    """Raise :class:`ImplicitDevice` for a device-less tensor factory called from ``roots``.

    Args:
        roots: Path prefixes of the audited source files (default: creditlab and its plug-ins).
        record: Collect the call sites in :attr:`found` instead of raising.
    """

    def __init__(self, roots: tuple[str, ...] | None = None, record: bool = False) -> None:
        super().__init__()
        self.roots = roots if roots is not None else _default_roots()
        self.record = record
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None and kwargs.get("generator") is None:
            implicit = not (func is torch.as_tensor and args and isinstance(args[0], torch.Tensor))
            site = self._audited_caller() if implicit else None
            if site is not None:
                message = (f"{site}: torch.{func.__name__}(...) without device=: the tensor lands on the "
                           "default device, not the policy's (pass device=<a tensor>.device, or "
                           "device='cpu' for a tensor that stays on the host)")
                if not self.record:
                    raise ImplicitDevice(message)
                self.found.append(message)
        return func(*args, **kwargs)

    def _audited_caller(self) -> str | None:
        """``file:line`` of the first caller outside torch, when it lies under ``roots``."""
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
            frame = frame.f_back
        if frame is None:
            return None
        name = str(Path(frame.f_code.co_filename).resolve())
        if name.startswith(self.roots) and "/creditlab/testing/" not in name:
            return f"{name}:{frame.f_lineno}"
        return None
