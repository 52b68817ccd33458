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

The ratio decode / roof says how much of the matmul-bound speed decoding reaches.

Usage::

    python benchmarks/decode_roof.py model=smollm2_135m_arith            # B = 32, 64; 128 new tokens
    python benchmarks/decode_roof.py --batch 8,64 --new-tokens 64 model=tiny
"""

from __future__ import annotations

import argparse
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


def matmul_seconds(shapes: list[tuple[int, int]], rows: int, repeats: int) -> float:
    """Median over ``repeats`` of the time of one pass of ``rows x in @ in x out`` for every shape."""
    import torch

    weights = [torch.randn(i, o) for i, o in shapes]
    inputs = {i: torch.randn(rows, i) for i, _ in shapes}
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for (i, _), w in zip(shapes, weights):
            torch.mm(inputs[i], w)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="32,64", help="comma-separated batch sizes (default 32,64)")
    ap.add_argument("--new-tokens", type=int, default=128, help="decoding budget (default 128)")
    ap.add_argument("--rounds", type=int, default=3, help="timed decoding rounds per batch size, after one "
                    "untimed (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
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
    backend = parts["backend"]  # the run's backend (model.accelerator=auto: fused where supported)
    problems = list(parts["task"].load("test"))
    shapes = step_shapes(model.config)
    flops_per_token = 2 * sum(i * o for i, o in shapes)
    print(", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"model {path}; threads {args.threads}; speed path: {backend.accelerator.path} "
          f"({backend.accelerator.reason}); matmul work {flops_per_token / 1e6:.0f} MFLOP per token")
    print(f"{'B':>4} {'decode tok/s':>13} {'roof tok/s':>11} {'decode/roof':>12} {'matmul GFLOP/s':>15} "
          f"{'decode GFLOP/s':>15}")
    offset = 0
    for rows in (int(b) for b in args.batch.split(",")):
        rates = []
        for r in range(-1, args.rounds):  # round -1 warms up (first calls, allocations), untimed
            batch = problems[offset : offset + rows]
            offset += rows
            requests = [GenerationRequest(tuple(encode_prompt(tok, p.prompt, checked["rollout"].chat_template))) for p in batch]
            sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens, seed=r + 1)
            t0 = time.perf_counter()
            completions = backend.generate(requests, sampling)
            seconds = time.perf_counter() - t0
            if r >= 0:
                rates.append(sum(len(c.response_ids) for c in completions) / seconds)
        decode = statistics.median(rates)
        roof_s = matmul_seconds(shapes, rows, repeats=5)
        roof = rows / roof_s
        print(f"{rows:4d} {decode:13.0f} {roof:11.0f} {decode / roof:12.2f} "
              f"{flops_per_token * rows / roof_s / 1e9:15.1f} {flops_per_token * decode / 1e9:15.1f}")


if __name__ == "__main__":
    main()
