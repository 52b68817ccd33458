"""Decoding tokens/s against what this CPU's matrix multiplications allow, side by side in one run.

For each batch size B (rows decoded together), two measurements on the same model and threads:

* **decode**: the HF backend (``model.accelerator=auto``: the fused decoder where supported)
  samples B completions of up to ``--new-tokens`` tokens at T = 1 from B distinct held-out prompts
  of the run's task, as rollouts do; tokens/s = generated tokens / wall time (prefill included).
* **roof**: the same decoding step's matrix products alone, timed with ``torch.mm`` on weights of the
  model's shapes (per layer: q|k|v and gate|up concatenated as the fused decoder holds them, o and
  down; then the LM head): the time of one step's matmuls at B rows, so B / that time is the
  tokens/s the CPU's matmul throughput allows with nothing else (attention, norms, sampling,
  Python) in the way. Its GFLOP/s is the CPU's measured matmul throughput at these shapes.

The ratio decode / roof says how much of the matmul-bound speed decoding reaches. When rows end
at EOS the batch shrinks, and fewer rows use the matrix units less well, so a B-row roof is out of
reach however fast the loop is; the **live roof** charges each step only the rows still decoding:
its time is the sum over steps s of one step's matmuls at the number of rows longer than s
(interpolated between row counts timed at powers of two), and decode / live roof is the share of
that which decoding reaches. With
``--dtypes float32,bfloat16`` both run side by side: decoding with ``backend.dtype`` set to each,
against the roof of each dtype's products and against float32's. ``--ignore-eos`` holds every row
to ``--new-tokens`` (the batch never shrinks); without it, rows end where the model ends them.

Usage::

    python benchmarks/decode_roof.py model=smollm2_135m_arith            # B = 32, 64; 128 new tokens
    python benchmarks/decode_roof.py --dtypes float32,bfloat16 --batch 64 --ignore-eos model=smollm2_135m_arith
    python benchmarks/decode_roof.py --batch 8,64 --new-tokens 64 model=tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find bench_common
from bench_common import versions  # noqa: E402


def step_shapes(config) -> list[tuple[int, int]]:
    """``(in, out)`` of every matrix product of one decoding step (fused q|k|v and gate|up)."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * head_dim
    layer = [(hidden, qkv), (config.num_attention_heads * head_dim, hidden), (hidden, 2 * inter), (inter, hidden)]
    return layer * config.num_hidden_layers + [(hidden, config.vocab_size)]


