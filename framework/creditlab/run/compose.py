"""Composing a run's config with Hydra: creditlab's ``conf/`` folder, the config folders shipped by
plug-ins (entry-point group ``creditlab.conf``) and the ``sweeps/`` folder (the config group
``sweeps``: ``+sweeps=<name>``) on the search path."""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

from creditlab.errors import ConfigError
from creditlab.registry import conf_dirs


def find_conf_dir() -> Path:
    """``conf/`` of the source checkout beside the package (editable installs), else the copy a
    wheel installs under ``<prefix>/share/creditlab/conf`` (pyproject's data-files); the source
    path when neither exists (:func:`compose` then says so)."""
    source = Path(__file__).resolve().parents[3] / "conf"
    if source.is_dir():
        return source
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix, sysconfig.get_config_var("userbase") or "")):
        installed = Path(prefix) / "share" / "creditlab" / "conf"
        if prefix and installed.is_dir():
            return installed
    return source


CONF_DIR = find_conf_dir()
#: Launcher presets that need Hydra's submitit plug-in (the optional extra ``slurm``).
SUBMITIT_LAUNCHERS = {"slurm", "submitit_slurm", "submitit_local"}
SUBMITIT_MISSING = (
    "hydra/launcher={} needs Hydra's submitit launcher plug-in, which is not installed: "
    "pip install 'creditlab[slurm]' (the hydra-submitit-launcher package)."
)

#: Parent of ``sweeps/``: on the search path, ``sweeps/<name>.yaml`` is option ``<name>`` of the
#: ``sweeps`` group.
SWEEPS_ROOT = CONF_DIR.parent


def split_searchpath(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``(user search path entries, the other overrides)``: a user's ``hydra.searchpath=[a,b]``
    would replace creditlab's own list (plug-in config folders, ``sweeps/``), so it is taken out
    and joined to it by :func:`searchpath_override`."""
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


def _plugin_installed(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _check_launcher_plugin(overrides: list[str]) -> None:
    """Raise ConfigError when a launcher preset's Hydra plug-in is missing (Hydra itself would
    only say that the option does not exist)."""
    for text in overrides:
        key, _, value = text.lstrip("+~").partition("=")
        if key == "hydra/launcher" and value in SUBMITIT_LAUNCHERS:
            if not _plugin_installed("hydra_plugins.hydra_submitit_launcher"):
                raise ConfigError(SUBMITIT_MISSING.format(value))


def compose(overrides: list[str]) -> DictConfig:
    """The composed config for ``overrides`` (with the Hydra node available for interpolation).

    Raises:
        ConfigError: No config folder, or a launcher preset whose plug-in is missing.
        hydra.errors.HydraException, omegaconf.errors.OmegaConfBaseException: A bad override
            (``creditlab train`` turns these into one line naming the fix).
    """
    if not (CONF_DIR / "train.yaml").is_file():
        raise ConfigError(
            f"creditlab's config folder was not found (looked for {CONF_DIR}/train.yaml and "
            "<prefix>/share/creditlab/conf). Install from a source checkout with `pip install -e .`, "
            "or reinstall the package so its conf/ and sweeps/ data files are installed."
        )
    _check_launcher_plugin(overrides)
    user, overrides = split_searchpath(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="creditlab"):
        return hydra_compose("train", overrides=[*searchpath_override(user), *overrides])
