"""Config folders shipped by plug-ins (entry-point group ``creditlab.conf``) on Hydra's search path."""

from __future__ import annotations

from creditlab.registry import conf_dirs


def searchpath_override() -> list[str]:
    """``["hydra.searchpath=[file://...]"]`` for every plug-in config folder, or ``[]``."""
    dirs = [path for _, path in conf_dirs()]
    if not dirs:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"]
