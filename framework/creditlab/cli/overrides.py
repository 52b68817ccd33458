"""Checking ``creditlab train``'s overrides before anything runs: compose the config and validate
every section and plug-in name (each value of a sweep once), so that a mistake ends with one clear
line naming the fix instead of a traceback (:func:`check`, :func:`explain`)."""

from __future__ import annotations

import re
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from creditlab.errors import ConfigError, RegistryError, closest, exit_with
from creditlab.registry import REGISTRIES
from creditlab.run.compose import CONF_DIR, SUBMITIT_MISSING, compose
from creditlab.run.config import PART_KINDS, check_machine, validate


def _sweep_variants(overrides: list[str]) -> list[list[str]]:
    """Override lists to check: every sweep at its first value, then each other value of each
    sweep (``a=1,2`` / ``range(...)`` / ``choice(...)``) once — linear, not the full grid."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    values: list[list[str]] = []
    for text, ov in zip(overrides, parsed):
        if not ov.is_sweep_override():
            values.append([text])
            continue
        # the key element keeps its prefix (+ or ++)
        values.append([f"{ov.get_key_element()}={v}" for v in ov.sweep_string_iterator()])
    base = [v[0] for v in values]
    variants = [base]
    for i, options in enumerate(values):
        variants.extend(base[:i] + [o] + base[i + 1 :] for o in options[1:])
    return variants


def explain(exc: Exception, overrides: list[str]) -> str:
    """Turn a Hydra composition error into a message that names the fix."""
    text = str(exc)
    cause = str(exc.__cause__ or "")
    missing = re.search(r"Could not find '([^']+)/([^']+)'", text)
    if missing:
        group, option = missing.groups()
        if group == "hydra/launcher" and option.startswith("submitit"):
            return SUBMITIT_MISSING.format(option)
        registered = _registered_without_config(group, option)
        if registered:
            return registered
        options = re.findall(r"^\s+(\S+)\s*$", text, flags=re.MULTILINE)
        hint = closest(option, options)
        given = [o for o in overrides if o.lstrip("+~").startswith(f"{group}=")]
        plus = given[0][: len(given[0]) - len(given[0].lstrip("+"))] if given else ""
        return (
            f"unknown {group} '{option}'." + (f" Did you mean '{plus}{group}={hint}'?" if hint else "")
            + f" Available: {', '.join(options) or '(none)'}."
        )
    bad_key = re.search(r"Could not override '([^']+)'", text) or re.search(r"Key '([^']+)' is not in struct", cause)
    if bad_key:
        path = bad_key.group(1)
        parent, _, leaf = path.rpartition(".")
        others = [o for o in overrides if not o.lstrip("+~").startswith(path + "=")]
        try:
            node = compose(others)
            for part in filter(None, parent.split(".")):
                node = node[part]
            keys = [str(k) for k in node.keys()]
        except Exception:
            keys = []
        if leaf in keys:  # the key exists; the value (a mapping) adds keys the node does not have
            inner = re.search(r"Key '([^']+)' is not in struct", cause)
            given = next((o.lstrip("+") for o in overrides if o.lstrip("+~").startswith(path + "=")), f"{path}=...")
            return (
                f"'{path}' has no key '{inner.group(1) if inner else '?'}': a value that adds keys needs a "
                f"leading '+': '+{given}' (or one key at a time, e.g. '+{path}.<key>=<value>')."
            )
        hint = closest(leaf, keys)
        where = f"'{parent}'" if parent else "the top level"
        owners = _options_with_key(parent, leaf)
        return (
            f"unknown config key '{path}'." + (f" Did you mean '{(parent + '.') if parent else ''}{hint}'?" if hint else "")
            + (f" It is a key of {' or '.join(f'{parent}={o}' for o in owners)}: choose that option."
               if owners else "")
            + (f" Keys under {where}: {', '.join(sorted(keys))}." if keys else "")
            + f" (Add a genuinely new key with '+{path}=...'.)"
        )
    return text + (f" ({cause})" if cause else "")


def _registered_without_config(group: str, option: str) -> str | None:
    """For ``group=option`` with no ``group/option.yaml``: when ``option`` is a registered part of
    kind ``group``, what is wrong with it (its import error, or the missing config file)."""
    if group not in PART_KINDS or option not in REGISTRIES[group]:
        return None
    entry = REGISTRIES[group].entries[option]
    try:
        REGISTRIES[group].get(option)
    except RegistryError as exc:
        return str(exc)
    return (
        f"{group} '{option}' is registered by '{entry.dist}' ({entry.target}) but no config file "
        f"{group}/{option}.yaml is on the search path: the plug-in's config folder (entry-point group "
        f"'creditlab.conf') should ship one, or put 'name: {option}' in <folder>/{group}/{option}.yaml "
        f"and add hydra.searchpath=[file://<folder>]."
    )


def _options_with_key(group: str, key: str) -> list[str]:
    """The options of config group ``group`` (``conf/<group>/*.yaml``) that set ``key`` (e.g.
    ``rollout.split`` belongs to ``rollout=resets``)."""
    folder = CONF_DIR / group
    if not group or "." in group or not folder.is_dir():
        return []
    return [f.stem for f in sorted(folder.glob("*.yaml")) if key in (OmegaConf.load(f) or {})]


def _unparsable(overrides: list[str]) -> str:
    """Name the override Hydra's grammar rejects and how to quote its value."""
    parser = OverridesParser.create()
    for text in overrides:
        try:
            parser.parse_overrides([text])
        except OverrideParseException as exc:
            reason = str(exc).splitlines()[0]
            key, _, value = text.partition("=")
            return (f"cannot read the override {text!r} ({reason}); a value holding '=', ',', spaces, quotes or "
                    f"brackets must be quoted: {key}='{value}' (in a shell: \"{key}='{value}'\")")
    return "cannot read the overrides " + " ".join(overrides)


def check(overrides: list[str], machine: bool = True) -> Any:
    """Compose and validate; exit with a clear message on any mistake (``machine``: also what this
    machine lacks, e.g. GPUs). Returns the config."""
    first = None
    try:
        variants = _sweep_variants(overrides)
    except OverrideParseException:
        exit_with(_unparsable(overrides))
    for variant in variants:
        try:
            cfg = compose(variant)
        except (HydraException, OmegaConfBaseException, ValueError) as exc:
            exit_with(explain(exc, variant))
        # A launcher other than Hydra's basic one runs the jobs elsewhere (e.g. SLURM GPU nodes).
        here = not any(o.lstrip("+~").startswith("hydra/launcher=") and not o.endswith("=basic") for o in variant)
        try:
            checked = validate(cfg)
            if here and machine and "launch" in checked:
                check_machine(cfg, checked["launch"])
        except (ConfigError, RegistryError) as exc:
            exit_with(str(exc))
        first = first if first is not None else cfg
    return first
