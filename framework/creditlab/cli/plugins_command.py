"""``creditlab plugins``: every registered part and plug-in config folder, and what keeps a part
from importing."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from creditlab.errors import RegistryError
from creditlab.registry import REGISTRIES, conf_entries


def plugins(argv: list[str]) -> None:
    """Print every registered part (kind, name, distribution, version, module:attr, whether it
    imports: else its import error, repeated on stderr) and every plug-in config folder (``conf``)."""
    table = Table(title="creditlab plug-ins")
    for col in ("kind", "name", "distribution", "version", "target"):
        table.add_column(col, overflow="fold")  # long names wrap, never cut to "…"
    table.add_column("import", overflow="fold", max_width=40)  # an error wraps within its row
    broken = []
    for kind, reg in REGISTRIES.items():
        try:
            entries = list(reg)
        except RegistryError as exc:
            table.add_row(kind, "[red]error[/red]", "", "", str(exc), "")
            broken.append(str(exc))
            continue
        for e in entries:
            problem = reg.problem(e.name)
            table.add_row(kind, e.name, e.dist, e.version, e.target, f"[red]{problem}[/red]" if problem else "ok")
            if problem:
                broken.append(f"{kind} '{e.name}' from '{e.dist}' ({e.target}): {problem}")
    for e, path in conf_entries():  # config folders on Hydra's search path (creditlab.conf)
        table.add_row("conf", e.name, e.dist, e.version, path, "")
    Console(width=200).print(table)
    for line in broken:  # besides the table (which may wrap), one line each on stderr
        print(f"creditlab: plug-in unusable: {line}", file=sys.stderr)
