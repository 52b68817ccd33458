"""Build the shipped word-problem data from its sources (run once; the output is committed).

    python -m creditlab_wordproblems.build --gsm8k DIR --svamp FILE [--out DIR] [--max-ops 3]

``DIR`` holds GSM8K's ``train.jsonl`` and ``test.jsonl`` (``github:openai/grade-school-math``,
``grade_school_math/data``); ``FILE`` is SVAMP's ``SVAMP.json`` (``github:arkilpatel/SVAMP``).
What it keeps, and why (``data/README.md`` has the counts of the last build):

- GSM8K problems with 1 to ``max_ops`` calculator annotations (the number of gold steps), whose
  annotations all give their values and whose worked solution the step oracle reads as right from
  start to end (a solution it cannot read is no place to judge a model's steps);
- SVAMP problems whose equation gives their stored answer (a few do not);
- no training problem that is a duplicate or a near-duplicate of an evaluation problem, nor of
  an earlier training problem: texts are compared lower-cased with every number masked, exactly
  and by the share of word 8-grams they hold in common (``NEAR`` or more of the shorter one's).

Each row: ``id``, ``question``, ``answer`` (GSM8K's format: the worked solution without its
annotations, then ``#### <answer>``; SVAMP's: ``#### <answer>``), ``steps`` (the gold steps:
``[expression, value]``, values exact as ``a/b`` or decimals), ``ops`` (the gold steps' count
before those the solution text adds) and ``source`` (file and line).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

from creditlab_wordproblems.arithmetic import fmt, to_number
from creditlab_wordproblems.steps import (
    equation_steps, gsm8k_steps, judge, solution_steps, strip_annotations,
)

#: Share of the shorter text's word 8-grams (numbers masked) at which two problems are near-duplicates.
NEAR = 0.3
NGRAM = 8
DATA = Path(__file__).parent / "data"


def normalise(text: str) -> str:
    """Lower case, every number as ``#``, punctuation as space, single spaces."""
    text = re.sub(r"\d[\d,]*(?:\.\d+)?|\.\d+", "#", text.lower())
    return " ".join(re.sub(r"[^a-z#]+", " ", text).split())


