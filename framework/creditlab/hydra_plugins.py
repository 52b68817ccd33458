"""Hydra search path: config folders shipped by plug-ins (entry-point group ``creditlab.conf``)
and the repository's ``sweeps/`` folder (the config group ``sweeps``: ``+sweeps=<name>``)."""

from __future__ import annotations

from creditlab.registry import conf_dirs
from creditlab.train import CONF_DIR

#: Parent of ``sweeps/``: on the search path, ``sweeps/<name>.yaml`` is option ``<name>`` of the
#: ``sweeps`` group.
SWEEPS_ROOT = CONF_DIR.parent


def searchpath_override() -> list[str]:
    """``["hydra.searchpath=[file://...]"]`` for every plug-in config folder and ``sweeps/``."""
    dirs = [path for _, path in conf_dirs()]
    if (SWEEPS_ROOT / "sweeps").is_dir():
        dirs.append(str(SWEEPS_ROOT))
    if not dirs:
        return []
    return ["hydra.searchpath=[" + ",".join(f"file://{d}" for d in dirs) + "]"]
