"""Per-step cost of each advantage estimator against GRPO, on the same rollout batch.

Each round samples one rollout batch of the embedded task (arith + the tiny warm-started model,
``--prompts`` x ``--group`` completions, CPU) with GRPO's plain rollouts; then every method's
segmenter + estimator + one policy update run on that very batch, from the same weights (restored
before each method). So the methods differ only in the work their credit assignment adds.
Methods take turns within a round, in an order rotated every round, so load changes hit all alike.

A method's step time is ``generate + segment + estimate + update`` (generation is the batch's,
shared). Printed per method: median segment+estimate and update times, the step time, and the
ratio of median step times to GRPO's; the ratio of estimator times alone is printed too.

``--oar-p-lengths`` additionally times OAR-P's estimator on batches of fixed-length problems
(``task.min_steps = task.max_steps = k``) to show how its cost grows with response length (one
perturbed pass per reasoning token).

Usage::

    python benchmarks/estimator_cost.py                              # grpo ibpo rredcot oar_g oar_p
    python benchmarks/estimator_cost.py --rounds 8 --threads 2 --oar-p-lengths 2,3,4,5
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import statistics
import time
from typing import Any

import torch

DEFAULT_METHODS = "grpo,dr_grpo,ibpo,rredcot,oar_g,oar_p"


def checked_for(method: str, extra: list[str]) -> dict[str, Any]:
    """Validated config sections of ``method=<method>`` plus ``extra`` overrides."""
    from creditlab.run.compose import compose
    from creditlab.run.config import validate

    return validate(compose([f"method={method}", "logger=none", *extra]))


class Bench:
    """The model, GRPO's rollouts (the plain strategy and the run's sampler) and, per method, its
    segmenter, estimator and loss settings."""

    def __init__(self, methods: list[str], extra: list[str]) -> None:
        from creditlab.run.compose import compose
        from creditlab.run.config import build_parts
        from creditlab.run.memory import auto_token_budget
        from creditlab.run.models import load_policy
        from creditlab.step.policy import ModelPolicyHandle
        from creditlab.step.rollout import RolloutSampler

        base = checked_for("grpo", extra)
        self.model, self.tokenizer, _ = load_policy(base["model"])
        parts = build_parts(base, self.model, self.tokenizer)
        self.task, self.rollout_cfg = parts["task"], base["rollout"]
        self.strategy = parts["rollout"]
        self.sampler = RolloutSampler(base["rollout"], parts["backend"], parts["verifier"])
        self.handle = lambda seed, tokens=0: ModelPolicyHandle(
            self.model, self.tokenizer, parts["backend"], torch.Generator().manual_seed(seed),
            self.rollout_cfg.temperature, 0, rollout_fn=self.sampler, micro_batch_tokens=tokens,
        )
        self.methods: dict[str, dict[str, Any]] = {}
        train, test = list(self.task.load("train")), list(self.task.load("test"))
        for m in methods:
            checked = checked_for(m, extra)
            built = build_parts(checked, self.model, self.tokenizer)
            # loss.micro_batch_tokens=auto sized as a run sizes it (creditlab.run.memory)
            cfg = compose([f"method={m}", "logger=none", *extra])
            budget, _ = auto_token_budget(cfg, checked, self.model.config, self.tokenizer, train, test)
            loss = dataclasses.replace(checked["loss"], micro_batch_tokens=budget)
            self.methods[m] = {"segmenter": built["segmenter"], "advantage": built["advantage"], "loss": loss}
            print(f"[{m}] loss.micro_batch_tokens = {budget}")
        self.initial = copy.deepcopy(self.model.state_dict())
        self.problems = self.task.load("train")

    def batch(self, seed: int, prompts: int) -> tuple[Any, float]:
        """A collated rollout batch of ``prompts`` problems and its generation time."""
        from creditlab.step.rollout import collate

        rng = torch.Generator().manual_seed(seed)
        idx = torch.randperm(len(self.problems), generator=rng)[:prompts].tolist()
        t0 = time.perf_counter()
        trajs = self.strategy.collect([self.problems[i] for i in idx], self.handle(seed), self.sampler, seed)
        gen = time.perf_counter() - t0
        return collate(trajs, self.tokenizer.pad_token_id, self.rollout_cfg.truncation), gen

    def run_method(self, name: str, rollout: Any, seed: int) -> tuple[float, float]:
        """(segment+estimate seconds, update seconds) of ``name`` on ``rollout``."""
        from creditlab.step.rollout import with_segments

        parts = self.methods[name]
        self.model.load_state_dict(self.initial)
        t0 = time.perf_counter()
        batch = with_segments(rollout, parts["segmenter"].segment(rollout))
        adv = parts["advantage"].estimate(batch, self.handle(seed, parts["loss"].token_budget)).values
        t1 = time.perf_counter()
        self.update(batch, adv, parts["loss"])
        return t1 - t0, time.perf_counter() - t1

    def update(self, rollout: Any, advantages: torch.Tensor, cfg: Any) -> None:
        """One optimizer update as ``CreditAssignmentModule.update`` does it with one mini-batch:
        micro-batches packed by ``loss.micro_batch_size`` / ``micro_batch_tokens`` and cut to their
        own columns, the shared-prompt forward through the fused head where ``loss.fused_head``
        allows, global denominators, backward, clip, fused AdamW."""
        from creditlab.step.aggregation import MiniBatchStats
        from creditlab.step.losses import policy_loss
        from creditlab.step.packing import columns, pack_rows
        from creditlab.step.token_logprobs import response_logprobs

        opt = torch.optim.AdamW(self.model.parameters(), lr=1e-6, fused=True)
        stats = MiniBatchStats.from_mask(rollout.loss_mask, cfg)
        prompt, response = rollout.row_lengths
        p = rollout.prompt_len
        temperature = self.rollout_cfg.temperature or 1.0
        for rows in pack_rows(torch.arange(rollout.size), prompt, response, cfg.micro_batch_size,
                              cfg.token_budget, rollout.prompt_keys):
            start, t = columns(p, prompt[rows], response[rows])
            lp, _ = response_logprobs(
                self.model, rollout.input_ids[rows, start : p + t], rollout.attention_mask[rows, start : p + t],
                p - start, rollout.response_ids[rows, :t], rollout.response_mask[rows, :t], temperature,
                fused=cfg.fused_head, with_entropy=False)
            loss, _ = policy_loss(lp, None, advantages[rows, :t], rollout.loss_mask[rows, :t], cfg, stats)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default=DEFAULT_METHODS, help="comma-separated presets; the first is the baseline")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=1, help="rounds dropped first")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--oar-p-lengths", default="", help="e.g. 2,3,4,5: OAR-P cost at k-step problems")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every method")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    bench = Bench(methods, args.overrides)

    est: dict[str, list[float]] = {m: [] for m in methods}
    upd: dict[str, list[float]] = {m: [] for m in methods}
    gens: list[float] = []
    tokens: list[float] = []
    for r in range(args.rounds):
        rollout, gen = bench.batch(1000 + r, args.prompts)
        order = methods[r % len(methods):] + methods[: r % len(methods)]
        for m in order:
            e, u = bench.run_method(m, rollout, 1000 + r)
            if r >= args.warmup:
                est[m].append(e)
                upd[m].append(u)
        if r >= args.warmup:
            gens.append(gen)
            tokens.append(float(rollout.response_mask.sum()))
        print(f"[round {r}] generate {gen:.2f}s, {int(rollout.response_mask.sum())} response tokens")

    g = med(gens)
    base = methods[0]
    base_step = g + med(est[base]) + med(upd[base])
    print(f"\n{args.rounds - args.warmup} rounds, threads={args.threads}, {args.prompts} prompts x "
          f"{bench.rollout_cfg.group_size}, median response tokens/batch {med(tokens):.0f}, "
          f"median generate {g:.3f}s")
    print(f"{'method':<10}{'seg+est s':>11}{'update s':>10}{'step s':>9}{'x ' + base + ' step':>14}{'est / ' + base:>12}")
    for m in methods:
        step = g + med(est[m]) + med(upd[m])
        print(f"{m:<10}{med(est[m]):>11.4f}{med(upd[m]):>10.3f}{step:>9.3f}{step / base_step:>14.3f}"
              f"{med(est[m]) / max(med(est[base]), 1e-9):>12.1f}")

    if args.oar_p_lengths and "oar_p" in methods:
        print("\nOAR-P estimator time against response length (task.min_steps = task.max_steps = k)")
        print(f"{'k':>3}{'mean response tok':>19}{'oar_p est s':>13}{'ms / token':>12}")
        for k in [int(x) for x in args.oar_p_lengths.split(",")]:
            sized = Bench(["oar_p"], [*args.overrides, f"task.min_steps={k}", f"task.max_steps={k}"])
            times, lengths = [], []
            for r in range(max(2, args.rounds // 2)):
                rollout, _ = sized.batch(2000 + r, args.prompts)
                times.append(sized.run_method("oar_p", rollout, 2000 + r)[0])
                lengths.append(float(rollout.response_mask.sum(1).float().mean()))
            n_tok = med(lengths) * args.prompts * sized.rollout_cfg.group_size
            print(f"{k:>3}{med(lengths):>19.1f}{med(times):>13.3f}{1000 * med(times) / n_tok:>12.3f}")


if __name__ == "__main__":
    main()