def ngrams(text: str) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    if len(words) < NGRAM:
        return {tuple(words)}
    return {tuple(words[i: i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


class NearIndex:
    """Word 8-gram sets of a collection of texts, queried for the largest overlap with a text."""

    def __init__(self) -> None:
        self.sets: list[set[tuple[str, ...]]] = []
        self.postings: dict[tuple[str, ...], list[int]] = defaultdict(list)

    def add(self, text: str) -> None:
        grams = ngrams(text)
        for g in grams:
            self.postings[g].append(len(self.sets))
        self.sets.append(grams)

    def overlap(self, text: str) -> float:
        """Largest share, over the indexed texts, of the shorter one's 8-grams held in common."""
        grams = ngrams(text)
        shared: dict[int, int] = defaultdict(int)
        for g in grams:
            for i in self.postings.get(g, ()):
                shared[i] += 1
        return max((n / min(len(grams), len(self.sets[i])) for i, n in shared.items()), default=0.0)


def gsm8k_rows(path: Path, split: str, max_ops: int, counts: dict[str, int]) -> list[dict]:
    """The kept problems of one GSM8K file (``counts`` gets the reasons for the others)."""
    rows = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        row = json.loads(line)
        solution, _, tail = row["answer"].rpartition("####")
        answer = to_number(tail.strip())
        try:
            annotated = gsm8k_steps(row["answer"])
            steps = solution_steps(row["answer"])
        except ValueError:
            counts["an annotation does not give its value"] += 1
            continue
        if not 1 <= len(annotated) <= max_ops:
            counts[f"not 1-{max_ops} annotated steps"] += 1
            continue
        if answer is None:
            counts["answer not a number"] += 1
            continue
        text = strip_annotations(solution).strip()
        thoughts = [t for t in f"{text}\n#### {tail.strip()}".splitlines() if t.strip()]
        if any(v.wrong for v in judge(row["question"], steps, answer, thoughts)):
            counts["worked solution not read as right by the oracle"] += 1
            continue
        rows.append({
            "id": f"gsm8k-{split}-{line_no}", "question": row["question"].strip(),
            "answer": f"{text}\n#### {fmt(answer)}",
            "steps": [[s.expr, fmt(s.value)] for s in steps], "ops": len(annotated),
            "source": f"gsm8k/{split}.jsonl:{line_no}",
        })
    return rows


def svamp_rows(path: Path, counts: dict[str, int]) -> list[dict]:
    """SVAMP's problems whose equation gives their answer (body and question joined by a space,
    with a full stop after a body that has none)."""
    rows = []
    for index, item in enumerate(json.loads(path.read_text())):
        body = item["Body"].strip()
        question = f"{body}{'' if body.endswith(('.', '?', '!')) else '.'} {item['Question'].strip()}"
        answer = Fraction(str(item["Answer"]))
        try:
            steps = equation_steps(item["Equation"])
        except ValueError:
            counts["equation not arithmetic"] += 1
            continue
        if not steps or steps[-1].value != answer:
            counts["equation does not give the stored answer"] += 1
            continue
        rows.append({
            "id": f"svamp-{item['ID']}", "question": question, "answer": f"#### {fmt(answer)}",
            "steps": [[s.expr, fmt(s.value)] for s in steps], "ops": len(steps),
            "source": f"SVAMP.json[{index}]",
        })
    return rows


def deduplicate(train: list[dict], held_out: Iterable[list[dict]], counts: dict[str, int]) -> list[dict]:
    """Training rows without exact or near duplicates of held-out rows or of earlier training rows."""
    index, exact = NearIndex(), set()
    for rows in held_out:
        for row in rows:
            index.add(row["question"])
            exact.add(normalise(row["question"]))
    kept, seen, own = [], set(), NearIndex()
    for row in train:
        norm = normalise(row["question"])
        if norm in exact:
            counts["train: exact duplicate of a held-out problem"] += 1
        elif index.overlap(row["question"]) >= NEAR:
            counts["train: near-duplicate of a held-out problem"] += 1
        elif norm in seen:
            counts["train: exact duplicate of another training problem"] += 1
        elif own.overlap(row["question"]) >= NEAR:
            counts["train: near-duplicate of another training problem"] += 1
        else:
            kept.append(row)
            seen.add(norm)
            own.add(row["question"])
    return kept


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gsm8k", type=Path, required=True, help="folder with GSM8K's train.jsonl and test.jsonl")
    p.add_argument("--svamp", type=Path, required=True, help="SVAMP's SVAMP.json")
    p.add_argument("--out", type=Path, default=DATA, help=f"output folder (default {DATA})")
    p.add_argument("--max-ops", type=int, default=3, help="most gold steps of a GSM8K problem (default 3)")
    args = p.parse_args(argv)
    counts: dict[str, dict[str, int]] = {k: defaultdict(int) for k in ("train", "gsm8k_test", "svamp")}
    train = gsm8k_rows(args.gsm8k / "train.jsonl", "train", args.max_ops, counts["train"])
    test = gsm8k_rows(args.gsm8k / "test.jsonl", "test", args.max_ops, counts["gsm8k_test"])
    svamp = svamp_rows(args.svamp, counts["svamp"])
    before = len(train)
    train = deduplicate(train, (test, svamp), counts["train"])
    tests = _indexed(test)
    between = sum(1 for r in svamp if tests.overlap(r["question"]) >= NEAR)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"sources": {}, "rows": {}, "removed": {k: dict(v) for k, v in counts.items()},
              "near_threshold": NEAR, "ngram": NGRAM, "train_before_deduplication": before,
              "svamp_near_gsm8k_test": between}
    for name, source in (("gsm8k/train.jsonl", args.gsm8k / "train.jsonl"),
                         ("gsm8k/test.jsonl", args.gsm8k / "test.jsonl"), ("SVAMP.json", args.svamp)):
        report["sources"][name] = hashlib.sha256(source.read_bytes()).hexdigest()
    for name, rows in (("train", train), ("gsm8k_test", test), ("svamp", svamp)):
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        ops = defaultdict(int)
        for r in rows:
            ops[r["ops"]] += 1
        report["rows"][name] = {"count": len(rows), "by_gold_steps": dict(sorted(ops.items()))}
    (args.out / "build.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


def _indexed(rows: list[dict]) -> NearIndex:
    index = NearIndex()
    for row in rows:
        index.add(row["question"])
    return index


if __name__ == "__main__":
    main()
