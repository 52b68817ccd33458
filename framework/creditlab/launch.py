"""Deprecated path: this module moved to :mod:`creditlab.run.launch` (issue 41).

Kept because docs/gpu.md ran a composed config from Python with its ``run``. Every name still
resolves, from the new module, with a DeprecationWarning naming the new path: import from
``creditlab.run.launch`` instead. To be removed in a later release.
"""

from __future__ import annotations

import warnings
from typing import Any

from creditlab.run import launch as _moved


def __getattr__(name: str) -> Any:
    value = getattr(_moved, name)
    warnings.warn(
        f"creditlab.launch is deprecated: import {name} from creditlab.run.launch",
        DeprecationWarning, stacklevel=2,
    )
    return value


if __name__ == "__main__":  # python -m creditlab.launch RUN_DIR: a worker rank, as creditlab.run.launch
    warnings.warn("python -m creditlab.launch is deprecated: python -m creditlab.run.launch",
                  DeprecationWarning, stacklevel=1)
    _moved.main()
