"""Deprecated path: this module moved to :mod:`creditlab.analysis.significance` (issue 41).

Kept because docs/comparing.md offered its tests, which take plain arrays, to other scores. Every
name still resolves, from the new module, with a DeprecationWarning naming the new path: import
from ``creditlab.analysis.significance`` instead. To be removed in a later release.
"""

from __future__ import annotations

import warnings
from typing import Any

from creditlab.analysis import significance as _moved


def __getattr__(name: str) -> Any:
    value = getattr(_moved, name)
    warnings.warn(
        f"creditlab.significance is deprecated: import {name} from creditlab.analysis.significance",
        DeprecationWarning, stacklevel=2,
    )
    return value
