"""Registries of parts, discovered through Python entry points.

Every built-in part is declared as an entry point in the root ``pyproject.toml`` exactly as a
third-party plug-in would declare it (group ``creditlab.<kind>``). Discovery reads entry-point
metadata only; a plug-in module is imported when its part is selected.

Name clashes: a built-in (distribution ``creditlab``) wins with a warning; two third-party
distributions registering one name is an error naming both. ``CREDITLAB_DISABLE_PLUGIN_AUTOLOAD=1``
hides every third-party entry point.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Generic, TypeVar

from creditlab.errors import ConfigError, RegistryError, closest
from creditlab.interfaces import INTERFACES, Part

BUILTIN_DIST = "creditlab"
AUTOLOAD_ENV = "CREDITLAB_DISABLE_PLUGIN_AUTOLOAD"
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """One registered name: where it comes from and how to load it."""

    name: str
    target: str  # "module:attr"
    dist: str
    version: str
    loader: Callable[[], Any] | None = None  # set for @register'ed objects

    def load(self) -> Any:
        if self.loader is not None:
            return self.loader()
        module_name, _, attr = self.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception as exc:  # a broken plug-in must not look like a missing one
            raise RegistryError(
                f"plug-in '{self.name}' from distribution '{self.dist}' ({self.target}) failed "
                f"to import: {type(exc).__name__}: {exc}"
            ) from exc
        return obj


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "unknown", "?"
    return dist.metadata["Name"], dist.version


class Registry(Generic[T]):
    """Names of one kind (entry-point group ``group``) mapped to lazily imported objects."""

    def __init__(self, kind: str, group: str, base: type | None = None) -> None:
        self.kind = kind
        self.group = group
        self.base = base
        self._entries: dict[str, Entry] | None = None
        self._extra: dict[str, Entry] = {}

    # -- discovery -------------------------------------------------------------------------
    def _discover(self) -> dict[str, Entry]:
        hide_third_party = os.environ.get(AUTOLOAD_ENV, "").strip() not in ("", "0", "false")
        found: dict[str, Entry] = {}
        seen_eps: set[tuple[str, str, str]] = set()
        for ep in metadata.entry_points(group=self.group):
            dist, version = _dist_of(ep)
            key = (ep.name, ep.value, dist)
            if key in seen_eps:  # the same distribution visible twice on sys.path
                continue
            seen_eps.add(key)
            if hide_third_party and dist != BUILTIN_DIST:
                continue
            entry = Entry(ep.name, ep.value, dist, version)
            old = found.get(ep.name)
            if old is None:
                found[ep.name] = entry
            elif BUILTIN_DIST in (old.dist, dist):
                builtin, other = (old, entry) if old.dist == BUILTIN_DIST else (entry, old)
                warnings.warn(
                    f"{self.kind} '{ep.name}' from '{other.dist}' clashes with the built-in one; "
                    f"the built-in ({builtin.target}) is used. Rename the plug-in's entry point.",
                    stacklevel=3,
                )
                found[ep.name] = builtin
            elif old.dist != dist:
                raise RegistryError(
                    f"{self.kind} '{ep.name}' is registered by two distributions: "
                    f"'{old.dist}' ({old.target}) and '{dist}' ({entry.target}). "
                    f"Uninstall one of them or rename its entry point."
                )
        return found

    @property
    def entries(self) -> dict[str, Entry]:
        if self._entries is None:
            self._entries = self._discover()
        return {**self._entries, **self._extra}

    def names(self) -> list[str]:
        return sorted(self.entries)

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries[n] for n in self.names())

    # -- registration for tests and notebooks ----------------------------------------------
    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name`` in this process (tests, notebooks)."""

        def deco(obj: T) -> T:
            target = f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', name)}"
            self._extra[name] = Entry(name, target, "<runtime>", "", loader=lambda: obj)
            return obj

        return deco

    def unregister(self, name: str) -> None:
        self._extra.pop(name, None)

    def refresh(self) -> None:
        """Forget discovered entry points (after installing a plug-in in this process)."""
        self._entries = None

    # -- lookup -------------------------------------------------------------------------------
    def get(self, name: str) -> T:
        entries = self.entries
        if name not in entries:
            options = sorted(entries)
            hint = closest(str(name), options)
            did_you_mean = f" Did you mean '{hint}'?" if hint else ""
            raise RegistryError(
                f"unknown {self.kind} '{name}'.{did_you_mean} Available {self.kind}s: "
                f"{', '.join(options) or '(none)'}. Third-party plug-ins register under the "
                f"entry-point group '{self.group}'."
            )
        obj = entries[name].load()
        if self.base is not None and not (isinstance(obj, type) and issubclass(obj, self.base)):
            raise RegistryError(
                f"{self.kind} '{name}' ({entries[name].target}, from '{entries[name].dist}') is "
                f"not a subclass of creditlab.interfaces.{self.base.__name__}."
            )
        return obj

    def problem(self, name: str) -> str | None:
        """Why the registered ``name`` cannot be used (its import error, or not a subclass of
        the kind's interface), or None when it loads. Imports the plug-in."""
        try:
            self.get(name)
        except RegistryError as exc:
            return _import_problem(exc)
        return None


