"""The errors creditlab reports to its users; a leaf module (it imports nothing of creditlab).

Every error meant for the user says what was wrong and what would be right. ``creditlab train``
prints an :class:`InputError` or a :class:`RegistryError` as one line (no traceback) and exits
with status 2.
"""

from __future__ import annotations

import difflib


class InputError(ValueError):
    """Bad user input (config, data, prompts). Reported as one clear message, no traceback."""


class ConfigError(InputError):
    """A config key or value that does not fit a part's ``Config`` (or another section)."""


class RegistryError(LookupError):
    """An unknown, clashing or broken plug-in. The message says what would be right."""


def closest(name: str, options: list[str]) -> str | None:
    """The closest option to ``name`` by edit similarity (for "did you mean"), or None."""
    match = difflib.get_close_matches(name, options, n=1, cutoff=0.5)
    return match[0] if match else None
