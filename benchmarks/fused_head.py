"""The LM head with per-token log-probs and entropy, three ways, side by side in one run:

* ``full``: the logits ``(N, V)`` materialised, then ``gather_logprobs`` and ``entropy_from_logits``
  (creditlab's unfused path);
* ``fused``: :func:`creditlab.step.fused_head.fused_logprob_entropy` (torch, token x vocabulary
  tiles, backward recomputing each tile);
* ``trl``: the same call through TRL's ``trl.kernels.ChunkedLogProbFunction`` (``backend="trl"``).

    .venv/bin/python benchmarks/fused_head.py [--tokens 2048] [--threads 2] [--reps 5] [--json OUT]

For each shape (SmolLM2-135M's head, 576 x 49,152; Qwen2.5-0.5B's, 896 x 151,936) and dtype
(float32, bfloat16) it times forward + backward of ``-(logprob * w).sum()`` (the entropy computed and
logged, as the update does) with the variants taking turns rep by rep in this process, and
measures each variant's peak memory in a fresh child process (RSS growth above the inputs, sampled
every 1 ms, after a warm-up step; it includes the gradients of the hidden states and the head,
``(N + V) x H`` in the inputs' dtype, which every variant returns). Prints medians and ratios to ``full``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import torch

SHAPES = {"smollm2-135m": (576, 49_152), "qwen2.5-0.5b": (896, 151_936)}
VARIANTS = ("full", "fused", "trl")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _inputs(tokens: int, hidden: int, vocab: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, hidden, generator=g) * 1.0).to(dtype).requires_grad_(True)
    w = (torch.randn(vocab, hidden, generator=g) * hidden**-0.5).to(dtype).requires_grad_(True)
    y = torch.randint(0, vocab, (tokens,), generator=g)
    weights = torch.randn(tokens, generator=g)
    return h, w, y, weights


def _step(variant: str, h, w, y, weights) -> float:
    """One forward + backward; returns the summed entropy (so nothing is optimised away)."""
    from creditlab.step.fused_head import fused_logprob_entropy
    from creditlab.step.losses import entropy_from_logits, gather_logprobs

    h.grad = w.grad = None
    if variant == "full":
        logits = h @ w.T
        lp = gather_logprobs(logits, y)
        with torch.no_grad():
            ent = entropy_from_logits(logits.detach())
    else:
        lp, ent = fused_logprob_entropy(h, w, y, backend="torch" if variant == "fused" else "trl")
    (-(lp * weights).sum()).backward()
    return float(ent.detach().sum())


def _peak(args, variant: str, shape: str, dtype: str) -> float:
    """Peak RSS growth (GiB) of ``variant`` in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--child", variant, shape, dtype, "--tokens", str(args.tokens),
         "--threads", str(args.threads)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _child(variant: str, shape: str, dtype: str, tokens: int) -> None:
    hidden, vocab = SHAPES[shape]
    inputs = _inputs(tokens, hidden, vocab, getattr(torch, dtype))
    _step(variant, *inputs)  # warm-up (lazy initialisation), then no gradient held
    inputs[0].grad = inputs[1].grad = None
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _step(variant, *inputs)
    done.set()
    t.join()
    print((peak[0] - base) / 2**30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="response tokens N (default 2048)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES))
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    ap.add_argument("--json")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "SHAPE", "DTYPE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        _child(*args.child, args.tokens)
        return
    from creditlab.step.fused_head import trl_available

    variants = [v for v in VARIANTS if v != "trl" or trl_available()]
    print(f"torch {torch.__version__}, {args.threads} threads, N = {args.tokens} tokens, "
          f"variants {', '.join(variants)}; times: median of {args.reps} forward+backward")
    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            inputs = _inputs(args.tokens, *SHAPES[shape], getattr(torch, dtype))
            times = {v: [] for v in variants}
            for v in variants:
                _step(v, *inputs)  # warm-up
            for _ in range(args.reps):
                for v in variants:  # turns, so that drift hits every variant alike
                    t0 = time.perf_counter()
                    _step(v, *inputs)
                    times[v].append(time.perf_counter() - t0)
            for v in variants:
                rows.append({"shape": shape, "dtype": dtype, "variant": v,
                             "seconds": statistics.median(times[v]), "peak_gib": _peak(args, v, shape, dtype)})
            full = next(r for r in rows if r["shape"] == shape and r["dtype"] == dtype and r["variant"] == "full")
            for r in rows[-len(variants):]:
                print(f"{shape:13s} {dtype:9s} {r['variant']:6s} {r['seconds']:7.3f} s "
                      f"({r['seconds'] / full['seconds']:4.2f} x full)  peak +{r['peak_gib']:6.3f} GiB "
                      f"({r['peak_gib'] / max(full['peak_gib'], 1e-9):5.3f} x full)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
