"""Hydra search path: config folders shipped by plug-ins (entry-point group ``creditlab.conf``)
and the repository's ``sweeps/`` folder (the config group ``sweeps``: ``+sweeps=<name>``)."""

from __future__ import annotations

from creditlab.registry import conf_dirs
from creditlab.train import CONF_DIR

#: Parent of ``sweeps/``: on the search path, ``sweeps/<name>.yaml`` is option ``<name>`` of the
#: ``sweeps`` group.
SWEEPS_ROOT = CONF_DIR.parent


def split_searchpath(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(user search path entries, the other overrides)``: a user's ``hydra.searchpath=[a,b]``
    would replace creditlab's own list (plug-in config folders, ``sweeps/``), so it is taken out
    and joined to it by :func:`searchpath_override`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    user, rest = [], []
    for text in overrides:
        if text.lstrip("+~").startswith("hydra.searchpath="):
            value = OverridesParser.create().parse_override(text.lstrip("+~")).value()
            user.extend(str(v) for v in (value if isinstance(value, list) else [value]))
        else:
            rest.append(text)
    return user, rest


def searchpath_override(user: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``["hydra.searchpath=[...]"]``: the user's entries first (they win on a name clash), then
    every plug-in config folder and ``sweeps/``."""
    dirs = [*user, *(f"file://{path}" for _, path in conf_dirs())]
    if (SWEEPS_ROOT / "sweeps").is_dir():
        dirs.append(f"file://{SWEEPS_ROOT}")
    if not dirs:
        return []
    return ["hydra.searchpath=[" + ",".join(dirs) + "]"]
