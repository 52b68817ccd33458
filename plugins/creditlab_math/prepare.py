"""Prepare math datasets as local JSONL files the ``math`` / ``gsm8k`` / ``numina_olympiads``
tasks read with ``task.path`` (docs/data.md).

Usage::

    python -m creditlab_math.prepare numina-olympiads --out data/numina_olympiads
    python -m creditlab_math.prepare numina-olympiads --from ~/NuminaMath-CoT --out data/numina_olympiads
    python -m creditlab_math.prepare math500 --out data/math500
    python -m creditlab_math.prepare gsm8k --out data/gsm8k

Each reads the hub dataset (network needed) or, with ``--from``, a local copy (a file, or a folder
such as the one ``hf download <dataset> --repo-type dataset --local-dir <folder>`` writes), and
writes ``train.jsonl``, ``test.jsonl`` and ``prepare.json`` (source, counts, drop reasons, seed,
file checksums, the verifier self-check) into ``--out``. Errors end with one line naming the fix.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from creditlab import Completion, InputError, Problem

from creditlab_math.numina import HUB_DATASET, PrepareError, seeded_split, select
from creditlab_math.verifiers import MathVerifyVerifier

MATH500 = "HuggingFaceH4/MATH-500"
GSM8K = "openai/gsm8k"
_PATTERNS = ("{split}-*.parquet", "{split}.parquet", "{split}.jsonl", "{split}-*.jsonl", "{split}.json",
             "{split}.jsonl.gz")


def local_files(path: str, split: str, config: str | None = None) -> list[str]:
    """The files of ``split`` under ``path``: ``path`` itself when it is a file, else the first
    pattern of ``<split>-*.parquet``, ``<split>.parquet``, ``<split>.jsonl``, ... that matches
    anywhere below it (shards sorted, i.e. in dataset order), looking inside the subfolder
    ``config`` when there is one (a hub download keeps each config in its own folder)."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise PrepareError(f"--from {path}: no such file or folder")
    if config and os.path.isdir(os.path.join(path, config)):
        path = os.path.join(path, config)
    for pattern in _PATTERNS:
        found = sorted(glob.glob(os.path.join(path, "**", pattern.format(split=split)), recursive=True))
        if found:
            return found
    names = sorted(os.path.relpath(p, path) for p in glob.glob(os.path.join(path, "**", "*"), recursive=True))
    shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "(empty)"
    raise PrepareError(
        f"--from {path}: no '{split}' data file in it (looked for "
        f"{', '.join(p.format(split=split) for p in _PATTERNS)}; found: {shown}). "
        f"Pass the data file itself with --from."
    )


def _download_hint(hub: str) -> str:
    return (
        f"Without network: on a machine that has it run `hf download {hub} --repo-type dataset "
        f"--local-dir <folder>`, copy the folder here and add --from <folder>."
    )


def iter_rows(
    hub: str, split: str, local: str | None = None, config: str | None = None,
    revision: str | None = None,
) -> tuple[Iterator[dict[str, Any]], str]:
    """``(rows, where)``: the rows of ``split`` streamed in dataset order, from the local copy
    ``local`` or from the hub dataset ``hub``.

    Raises:
        PrepareError: The data cannot be read (no network, no such file); raised while
            iterating for streamed hub data.
    """
    from datasets import load_dataset

    from creditlab_math.tasks import _builder

    if local is not None:
        files = local_files(local, split, config)
        builders = {_builder(f) for f in files}
        if len(builders) > 1:
            listed = ", ".join(files)
            raise PrepareError(f"--from {local}: mixed file types for '{split}': {listed}")
        where = files[0] if len(files) == 1 else f"{local} ({len(files)} '{split}' files)"
        builder = builders.pop()

        def source() -> Any:
            return load_dataset(builder, data_files=files, split="train", streaming=True)
    else:
        where = f"{hub}[{split}]"

        def source() -> Any:
            return load_dataset(hub, config, split=split, streaming=True, revision=revision)

    def rows() -> Iterator[dict[str, Any]]:
        try:
            yield from source()
        except InputError:
            raise
        except Exception as exc:  # datasets raises many types (ConnectionError, HfHubHTTPError ...)
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            hint = _download_hint(hub) if local is None else "Check the file (JSONL/JSON/parquet)."
            origin = "" if local is not None else " from the Hugging Face hub"
            raise PrepareError(f"cannot read {where}{origin}: {type(exc).__name__}: {first}. {hint}") from exc

    return rows(), where


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> str:
    """Write ``rows`` as JSON Lines (atomically); returns the file's sha256."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def self_check(rows: Sequence[dict[str, Any]], answer_key: str = "answer") -> dict[str, Any]:
    """Score each row's own gold answer, written as ``\\boxed{<answer>}``, with the
    ``math_verify`` verifier: a gold answer it does not accept can never be rewarded.

    Returns:
        ``{"checked", "accepted", "rejected": [{"id", "answer", "outcome"}, ...]}``.
    """
    problems = [Problem(id=str(r["id"]), prompt="", answer=str(r[answer_key])) for r in rows]
    completions = [Completion((), (), (), "eos", f"\\boxed{{{p.answer}}}") for p in problems]
    verifier = MathVerifyVerifier()
    try:
        rewards = verifier.score(problems, completions) if problems else None
    finally:
        verifier.close()
    rejected = [] if rewards is None else [
        {"id": p.id, "answer": p.answer, "outcome": info.get("outcome")}
        for p, value, info in zip(problems, rewards.values, rewards.info) if value <= 0.5
    ]
    return {"checked": len(problems), "accepted": len(problems) - len(rejected), "rejected": rejected}


def _finish(out: Path, splits: dict[str, list[dict[str, Any]]], manifest: dict[str, Any], check: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest["files"] = {}
    for name, rows in splits.items():
        manifest["files"][f"{name}.jsonl"] = {"rows": len(rows), "sha256": write_jsonl(out / f"{name}.jsonl", rows)}
    if check:
        manifest["self_check"] = self_check([r for rows in splits.values() for r in rows])
    (out / "prepare.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    written = ", ".join(f"{name} ({info['rows']} rows)" for name, info in manifest["files"].items())
    print(f"wrote {written} and prepare.json to {out}")
    if check:
        sc = manifest["self_check"]
        print(f"math_verify accepts {sc['accepted']}/{sc['checked']} gold answers written as \\boxed{{...}}"
              + (f"; rejected ids in {out / 'prepare.json'}" if sc["rejected"] else ""))


def _origin(args: argparse.Namespace, hub: str) -> dict[str, Any]:
    if args.source:
        return {"local": os.path.abspath(args.source), "dataset": hub}
    return {"hub": hub, "revision": getattr(args, "revision", None) or "main"}


def prepare_numina(args: argparse.Namespace) -> None:
    """The SRPO paper's NuminaMath olympiad split (:mod:`creditlab_math.numina`)."""
    rows, where = iter_rows(HUB_DATASET, "train", args.source, revision=args.revision)
    kept = select(rows, where)
    train, test = seeded_split(kept.rows, args.n_train, args.n_test, args.seed)
    manifest = {
        "dataset": "numina-olympiads", **_origin(args, HUB_DATASET), "read": where,
        "rows_read": kept.total, "olympiad_rows": kept.matched, "kept": len(kept.rows),
        "dropped": dict(sorted(kept.dropped.items())), "seed": args.seed,
        "n_train": args.n_train, "n_test": args.n_test,
        "selection": "SRPO authors' prepare_datasets.py rules (creditlab_math.numina)",
    }
    _finish(Path(args.out), {"train": train, "test": test}, manifest, args.self_check)


