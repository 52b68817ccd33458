"""Where an evaluation's time goes: prefill, decoding steps, sampling, and what rows ending costs.

Runs ``creditlab eval`` in this process with timers around the HF backend's parts and prints, for
each forward batch (one ``generate`` batch of greedy or sampled answers):

- ``prefill``: the model's own forward (``HFBackend._forward``): the prefill of each distinct
  context, and every step when the fused decoder is off;
- ``steps``: the fused decoder's steps (``FusedDecoder.step``), with the rows still decoding at
  each step;
- ``sampling``: ``sample_tokens`` (log-softmax, the draw, log-prob and entropy over the vocabulary);
- ``compact + store``: dropping finished rows (``FusedDecoder.select``) and keeping their keys and
  values for later calls (``keep_rows``);
- ``other``: the rest of the batch (end checks, copies, detokenizing);
- ``prefill padding``: the share of the positions the model's own forward ran that were left
  padding (the distinct contexts of a batch are padded to its longest).

Two bounds say what scheduling could still cut, without measuring a scheduler that does not exist:

- ``full width``: the steps' row-steps at the cost per row-step of the batch's full-width steps.
  It is what the steps would cost if finished rows were refilled at once (continuous batching),
  so ``steps - full width`` is the most a refill could save; the last batch of a call would
  still have a tail, so it is an upper bound.
- the greedy batches' prefill, when the same call also samples: the sampled answers prefill the
  same prompts again, which a shared prefill would save.

Neither keeps the arithmetic: both change which rows share a batch, so they would need the
declared equivalence check of ``docs/real-model.md``, not the same-``metrics.jsonl`` check.

Usage (the arguments are ``creditlab eval``'s)::

    python benchmarks/eval_breakdown.py model=smollm2_135m_word_problems task=word_problems \\
        segmenter=newline rollout.max_new_tokens=192 --problems 64 --samples 4 --batch-size 256
"""

from __future__ import annotations

import contextlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

PARTS = ("prefill", "steps", "sampling", "compact + store", "other")


