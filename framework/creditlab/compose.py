"""Deprecated path: this module moved to :mod:`creditlab.run.compose` (issue 41).

Kept because docs/gpu.md composed a run's config from Python with it. Every name still resolves,
from the new module, with a DeprecationWarning naming the new path: import from
``creditlab.run.compose`` instead. To be removed in a later release.
"""

from __future__ import annotations

import warnings
from typing import Any

from creditlab.run import compose as _moved


def __getattr__(name: str) -> Any:
    value = getattr(_moved, name)
    warnings.warn(
        f"creditlab.compose is deprecated: import {name} from creditlab.run.compose",
        DeprecationWarning, stacklevel=2,
    )
    return value
