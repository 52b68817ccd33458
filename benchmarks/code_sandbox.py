"""Cost of the code sandbox's layers, side by side in one process (medians and ratios).

Runs one trivial solution with 5 tests through the sandbox with every layer this machine allows,
then without the cgroups, without the seccomp filter and without both, interleaved round by
round so that load on the machine hits every variant alike::

    .venv/bin/python benchmarks/code_sandbox.py --rounds 40
"""

from __future__ import annotations

import argparse
import statistics
import time

from creditlab_code.sandbox import Limits, Sandbox

CODE = "def f(a, b):\n    return a + b\n"
TESTS = [f"assert f({i}, 1) == {i + 1}" for i in range(5)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    box = Sandbox(Limits(timeout_s=10))
    plan = box.plan
    variants = {"all layers": plan, "no cgroups": {**plan, "cgroups": False},
                "no seccomp": {**plan, "seccomp": False},
                "neither": {**plan, "cgroups": False, "seccomp": False}}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, variant in variants.items():
            start = time.perf_counter()
            result = box._run(variant, CODE, TESTS, "f", box.limits)
            times[name].append(time.perf_counter() - start)
            assert all(t["outcome"] == "passed" for t in result.tests), result
    print(f"isolation: {plan['name']}, layers: {', '.join(plan['layers'])}")
    base = statistics.median(times["all layers"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:12s} median {1000 * median:6.1f} ms  min {1000 * min(values):6.1f} ms  "
              f"ratio to all layers {median / base:.2f}")


if __name__ == "__main__":
    main()