def _import_problem(exc: RegistryError) -> str:
    """The cause of a failed load in a few words (the import error, or the whole message)."""
    cause = exc.__cause__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def build_config(schema: type, options: Mapping[str, Any], where: str) -> Any:
    """Instantiate the dataclass ``schema`` from ``options``, rejecting unknown keys and wrong
    types with a message naming the key (``where.key``), the closest valid key and all of them."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in options:
        if key not in fields:
            hint = closest(key, list(fields))
            did_you_mean = f" Did you mean '{where}.{hint}'?" if hint else ""
            raise ConfigError(
                f"unknown key '{where}.{key}' ({schema.__qualname__}).{did_you_mean} "
                f"Valid keys: {', '.join(sorted(fields)) or '(none)'}."
            )
    values = {k: _coerce(v, fields[k], f"{where}.{k}") for k, v in options.items()}
    try:
        return schema(**values)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid '{where}': {exc}") from exc


_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def _coerce(value: Any, field: dataclasses.Field, where: str) -> Any:
    """Check scalar types declared as plain ``int``/``float``/``str``/``bool`` (optionally | None)."""
    declared = field.type if isinstance(field.type, (str, type)) else str(field.type)
    declared = declared.__name__ if isinstance(declared, type) else declared
    parts = [p.strip() for p in str(declared).split("|")]
    optional = "None" in parts
    scalar = [p for p in parts if p in _SCALARS]
    if value is None:
        if optional or not scalar:
            return None
        raise ConfigError(f"'{where}' must be {declared}, got null.")
    if len(scalar) != 1 or len(parts) - optional != 1:
        return value  # not a plain scalar field: leave it to the part
    want = _SCALARS[scalar[0]]
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, want) and not (want is int and isinstance(value, bool)):
        return value
    raise ConfigError(
        f"'{where}' must be {declared}, got {type(value).__name__} {value!r}."
    )


def build_part(kind: str, options: Mapping[str, Any], **kwargs: Any) -> Part:
    """Build the part named ``options['name']`` of ``kind`` with the remaining options."""
    options = dict(options)
    name = options.pop("name", None)
    if not name:
        raise ConfigError(f"'{kind}' needs a 'name' (one of: {', '.join(REGISTRIES[kind].names())}).")
    cls = REGISTRIES[kind].get(name)
    config = build_config(cls.Config, options, kind)
    return cls(config, **kwargs)


#: One registry per kind of part, plus model recipes (callables returning a local model path) and
#: their shapes (callables ``recipe_args -> (transformers config, tokenizer or None)`` that build
#: no weights, registered under the recipe's name; read by :mod:`creditlab.run.memory`), and what
#: an advantage estimator holds while it estimates (callables ``(config, step) -> {component:
#: bytes}`` under the estimator's name; read by :mod:`creditlab.run.memory_phases`).
REGISTRIES: dict[str, Registry[Any]] = {
    kind: Registry(kind, f"creditlab.{kind}", base) for kind, base in INTERFACES.items()
}
REGISTRIES["model_recipe"] = Registry("model_recipe", "creditlab.model_recipe")
REGISTRIES["model_recipe_config"] = Registry("model_recipe_config", "creditlab.model_recipe_config")
REGISTRIES["advantage_memory"] = Registry("advantage_memory", "creditlab.advantage_memory")


def registry(kind: str) -> Registry[Any]:
    if kind not in REGISTRIES:
        raise RegistryError(f"unknown kind '{kind}'; kinds: {', '.join(REGISTRIES)}.")
    return REGISTRIES[kind]


def conf_entries() -> list[tuple[Entry, str]]:
    """Config folders shipped by plug-ins (entry-point group ``creditlab.conf``).

    Returns:
        ``(entry, path)`` per folder: ``entry.target`` is the package named by the entry point,
        ``path`` its directory.

    The package is located without importing plug-in code (the import system's spec; only the
    parents of a dotted name are imported). An entry point that cannot be located is skipped
    with a warning naming its distribution, so it does not break other plug-ins.
    """
    out = []
    hide = os.environ.get(AUTOLOAD_ENV, "").strip() not in ("", "0", "false")
    seen: set[tuple[str, str, str]] = set()
    for ep in metadata.entry_points(group="creditlab.conf"):
        dist, version = _dist_of(ep)
        if (hide and dist != BUILTIN_DIST) or (ep.name, ep.value, dist) in seen:
            continue
        seen.add((ep.name, ep.value, dist))
        package = ep.value.partition(":")[0]
        try:
            spec = importlib.util.find_spec(package)
        except Exception as exc:  # a missing or broken parent package
            spec, problem = None, f"{type(exc).__name__}: {exc}"
        else:
            problem = "no such package" if spec is None else "not a package (a folder of configs)"
        if spec is None or not spec.submodule_search_locations:
            warnings.warn(
                f"config folder '{ep.name}' = '{package}' from distribution '{dist}' is skipped: "
                f"{problem}. Its configs are unavailable; reinstall or fix that plug-in.",
                stacklevel=2,
            )
            continue
        out.append((Entry(ep.name, package, dist, version), list(spec.submodule_search_locations)[0]))
    return out


def conf_dirs() -> list[tuple[str, str]]:
    """Config folders shipped by plug-ins: ``(distribution, path)`` (see :func:`conf_entries`)."""
    return [(entry.dist, path) for entry, path in conf_entries()]