def matmul_seconds(shapes: list[tuple[int, int]], rows: int, repeats: int, dtype: str = "float32") -> float:
    """Median over ``repeats`` of the time of one pass of ``rows x in @ in x out`` for every shape,
    inputs and weights in ``dtype``."""
    import torch

    dt = getattr(torch, dtype)
    weights = [torch.randn(i, o, dtype=dt) for i, o in shapes]
    inputs = {i: torch.randn(rows, i, dtype=dt) for i, _ in shapes}
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for (i, _), w in zip(shapes, weights):
            torch.mm(inputs[i], w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def live_roof_seconds(lengths: list[int], step_seconds) -> float:
    """Matmul time of decoding rows of ``lengths`` tokens when each step runs only the rows still
    decoding: ``sum over s < max(lengths) of step_seconds(#rows longer than s)``."""
    return sum(step_seconds(sum(n > s for n in lengths)) for s in range(max(lengths, default=0)))


def interpolated(points: dict[int, float]):
    """``rows -> seconds``, linear between the timed row counts of ``points`` (at least one)."""
    xs = sorted(points)

    def at(rows: int) -> float:
        if rows <= xs[0]:
            return points[xs[0]] * rows / xs[0]
        lo = max(x for x in xs if x <= rows)
        hi = min((x for x in xs if x >= rows), default=lo)
        if hi == lo:
            return points[lo] * rows / lo
        return points[lo] + (points[hi] - points[lo]) * (rows - lo) / (hi - lo)

    return at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="32,64", help="comma-separated batch sizes (default 32,64)")
    ap.add_argument("--new-tokens", type=int, default=128, help="decoding budget (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="timed decoding rounds per batch size, after one "
                    "untimed (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--dtypes", default="float32", help="comma-separated backend.dtype values, run side "
                    "by side (default float32)")
    ap.add_argument("--ignore-eos", action="store_true", help="rows never end before --new-tokens")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (model=..., task=...)")
    args = ap.parse_args()

    import torch
    from creditlab.run.config import build_parts
    from creditlab.run.models import load_policy
    from creditlab.step.policy import encode_prompt
    from creditlab.testing import check_config
    from creditlab.types import GenerationRequest, SamplingParams

    torch.set_num_threads(args.threads)
    _, checked = check_config(["logger=none", *args.overrides])
    model, tok, path = load_policy(checked["model"])
    model.eval()
    parts = build_parts(checked, model, tok)
    from creditlab.backends.hf import HFBackend

    base = parts["backend"]  # the run's backend (model.accelerator=auto: fused where supported)
    if not isinstance(base, HFBackend):
        raise SystemExit("decode_roof.py measures the hf backend (backend=hf)")
    dtypes = args.dtypes.split(",")
    backends = {d: HFBackend(dataclasses.replace(base.config, dtype=d), model=model, tokenizer=tok)
                for d in dtypes}
    if args.ignore_eos:  # no EOS id in the plan: every row decodes --new-tokens tokens
        for b in backends.values():
            plan = b._plan
            b._plan = lambda sp, plan=plan: dataclasses.replace(plan(sp), eos_token_id=None)
    problems = list(parts["task"].load("test"))
    shapes = step_shapes(model.config)
    flops_per_token = 2 * sum(i * o for i, o in shapes)
    print(", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"model {path}; threads {args.threads}; speed path: {base.accelerator.path} "
          f"({base.accelerator.reason}); matmul work {flops_per_token / 1e6:.0f} MFLOP per token; "
          f"{'rows held to --new-tokens' if args.ignore_eos else 'rows end at EOS'}")
    print(f"{'B':>4} {'dtype':>9} {'decode tok/s':>13} {'roof tok/s':>11} {'decode/roof':>12} "
          f"{'/fp32 roof':>11} {'matmul GFLOP/s':>15} {'decode GFLOP/s':>15} {'/live roof':>11}")
    offset = 0
    for rows in (int(b) for b in args.batch.split(",")):
        rates: dict[str, list[float]] = {d: [] for d in dtypes}
        lengths: dict[str, list[list[int]]] = {d: [] for d in dtypes}  # per timed round
        for r in range(-1, args.rounds):  # round -1 warms up (first calls, allocations), untimed
            batch = problems[offset : offset + rows]
            offset += rows
            requests = [GenerationRequest(tuple(encode_prompt(tok, p.prompt, checked["rollout"].chat_template))) for p in batch]
            sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens, seed=r + 1)
            for d in dtypes:  # the same prompts and seed for every dtype, alternating
                t0 = time.perf_counter()
                completions = backends[d].generate(requests, sampling)
                seconds = time.perf_counter() - t0
                if r >= 0:
                    rates[d].append(sum(len(c.response_ids) for c in completions) / seconds)
                    lengths[d].append([len(c.response_ids) for c in completions])
        counts = sorted({*(2**k for k in range(rows.bit_length()) if 2**k < rows), rows})
        step_s = {d: {k: matmul_seconds(shapes, k, repeats=5, dtype=d) for k in counts}
                  for d in dict.fromkeys(["float32", *dtypes])}
        roofs = {d: rows / t[rows] for d, t in step_s.items()}
        for d in dtypes:
            decode, roof = statistics.median(rates[d]), roofs[d]
            live = statistics.median(  # tokens / live-roof seconds, per round
                sum(n) / live_roof_seconds(n, interpolated(step_s[d])) for n in lengths[d])
            print(f"{rows:4d} {d:>9} {decode:13.0f} {roof:11.0f} {decode / roof:12.2f} "
                  f"{decode / roofs['float32']:11.2f} {flops_per_token * roof / 1e9:15.1f} "
                  f"{flops_per_token * decode / 1e9:15.1f} {decode / live:11.2f}")


if __name__ == "__main__":
    main()