@dataclass
class Batch:
    """One forward batch: its rows, whether greedy, and its seconds by part.

    Attributes:
        rows: Requests in the batch (its full width).
        greedy: Greedy (temperature 0) or sampled.
        seconds: The whole batch (``HFBackend._generate_batch``).
        parts: Seconds by part (:data:`PARTS` but ``other``).
        steps: ``(live rows, seconds)`` of each fused decoding step.
        lengths: Each answer's generated tokens.
        prefilled: Positions the model's own forward ran (rows x columns, padding included).
        padding: Of those, the padding (attention mask 0).
    """

    rows: int
    greedy: bool
    seconds: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    steps: list[tuple[int, float]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    prefilled: int = 0
    padding: int = 0


def full_width_seconds(steps: Sequence[tuple[int, float]], width: int) -> float:
    """What ``steps`` (each ``(live rows, seconds)``) would cost at the cost per row-step of the
    steps that ran at the batch's full ``width`` (their median); 0 without steps. When no step ran
    at ``width`` (every row was already fed at the first step), the widest steps set the cost."""
    if not steps:
        return 0.0
    widest = width if any(r == width for r, _ in steps) else max(r for r, _ in steps)
    per_row = statistics.median(s / r for r, s in steps if r == widest)
    return per_row * sum(r for r, _ in steps)


def summarize(batches: Sequence[Batch]) -> dict[str, Any]:
    """Totals over ``batches``: seconds by part (``other`` = batch seconds not in a part), the
    steps' full-width bound, and the prefill of greedy batches that a sampled call repeats."""
    parts = {p: sum(b.parts.get(p, 0.0) for b in batches) for p in PARTS[:-1]}
    total = sum(b.seconds for b in batches)
    parts["other"] = total - sum(parts.values())
    sampled = any(not b.greedy for b in batches)
    return {
        "seconds": total,
        "parts": parts,
        "full_width": sum(full_width_seconds(b.steps, b.rows) for b in batches),
        "greedy_prefill": sum(b.parts.get("prefill", 0.0) for b in batches if b.greedy) if sampled else 0.0,
        "answers": sum(b.rows for b in batches),
    }


@contextlib.contextmanager
def probe() -> Iterator[list[Batch]]:
    """Time the HF backend's parts while the block runs; yields the list of batches it fills."""
    from creditlab.accel import fused_decode
    from creditlab.backends import hf

    batches: list[Batch] = []
    current: list[Batch] = []
    saved: list[tuple[Any, str, Any]] = []

    def timed(owner: Any, name: str, part: str, record: Callable[[Batch, tuple, dict[str, Any], float], None] | None = None):
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = original(*args, **kwargs)
            seconds = time.perf_counter() - start
            if current:
                batch = current[-1]
                batch.parts[part] = batch.parts.get(part, 0.0) + seconds
                if record is not None:
                    record(batch, args, kwargs, seconds)
            return out

        saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def forward(batch: Batch, args: tuple, kwargs: dict[str, Any], seconds: float) -> None:
        mask = kwargs.get("attention_mask")
        if mask is not None:
            batch.prefilled += mask.numel()
            batch.padding += int((mask == 0).sum())

    def step(batch: Batch, args: tuple, kwargs: dict[str, Any], seconds: float) -> None:
        batch.steps.append((int(args[1].shape[0]), seconds))  # args: (self, tokens (A,), positions)

    original_batch = hf.HFBackend._generate_batch

    def generate_batch(self: Any, reqs: list, plan: Any, gen: Any, watch: Any = None) -> list:
        current.append(Batch(len(reqs), bool(plan.greedy)))
        start = time.perf_counter()
        try:
            out = original_batch(self, reqs, plan, gen, watch)
        finally:
            batch = current.pop()
            batch.seconds = time.perf_counter() - start
            batches.append(batch)
        batch.lengths = [len(c.response_ids) for c in out]
        return out

    timed(hf.HFBackend, "_forward", "prefill", forward)
    timed(fused_decode.FusedDecoder, "step", "steps", step)
    timed(hf, "sample_tokens", "sampling")
    timed(fused_decode.FusedDecoder, "select", "compact + store")
    timed(hf, "keep_rows", "compact + store")
    saved.append((hf.HFBackend, "_generate_batch", original_batch))
    hf.HFBackend._generate_batch = generate_batch
    try:
        yield batches
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def report(batches: Sequence[Batch], wall: float) -> str:
    """The table of batches and the totals, as Markdown."""
    lines = ["| batch | rows | kind | seconds | " + " | ".join(PARTS) + " | full width | mean tokens | prefill padding |",
             "|" + "---|" * (len(PARTS) + 7)]
    for i, b in enumerate(batches):
        s = summarize([b])
        cells = " | ".join(f"{s['parts'][p]:.1f}" for p in PARTS)
        lines.append(f"| {i} | {b.rows} | {'greedy' if b.greedy else 'sampled'} | {b.seconds:.1f} | {cells} | "
                     f"{s['full_width']:.1f} | {statistics.mean(b.lengths) if b.lengths else 0:.0f} | "
                     f"{b.padding / b.prefilled if b.prefilled else 0:.0%} |")
    s = summarize(batches)
    cells = " | ".join(f"{s['parts'][p]:.1f}" for p in PARTS)
    pad = sum(b.padding for b in batches) / max(sum(b.prefilled for b in batches), 1)
    lines.append(f"| all | {s['answers']} | | {s['seconds']:.1f} | {cells} | {s['full_width']:.1f} | | {pad:.0%} |")
    gen = s["seconds"] or 1.0
    refill = s["parts"]["steps"] - s["full_width"]
    lines += [
        "",
        f"eval wall-clock {wall:.1f} s, of which generation {s['seconds']:.1f} s "
        "(" + ", ".join(f"{p} {s['parts'][p] / gen:.0%}" for p in PARTS) + ")",
        f"bounds: refilling finished rows would save at most {refill:.1f} s ({refill / gen:.0%} of generation); "
        f"sharing the greedy prefill with the samples {s['greedy_prefill']:.1f} s ({s['greedy_prefill'] / gen:.0%})",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> None:
    import torch

    from creditlab.cli import main as creditlab

    print(f"# eval_breakdown: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"kernels {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads")
    start = time.perf_counter()
    with probe() as batches:
        creditlab(["eval", *argv])
    print(report(batches, time.perf_counter() - start))


if __name__ == "__main__":
    main(sys.argv[1:])
