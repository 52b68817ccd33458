"""Power of ``creditlab compare``'s seed-level test for a declared contrast: the exact two-sided
sign-flip test of the mean paired difference at level ``alpha``, on seed differences drawn from
a normal with the given mean and standard deviation (how ``sweeps/sham_multi.yaml`` sized its
seeds). Each simulated experiment's p is the test's own: the share of the ``2^n`` sign patterns
whose mean is at least as far from 0 as the observed one (``tests/unit/test_sign_flip_power.py``
checks it against :func:`creditlab.analysis.significance.paired_test`).

    python sweeps/sign_flip_power.py --effect 0.0068 --sd 0.0085 0.0106 --seeds 12 16
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np


def sign_patterns(n: int) -> np.ndarray:
    """Every ``(2^n, n)`` pattern of signs."""
    return np.array(list(itertools.product((-1.0, 1.0), repeat=n)))


def sign_flip_p(d: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """Two-sided exact p of each row of ``d`` ``(experiments, n)``, rounded as ``paired_test`` rounds."""
    d = np.round(d, 12)
    observed = np.abs(d.mean(axis=1))                       # (experiments,)
    flipped = np.abs(d @ patterns.T) / d.shape[1]           # (experiments, 2^n)
    return (flipped >= observed[:, None] - 1e-12).mean(axis=1)


def power(effect: float, sd: float, seeds: int, alpha: float = 0.05, experiments: int = 2000, seed: int = 0) -> float:
    """Share of simulated experiments whose p is at most ``alpha``."""
    rng = np.random.default_rng(seed)
    patterns = sign_patterns(seeds)
    hits = 0
    for start in range(0, experiments, 200):
        d = rng.normal(effect, sd, size=(min(200, experiments - start), seeds))
        hits += int((sign_flip_p(d, patterns) <= alpha).sum())
    return hits / experiments


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--effect", type=float, nargs="+", required=True, help="true mean paired differences")
    ap.add_argument("--sd", type=float, nargs="+", required=True, help="standard deviations of a seed's difference")
    ap.add_argument("--seeds", type=int, nargs="+", default=[8, 12, 16])
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--experiments", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"exact two-sided sign-flip test at alpha {args.alpha}, {args.experiments} simulated experiments each")
    print(f"{'effect':>8} {'sd':>8} " + " ".join(f"{f'{n} seeds':>9}" for n in args.seeds))
    for effect in args.effect:
        for sd in args.sd:
            cells = " ".join(f"{power(effect, sd, n, args.alpha, args.experiments):>9.3f}" for n in args.seeds)
            print(f"{effect:>8.4f} {sd:>8.4f} {cells}")


if __name__ == "__main__":
    main()
