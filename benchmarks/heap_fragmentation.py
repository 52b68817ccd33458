"""How much of a step's resident memory is glibc's heap rather than live tensors: one forward and
backward of the update's path (shared prompt, fused head) on a fixed micro-batch, repeated in one
process, for full fine-tuning and LoRA, each under glibc's default and under fixed mmap thresholds.

glibc serves blocks below its mmap threshold from a heap that keeps freed memory; by default the
threshold rises to the largest block freed so far (up to 32 MiB), so mid-size activations land on
the heap and can fragment it. ``MALLOC_MMAP_THRESHOLD_`` fixes the threshold (glibc reads it when a
process starts), so every setting runs in its own child process, one after another. Each child
prints, per repetition, the seconds, the resident size before it and the peak during it
(``VmHWM``, restarted before each repetition). Linux with glibc only.

Usage::

    python benchmarks/heap_fragmentation.py                          # SmolLM2, 16 rows x (40 + 64)
    python benchmarks/heap_fragmentation.py --thresholds default,1048576 --reps 4 --rows 16
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

GIB_KB = 2**20


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def child(args: argparse.Namespace) -> None:
    """One setting: load the model (LoRA when asked), then ``reps`` forward+backward passes."""
    import torch
    from creditlab.run.models import LoraConfig, apply_lora, load_policy
    from creditlab.run.compose import compose
    from creditlab.run.config import validate
    from creditlab.step.token_logprobs import response_logprobs

    torch.set_num_threads(args.threads)
    model, _, _ = load_policy(validate(compose([f"model={args.model}", "logger=none"]))["model"])
    if args.lora:
        model = apply_lora(model, LoraConfig(enabled=True, r=args.lora, alpha=float(args.lora)))
    model.eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, model.config.vocab_size - 1, (args.rows, args.prompt + args.response), generator=g)
    ids[:, : args.prompt] = ids[0, : args.prompt]  # one prompt, as a group shares it
    mask = torch.ones_like(ids)
    targets = ids[:, args.prompt :]
    for rep in range(args.reps):
        Path("/proc/self/clear_refs").write_text("5")  # restart VmHWM
        before = _status("VmRSS")
        t0 = time.perf_counter()
        lp, _ = response_logprobs(model, ids, mask, args.prompt, targets, torch.ones_like(targets, dtype=torch.bool),
                                  1.0, fused="on", with_entropy=False)
        (-(lp * 0.1).mean()).backward()
        model.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - t0
        print(f"  rep {rep}: {seconds:6.2f} s  resident before {before / GIB_KB:5.2f} GiB  "
              f"peak {_status('VmHWM') / GIB_KB:5.2f} GiB", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2_135m_arith", help="a model preset (conf/model)")
    p.add_argument("--thresholds", default="default,1048576", help="comma-separated: default or bytes")
    p.add_argument("--loras", default="0,64", help="comma-separated LoRA ranks on all linear layers; 0 = full")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", type=int, default=40)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--lora", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    if not Path("/proc/self/clear_refs").exists():
        sys.exit("heap_fragmentation.py reads Linux's /proc/self/status and clear_refs; run it on Linux")
    for threshold in args.thresholds.split(","):
        for lora in (int(x) for x in args.loras.split(",")):
            env = {**os.environ, "HF_HUB_OFFLINE": "1"}
            env.pop("MALLOC_MMAP_THRESHOLD_", None)
            if threshold != "default":
                env["MALLOC_MMAP_THRESHOLD_"] = str(int(threshold))
            print(f"{'LoRA r=' + str(lora) if lora else 'full fine-tuning'}, mmap threshold {threshold}", flush=True)
            cmd = [sys.executable, __file__, "--child", "--lora", str(lora), "--model", args.model, "--reps", str(args.reps),
                   "--rows", str(args.rows), "--prompt", str(args.prompt), "--response", str(args.response),
                   "--threads", str(args.threads)]
            subprocess.run(cmd, env=env, check=True)


if __name__ == "__main__":
    main()
