"""The errors creditlab reports to its users; a leaf module (it imports nothing of creditlab).

Every error meant for the user says what was wrong and what would be right. ``creditlab train``
prints an :class:`InputError` or a :class:`RegistryError` as one line (no traceback) and exits
with status 2 (:func:`exit_with`; the subcommands' :class:`ArgumentParser` ends the same way).
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn


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


def exit_with(message: str) -> NoReturn:
    """End a command with ``creditlab: error: <message>`` on stderr and exit status 2."""
    print(f"creditlab: error: {message}", file=sys.stderr)
    sys.exit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but errors end like the rest of the CLI: ``creditlab: error: ...``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        exit_with(message)
