"""Warm starts shipped with creditlab: the same bytes on every machine (issue 38).

A warm start trained from a recipe differs by CPU: long fp32 training amplifies rounding, so an
AMD and an Intel build of the same recipe start RL from different models and give different
results (docs/reproducing.md). Every warm start a documented result or the demo depends on is
therefore shipped in ``warm_starts/<cache key>/`` beside this module (an ordinary HF checkpoint
folder, named as the recipe's cache folder would be) and listed in ``warm_starts/manifest.json``
with the sha256 of every file and the machine that built it. :func:`load` returns a shipped
folder after checking every file's hash, and the recipe (``arith_tiny``) uses it whenever its
resolved arguments name a shipped key, unless ``shipped: false`` asks for a rebuild.

    python -m creditlab_arith.shipped list                        # what ships, and its hashes
    python -m creditlab_arith.shipped add <checkpoint dir> NAME   # a maintainer adds a build
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

import torch
from creditlab import InputError

#: The shipped checkpoints and their manifest.
ROOT = Path(__file__).parent / "warm_starts"
MANIFEST = ROOT / "manifest.json"
#: The files of a checkpoint folder that ship (what ``from_pretrained`` and the recipe read).
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "creditlab_recipe.json")


def sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def manifest(root: Path | None = None) -> dict[str, Any]:
    """``{cache key: entry}`` of the warm starts shipped in ``root`` (default: this plug-in's;
    empty when none ship)."""
    path = MANIFEST if root is None else root / MANIFEST.name
    return json.loads(path.read_text()) if path.is_file() else {}


def load(key: str, announce: bool = True, root: Path | None = None, weights: str = "model.safetensors") -> Path | None:
    """The shipped folder for recipe cache key ``key`` (e.g. ``arith_tiny-723602926adc``), every
    file checked against its sha256, or ``None`` when no such warm start ships.

    Args:
        key: The recipe's cache key.
        announce: Print the verified weights' hash.
        root: The folder of shipped warm starts and their manifest (default: this plug-in's;
            another plug-in passes its own).
        weights: The file whose hash is announced.

    Raises:
        InputError: A shipped file is missing or its bytes differ from the manifest's hash.
    """
    entry = manifest(root).get(key)
    if entry is None:
        return None
    folder = (ROOT if root is None else root) / key
    for name, want in entry["files"].items():
        path = folder / name
        got = sha256(path) if path.is_file() else "missing"
        if got != want:
            raise InputError(
                f"shipped warm start {key} ({entry['name']}): {path} has sha256 {got}, the manifest "
                f"says {want}. Restore it (git checkout -- {path} or reinstall creditlab), or rebuild it "
                "from its recipe with '+model.recipe_args={shipped: false}' (a rebuild differs by CPU)."
            )
    if announce:
        print(f"[{key.split('-')[0]}] shipped warm start '{entry['name']}' ({key}), built on {entry['built_on']}: "
              f"{weights} sha256 {entry['files'][weights]} verified")
    return folder


def add(checkpoint: Path, name: str, root: Path | None = None, files: tuple[str, ...] = FILES,
        key: str | None = None) -> str:
    """Copy a finished recipe checkpoint (``files`` of it) into the shipped set in ``root`` and
    record their hashes; returns its key (default: the checkpoint folder's name)."""
    if not (checkpoint / "creditlab_recipe.json").is_file():
        raise SystemExit(f"{checkpoint} is not a finished recipe checkpoint (no creditlab_recipe.json)")
    key = checkpoint.name if key is None else key
    root = ROOT if root is None else root
    target = root / key
    target.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for f in files:
        if (checkpoint / f).is_file():
            shutil.copyfile(checkpoint / f, target / f)
            hashes[f] = sha256(target / f)
    entries = manifest(root)
    entries[key] = {"name": name, "files": hashes, "torch": torch.__version__,
                    "built_on": f"{_cpu_name()}, {platform.machine()}, torch kernels "
                                f"{torch.backends.cpu.get_cpu_capability()}"}
    (root / MANIFEST.name).write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n")
    return key


def _cpu_name() -> str:
    """The CPU's model name with its family and model numbers (``/proc/cpuinfo``), e.g. ``AMD
    EPYC (family 25, model 17)``: a virtual machine's name alone may not tell Zen 4 from Zen 5."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines()
                    if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        return f"{info['model name']} (family {info['cpu family']}, model {info['model']})"
    except (OSError, KeyError, ValueError):
        return platform.platform()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m creditlab_arith.shipped", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the shipped warm starts, verified")
    a = sub.add_parser("add", help="ship a finished checkpoint folder under a name")
    a.add_argument("checkpoint", type=Path)
    a.add_argument("name")
    args = p.parse_args(argv)
    if args.command == "add":
        print(f"shipped {add(args.checkpoint, args.name)}")
        return
    for key, entry in sorted(manifest().items(), key=lambda kv: kv[1]["name"]):
        load(key, announce=False)
        size = sum((ROOT / key / f).stat().st_size for f in entry["files"]) / 2**20
        print(f"{entry['name']:16s} {key}  {size:.1f} MiB  model.safetensors {entry['files']['model.safetensors']}")


if __name__ == "__main__":
    main()
