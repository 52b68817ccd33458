"""What the optional speed path (``model.accelerator``) saves per RL step, side by side in one run.

One process, one model (the embedded default's tiny checkpoint, or any config given as Hydra
overrides). Each round runs one RL step's work twice, once with ``model.accelerator=none`` and once
with ``auto`` (fused decoding where supported), in alternating order:

* rollouts: the run's rollout strategy through the HF backend and the verifier (the step's
  ``prompts_per_step`` problems, fresh ones every round);
* update: the training forward (each prompt once, public KV-cache API), the policy loss and its
  backward on those rollouts (weights are not stepped, so every round sees the same policy).

Reported: medians over the rounds after ``--warmup``, the step (rollouts + update) with each
setting, and the saving as a share of the step without the speed path. A hand-written path is
kept only while this share is at least 10% (docs/architecture.md, "Speed paths").

``--compile N`` then compiles the model's forward (``model.accelerator=compile``:
``torch.compile(model.forward, dynamic=True)``) and runs N more rounds with it (after the
interleaved ones: compiling cannot be undone in a process): the first round's time (compiling
included) and the median of the others.

Usage::

    python benchmarks/accel_step.py                       # the embedded default, 2 threads
    python benchmarks/accel_step.py --rounds 24 rollout.max_new_tokens=32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find bench_common
from bench_common import versions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="measured rounds (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="rounds discarded first (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--compile", type=int, default=0, metavar="N",
                    help="then N rounds with model.accelerator=compile (default 0: skip)")
    ap.add_argument("--json", default=None, help="write the raw timings here")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config")
    args = ap.parse_args()

    import torch
    from creditlab.accel import compile_model
    from creditlab.backends.hf import HFBackend
    from creditlab.run.config import build_parts
    from creditlab.run.models import load_policy
    from creditlab.step.aggregation import MiniBatchStats
    from creditlab.step.forward import response_logits
    from creditlab.step.losses import gather_logprobs, policy_loss
    from creditlab.step.policy import ModelPolicyHandle
    from creditlab.step.rollout import RolloutSampler, collate, with_segments
    from creditlab.testing import check_config

    torch.set_num_threads(args.threads)
    _, checked = check_config(["logger=none", "prompts_per_step=8", *args.overrides])  # the measured batch (README)
    model, tok, _ = load_policy(checked["model"])
    parts = build_parts(checked, model, tok)
    rollout, loss_cfg = checked["rollout"], checked["loss"]
    backends = {
        mode: HFBackend(HFBackend.Config(accelerator=mode), model=model, tokenizer=tok)
        for mode in ("none", "auto", "compile")
    }
    if backends["auto"].accelerator.path != "fused":
        sys.exit(f"nothing to compare: {backends['auto'].accelerator.reason}")
    problems = list(parts["task"].load("train"))
    k = checked["run"].prompts_per_step

    def step(mode: str, r: int) -> tuple[float, float]:
        backend = backends[mode]
        sampler = RolloutSampler(rollout, backend, parts["verifier"])
        ctx = ModelPolicyHandle(model, tok, backend, torch.Generator().manual_seed(r),
                                rollout.temperature, 0, rollout_fn=sampler)
        t0 = time.perf_counter()
        trajs = parts["rollout"].collect(problems[k * r : k * (r + 1)], ctx, sampler, r)
        t1 = time.perf_counter()
        batch = collate(trajs, tok.pad_token_id, rollout.truncation)
        batch = with_segments(batch, parts["segmenter"].segment(batch))
        adv = parts["advantage"].estimate(batch, ctx).values
        model.zero_grad(set_to_none=True)
        logits = response_logits(model, batch.input_ids, batch.attention_mask, batch.prompt_len)
        lp = gather_logprobs(logits, batch.response_ids, rollout.temperature or 1.0)
        stats = MiniBatchStats.from_mask(batch.loss_mask, loss_cfg)
        loss, _ = policy_loss(lp, None, adv, batch.loss_mask, loss_cfg, stats)
        loss.backward()
        return t1 - t0, time.perf_counter() - t1

    times: dict[str, list[tuple[float, float]]] = {"none": [], "auto": []}
    for r in range(args.warmup + args.rounds):
        for mode in ("none", "auto") if r % 2 == 0 else ("auto", "none"):
            times[mode].append(step(mode, r))
    med = {
        mode: {
            "rollouts": statistics.median(t[0] for t in ts[args.warmup :]),
            "update": statistics.median(t[1] for t in ts[args.warmup :]),
            "step": statistics.median(sum(t) for t in ts[args.warmup :]),
        }
        for mode, ts in times.items()
    }
    saved = med["none"]["step"] - med["auto"]["step"]
    print(", ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"threads {args.threads}; {args.rounds} rounds (+{args.warmup} warm-up); "
          f"{k} prompts x {rollout.group_size}; {backends['auto'].accelerator.reason}")
    print(f"{'accelerator':12} {'rollouts s':>11} {'update s':>9} {'step s':>8}")
    for mode, m in med.items():
        print(f"{mode:12} {m['rollouts']:11.3f} {m['update']:9.3f} {m['step']:8.3f}")
    print(f"saved per step: {saved:.3f} s = {saved / med['none']['step']:.1%} of the step without it "
          f"(rollouts {med['auto']['rollouts'] / med['none']['rollouts']:.2f}x)")
    if args.compile:
        compile_model(model, "compile")
        start = args.warmup + args.rounds
        times["compile"] = [step("compile", start + r) for r in range(args.compile)]
        first, rest = times["compile"][0], times["compile"][1:]
        med["compile"] = {
            "first_step": sum(first),
            "rollouts": statistics.median(t[0] for t in rest),
            "update": statistics.median(t[1] for t in rest),
            "step": statistics.median(sum(t) for t in rest),
        }
        m = med["compile"]
        print(f"{'compile':12} {m['rollouts']:11.3f} {m['update']:9.3f} {m['step']:8.3f}   "
              f"(first round, compiling included: {m['first_step']:.1f} s; median of the other "
              f"{len(rest)}; {m['step'] / med['none']['step']:.2f}x the step without a speed path)")
    if args.json:
        Path(args.json).write_text(json.dumps({"medians": med, "raw": times}, indent=2))


if __name__ == "__main__":
    main()
