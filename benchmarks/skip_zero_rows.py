"""What ``loss.skip_zero_advantage`` saves per update, side by side in one run, on real rollouts.

One process, one model (any run config given as Hydra overrides; the real-problem preset is
``experiment=smollm2_word_problems_grpo``). For each of ``--batches`` rollout batches (a training
step's problems, sampled with the run's rollout strategy and backend, advantages from the run's
estimator), the module's own update (:meth:`creditlab.step.update.PolicyUpdate.update`: packing,
forward, loss, backward, optimizer step) runs with the option off and on, in alternating order,
``--rounds`` times each. The optimizer's learning rate is 0, so every round sees the same weights.

Reported: the generation time of each batch, its rows without any non-zero advantage, the median
update time each way and their ratio, and the step (generation + update) each way. The update is
exactly the same either way up to float rounding (tests/unit/test_skip_zero_advantage.py).

Usage::

    python benchmarks/skip_zero_rows.py experiment=smollm2_word_problems_grpo
    python benchmarks/skip_zero_rows.py --batches 1 --rounds 1 prompts_per_step=2 rollout.group_size=4
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=2, help="rollout batches (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="updates each way per batch (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the run config")
    args = ap.parse_args(argv)

    import functools

    import torch
    from creditlab.run.config import build_parts
    from creditlab.run.memory import auto_token_budget
    from creditlab.run.models import load_policy
    from creditlab.step.module import CreditAssignmentModule
    from creditlab.step.policy import ModelPolicyHandle
    from creditlab.step.rollout import RolloutSampler, collate, with_segments
    from creditlab.testing import check_config

    torch.set_num_threads(args.threads)
    cfg, checked = check_config(["logger=none", *args.overrides])
    model, tok, _ = load_policy(checked["model"])
    parts = build_parts(checked, model, tok)
    rollout, loss_cfg, eval_cfg = checked["rollout"], checked["loss"], checked["eval"]
    if loss_cfg.kl_coef > 0:
        sys.exit("loss.kl_coef > 0: the KL term trains every row, so nothing can be skipped")
    problems = list(parts["task"].load("train"))
    budget = loss_cfg.micro_batch_tokens
    if budget == "auto":  # as the runner sizes it, from the memory plan and this machine's memory
        budget, _ = auto_token_budget(cfg, checked, model.config, tok, problems, list(parts["task"].load("test")))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.0)  # the update's whole path, weights unchanged
    modules = {}
    for skip in (False, True):
        loss = dataclasses.replace(loss_cfg, skip_zero_advantage=skip, micro_batch_tokens=budget)
        m = CreditAssignmentModule(model, tok, None, None, [], loss, rollout, eval_cfg,
                                   functools.partial(torch.optim.AdamW, lr=0.0), seed=args.seed)
        m.optimizers = lambda: opt
        m.manual_backward = lambda loss: loss.backward()
        modules[skip] = m
    k = checked["run"].prompts_per_step
    sampler = RolloutSampler(rollout, parts["backend"], parts["verifier"])
    rows = []
    for b in range(args.batches):
        ctx = ModelPolicyHandle(model, tok, parts["backend"], torch.Generator().manual_seed(args.seed + b),
                                rollout.temperature, 0, rollout_fn=sampler)
        t0 = time.perf_counter()
        trajs = parts["rollout"].collect(problems[k * b : k * (b + 1)], ctx, sampler, args.seed + b)
        generation = time.perf_counter() - t0
        batch = collate(trajs, tok.pad_token_id, rollout.truncation)
        batch = with_segments(batch, parts["segmenter"].segment(batch))
        adv = parts["advantage"].estimate(batch, ctx).values
        idle = int((~CreditAssignmentModule.rows_with_signal(batch, adv)).sum())
        times: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for skip in (False, True) if r % 2 == 0 else (True, False):
                t = time.perf_counter()
                modules[skip].update(batch, adv)
                times[skip].append(time.perf_counter() - t)
        full, skipped = statistics.median(times[False]), statistics.median(times[True])
        rows.append((b, batch.size, idle, generation, full, skipped))
        print(f"[batch {b}] {idle}/{batch.size} rows without advantage; generation {generation:.1f} s; "
              f"update {full:.1f} s full, {skipped:.1f} s skipping", flush=True)
    print(", ".join(f"{key} {v}" for key, v in versions().items()))
    print(f"threads {args.threads}; {k} prompts x {rollout.group_size}; {args.rounds} updates each way per batch "
          f"(median); loss.micro_batch_tokens {budget}")
    print(f"{'batch':>5} {'idle rows':>9} {'generation s':>12} {'update s':>9} {'skipping s':>10} {'update x':>8} "
          f"{'step x':>6}")
    for b, size, idle, gen, full, skipped in rows:
        print(f"{b:>5} {f'{idle}/{size}':>9} {gen:>12.1f} {full:>9.1f} {skipped:>10.1f} {full / skipped:>8.2f} "
              f"{(gen + full) / (gen + skipped):>6.2f}")


if __name__ == "__main__":
    main()
