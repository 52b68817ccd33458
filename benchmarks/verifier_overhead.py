"""What the verifiers' hard time limit costs: a normal batch scored in this process (no limit, as
the ``gsm8k`` and ``arith`` verifiers did before) and through their worker processes (a hard
limit per completion), side by side in one run.

Sides, alternated batch by batch so that both see the same machine noise:

- ``in_process``: the verifier's check function called in a loop in this process;
- ``workers``: ``verifier.score`` (worker process, items pipelined on its socket);
- ``workers_unpipelined``: the same with pipelining off (one round trip per completion), to show
  what pipelining saves.

Usage::

    .venv/bin/python benchmarks/verifier_overhead.py [--batch 64] [--repeats 200] [--workers 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from creditlab import Completion, Problem
from creditlab_arith.answer import check as arith_check
from creditlab_arith.verifier import ArithVerifier
from creditlab_math.verifiers import GSM8KVerifier

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "math" / "gsm8k_small.jsonl"


def completion(text: str) -> Completion:
    return Completion(prompt_ids=(), response_ids=(), logprobs=(), finish_reason="eos", text=text)


def gsm8k_batch(size: int) -> tuple[list[Problem], list[Completion]]:
    """``size`` GSM8K-style completions from the shipped fixture: worked solutions ending in
    ``#### n``, the same with the answer boxed instead, and with a wrong final number."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    problems, completions = [], []
    for i in range(size):
        row = rows[i % len(rows)]
        work, answer = row["answer"].rsplit("####", 1)
        text = [row["answer"], f"{work}So the answer is \\boxed{{{answer.strip()}}}.",
                f"{work}I get 7 in the end."][i % 3]
        problems.append(Problem(id=str(i), prompt=row["question"], answer=answer.strip()))
        completions.append(completion(text))
    return problems, completions


def arith_batch(size: int) -> tuple[list[Problem], list[Completion]]:
    """``size`` arith-style chains, two in three correct."""
    problems, completions = [], []
    for i in range(size):
        answer = 32 + (i % 3 == 2)
        text = f"7+5=12</thought>12*3=36</thought>36-4=\\boxed{{{answer}}}</thought>"
        problems.append(Problem(id=str(i), prompt="Start 7, +5, *3, -4. ", answer="32"))
        completions.append(completion(text))
    return problems, completions


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def unpipelined(verifier, fn):
    def run():
        pool = verifier._checks.pool
        depth, pool.pipeline = pool.pipeline, 0
        try:
            fn()
        finally:
            pool.pipeline = depth
    return run


def measure(name: str, sides: dict, repeats: int) -> dict:
    for fn in sides.values():  # warm-up: starts the workers, fills caches
        fn()
    times = {side: [] for side in sides}
    for _ in range(repeats):
        for side, fn in sides.items():
            times[side].append(timed(fn))
    medians = {side: statistics.median(t) for side, t in times.items()}
    fastest = {side: min(t) for side, t in times.items()}
    print(f"\n{name}, {repeats} batches per side: median (IQR), fastest; ratio to in_process")
    for side, t in times.items():
        q = statistics.quantiles(t, n=4)
        print(f"  {side:20s} {medians[side] * 1e3:7.2f} ms ({q[0] * 1e3:.2f}-{q[2] * 1e3:.2f})"
              f" x{medians[side] / medians['in_process']:4.1f}   fastest {fastest[side] * 1e3:6.2f} ms"
              f" x{fastest[side] / fastest['in_process']:4.1f}")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    gsm = GSM8KVerifier(GSM8KVerifier.Config(workers=args.workers))
    problems, completions = gsm8k_batch(args.batch)
    start = time.perf_counter()
    scored = gsm.score(problems, completions)
    in_process = [gsm.check(p.answer, c.text) for p, c in zip(problems, completions)]
    assert list(scored.info) == in_process, "the two paths disagree"
    print(f"gsm8k worker start-up (once per run, and after a timeout): "
          f"{(time.perf_counter() - start) * 1e3:.0f} ms")
    measure(f"gsm8k, {args.batch} completions", {
        "in_process": lambda: [gsm.check(p.answer, c.text) for p, c in zip(problems, completions)],
        "workers": lambda: gsm.score(problems, completions),
        "workers_unpipelined": unpipelined(gsm, lambda: gsm.score(problems, completions)),
    }, args.repeats)

    arith = ArithVerifier(ArithVerifier.Config(workers=args.workers))
    a_problems, a_completions = arith_batch(args.batch)
    measure(f"arith, {args.batch} completions", {
        "in_process": lambda: [arith_check(p.answer, c.text) for p, c in zip(a_problems, a_completions)],
        "workers": lambda: arith.score(a_problems, a_completions),
        "workers_unpipelined": unpipelined(arith, lambda: arith.score(a_problems, a_completions)),
    }, args.repeats)
    gsm.close()
    arith.close()


if __name__ == "__main__":
    main()