def prepare_math500(args: argparse.Namespace) -> None:
    """MATH-500 (500 test problems) cut into a seeded train/test split, as the SRPO code's
    ``math500`` dataset (400/100, seed 42)."""
    rows, where = iter_rows(MATH500, "test", args.source, revision=args.revision)
    problems = []
    for index, row in enumerate(rows):
        missing = [k for k in ("problem", "answer") if not isinstance(row.get(k), str)]
        if missing:
            raise PrepareError(
                f"{where}, row {index + 1}: no string field {', '.join(missing)} (the row has: "
                f"{', '.join(sorted(row))}). Expected MATH-500 rows (problem, answer, ...)."
            )
        problems.append({"id": str(row.get("unique_id") or f"math500-{index}"), **row})
    train, test = seeded_split(problems, args.n_train, args.n_test, args.seed)
    manifest = {"dataset": "math500", **_origin(args, MATH500), "read": where, "rows_read": len(problems),
                "seed": args.seed, "n_train": args.n_train, "n_test": args.n_test}
    _finish(Path(args.out), {"train": train, "test": test}, manifest, args.self_check)


def prepare_gsm8k(args: argparse.Namespace) -> None:
    """GSM8K's train and test splits as they are (``openai/gsm8k``, config ``main``)."""
    splits, reads = {}, {}
    for split in ("train", "test"):
        rows, where = iter_rows(GSM8K, split, args.source, config="main", revision=args.revision)
        splits[split] = list(rows)
        reads[split] = where
    manifest = {"dataset": "gsm8k", **_origin(args, GSM8K), "read": reads}
    _finish(Path(args.out), splits, manifest, check=False)


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    top = argparse.ArgumentParser(
        prog="python -m creditlab_math.prepare",
        description="Write math datasets as local JSONL files for task.path (docs/data.md).",
    )
    sub = top.add_subparsers(dest="dataset", required=True, metavar="{numina-olympiads,math500,gsm8k}")
    specs = {
        "numina-olympiads": (
            prepare_numina, "SRPO paper: NuminaMath-CoT olympiads with verifiable boxed answers, 400/100"
        ),
        "math500": (prepare_math500, "MATH-500 cut into a seeded 400/100 train/test split"),
        "gsm8k": (prepare_gsm8k, "GSM8K train/test as JSONL"),
    }
    for name, (func, text) in specs.items():
        p = sub.add_parser(name, help=text, description=text)
        p.set_defaults(func=func)
        p.add_argument("--out", required=True, help="output folder (train.jsonl, test.jsonl, prepare.json)")
        p.add_argument("--from", dest="source", default=None, metavar="PATH",
                       help="a local copy (file or folder) instead of the hub")
        p.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
        if name != "gsm8k":
            p.add_argument("--n-train", type=int, default=400)
            p.add_argument("--n-test", type=int, default=100)
            p.add_argument("--seed", type=int, default=42)
            p.add_argument("--no-self-check", dest="self_check", action="store_false",
                           help="skip scoring each gold answer with the math_verify verifier")
    return top


def main(argv: list[str] | None = None) -> None:
    """Run the command line; errors end with one line on stderr and exit status 2."""
    args = parser().parse_args(argv)
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    try:
        import datasets

        datasets.logging.set_verbosity_error()
        args.func(args)
    except (InputError, FileNotFoundError) as exc:
        print(f"{parser().prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
