"""What the update's packing objective buys: one real rollout batch updated under several values
of :data:`creditlab.step.packing.MICRO_BATCH_COST`, side by side, from the same weights.

The packing (``loss.micro_batch_tokens``) cuts the length-sorted rows where the positions computed
are fewest: each distinct prompt once a micro-batch, each row at its micro-batch's longest
response, plus a fixed cost per micro-batch. A large cost gives the fewest micro-batches that fit
(the packing before this benchmark); a small one cuts more often when that saves padding. This
runs the forward and backward of the update (the module's path: shared prompts, fused head, global
denominators; no optimizer step) for each value on the same batch, in an order rotated every
round, and prints the median update time, the micro-batches, and the positions computed against
the real ones (response positions alone, as ``train/padding`` counts them, and prompts + responses).

Usage::

    python benchmarks/update_packing.py model=smollm2_135m_arith                # 8 x 8 x <= 128 tokens
    python benchmarks/update_packing.py --costs 0,16,64,1000000000 --rounds 3 model=smollm2_135m_arith
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch


def positions(rollout: Any, chunks: list[torch.Tensor]) -> tuple[int, int]:
    """(response positions, prompt + response positions) the micro-batches compute: each distinct
    prompt once at the micro-batch's longest prompt, each row at its longest response."""
    prompt, response = rollout.row_lengths
    resp = every = 0
    for c in chunks:
        t = int(response[c].max())
        resp += len(c) * t
        every += len(c) * t + len(rollout.prompt_keys[c].unique()) * int(prompt[c].max())
    return resp, every


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--costs", default="0,16,64,1000000000", help="MICRO_BATCH_COST values (1e9: fewest micro-batches)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="rounds dropped first")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("overrides", nargs="*", help="Hydra overrides of the run (model=..., rollout.max_new_tokens=...)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)

    import dataclasses

    from creditlab.run.compose import compose
    from creditlab.run.config import build_parts, validate
    from creditlab.run.memory import auto_token_budget
    from creditlab.run.models import load_policy
    from creditlab.step import packing
    from creditlab.step.aggregation import MiniBatchStats
    from creditlab.step.losses import policy_loss
    from creditlab.step.policy import ModelPolicyHandle
    from creditlab.step.rollout import RolloutSampler, collate
    from creditlab.step.token_logprobs import response_logprobs

    cfg = compose(["method=grpo", "logger=none", *args.overrides])
    checked = validate(cfg)
    model, tok, _ = load_policy(checked["model"])
    parts = build_parts(checked, model, tok)
    task, rollout_cfg = parts["task"], checked["rollout"]
    train, test = list(task.load("train")), list(task.load("test"))
    budget, _ = auto_token_budget(cfg, checked, model.config, tok, train, test)
    loss_cfg = dataclasses.replace(checked["loss"], micro_batch_tokens=budget)
    sampler = RolloutSampler(rollout_cfg, parts["backend"], parts["verifier"])
    handle = ModelPolicyHandle(model, tok, parts["backend"], torch.Generator().manual_seed(args.seed),
                               rollout_cfg.temperature, 0, rollout_fn=sampler)
    idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed))[: args.prompts].tolist()
    t0 = time.perf_counter()
    trajs = parts["rollout"].collect([train[i] for i in idx], handle, sampler, args.seed)
    rollout = collate(trajs, tok.pad_token_id, rollout_cfg.truncation)
    print(f"batch: {rollout.size} rows, {int(rollout.response_mask.sum())} response tokens (longest "
          f"{int(rollout.row_lengths[1].max())}), generated in {time.perf_counter() - t0:.1f} s; "
          f"loss.micro_batch_tokens = {budget}")
    advantages = torch.randn(rollout.response_mask.shape, generator=torch.Generator().manual_seed(1))
    stats = MiniBatchStats.from_mask(rollout.loss_mask, loss_cfg)
    prompt, response = rollout.row_lengths
    P, temperature = rollout.prompt_len, rollout_cfg.temperature or 1.0
    real_resp = int(rollout.response_mask.sum())
    real_all = real_resp + sum(int(prompt[(rollout.prompt_keys == k).nonzero()[0, 0]]) for k in rollout.prompt_keys.unique())

    def update(chunks: list[torch.Tensor]) -> float:
        t = time.perf_counter()
        for rows in chunks:
            start, width = packing.columns(P, prompt[rows], response[rows])
            lp, _ = response_logprobs(
                model, rollout.input_ids[rows, start : P + width], rollout.attention_mask[rows, start : P + width],
                P - start, rollout.response_ids[rows, :width], rollout.response_mask[rows, :width], temperature,
                fused=loss_cfg.fused_head, with_entropy=True)
            loss, _ = policy_loss(lp, None, advantages[rows, :width], rollout.loss_mask[rows, :width], loss_cfg, stats)
            loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    costs = [int(float(c)) for c in args.costs.split(",")]
    plans = {}
    for c in costs:
        packing.MICRO_BATCH_COST = c
        plans[c] = packing.pack_rows(torch.arange(rollout.size), prompt, response, loss_cfg.micro_batch_size,
                                     budget, rollout.prompt_keys)
    times: dict[int, list[float]] = {c: [] for c in costs}
    for r in range(args.rounds):
        for c in costs[r % len(costs):] + costs[: r % len(costs)]:
            s = update(plans[c])
            if r >= args.warmup:
                times[c].append(s)
        print(f"[round {r}] " + ", ".join(f"{c}: {times[c][-1]:.1f} s" if times[c] else f"{c}: warm-up" for c in costs))
    base = costs[-1]
    base_t = statistics.median(times[base])
    print(f"\n{args.rounds - args.warmup} rounds, threads={args.threads}; real: {real_resp} response tokens, "
          f"{real_all} prompt (each distinct once) + response tokens")
    print(f"{'MICRO_BATCH_COST':>16} {'micro-batches':>13} {'response computed/real':>22} {'all computed/real':>17} "
          f"{'update s':>9} {'vs last':>8}")
    for c in costs:
        resp, every = positions(rollout, plans[c])
        t = statistics.median(times[c])
        print(f"{c:>16} {len(plans[c]):>13} {resp / real_resp:>22.3f} {every / real_all:>17.3f} {t:>9.2f} "
              f"{t / base_t:>8.3f}")


if __name__ == "__main__":
    main()
