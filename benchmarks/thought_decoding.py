"""Thought-by-thought generation, by rounds against one pass (``rollout.thought_decoding``), on the
work credit-bench does: chains sampled line by line, then ``K`` continuations from each of their
thought boundaries.

Both decodings run in this process on one backend and one model (default: the real-problem
experiment, SmolLM2-135M-Instruct with its shipped word-problem adapter), alternating round by
round (round r: rounds then one pass, then the other order), each with the same requests and
seed. Prints, per decoding and phase, the median wall-clock, the tokens generated and prefilled
(the HF backend's ``prefill_tokens``), the process's peak resident memory so far, and the ratio
rounds / one pass. The draws differ by design (one seeded call against one per thought), so the
tokens generated differ a little; ``tests/unit/test_thought_one_pass.py`` shows the same tokens
when greedy and the same distribution when sampled.

Usage::

    python benchmarks/thought_decoding.py                                  # 4 prompts x 8 chains, K = 4
    python benchmarks/thought_decoding.py --prompts 2 --chains 4 --k 8 --rounds 3 --threads 2
    python benchmarks/thought_decoding.py --overrides experiment=credit_multi   # the tiny task
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time


def build(overrides: list[str]):
    from creditlab.run.compose import compose
    from creditlab.run.config import build_parts, validate
    from creditlab.run.models import load_policy

    checked = validate(compose(["rollout.thoughts=true", *overrides]))
    task_cls, task_cfg = checked["task"]
    task = task_cls(task_cfg)
    model, tok, path = load_policy(checked["model"], checked["run"].seed)
    parts = build_parts(checked, model, tok, task=task)
    return checked, task, tok, parts["backend"], path


def phase(backend, requests, sampling, cfg) -> tuple[float, list, dict]:
    from creditlab.step.generation import generate_thoughts

    backend.release()  # no keys/values kept from the other decoding's calls
    backend.metrics()
    t0 = time.perf_counter()
    out = generate_thoughts(backend, requests, sampling, cfg)
    return time.perf_counter() - t0, out, backend.metrics()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--chains", type=int, default=8, help="chains per prompt")
    p.add_argument("--k", type=int, default=4, help="continuations per thought boundary")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--overrides", nargs="*", default=["experiment=smollm2_word_problems_grpo"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from creditlab.step.generation import completion_spans
    from creditlab.step.policy import encode_prompt
    from creditlab.types import GenerationRequest

    torch.set_num_threads(args.threads)
    checked, task, tok, backend, path = build(args.overrides)
    rollout = checked["rollout"]
    problems = list(task.load("train"))[: args.prompts]
    prompts = [encode_prompt(tok, pr.prompt, rollout.chat_template) for pr in problems]
    chains = [GenerationRequest(q) for q in prompts for _ in range(args.chains)]
    delim = tok.encode(rollout.delimiter, add_special_tokens=False)
    rows: dict[str, dict[str, list]] = {d: {"chains": [], "continuations": []} for d in ("rounds", "one_pass")}
    for r in range(args.rounds):
        order = ("rounds", "one_pass") if r % 2 == 0 else ("one_pass", "rounds")
        for decoding in order:
            cfg = rollout.thought_config
            cfg = type(cfg)(**{**cfg.__dict__, "decoding": decoding})
            sp = rollout.sampling(1000 + r)
            dt, out, stats = phase(backend, chains, sp, cfg)
            rows[decoding]["chains"].append({"s": dt, "tokens": stats["tokens"], "prefill": stats["prefill_tokens"]})
            # continuations from every thought boundary of the first chain of each prompt (as credit-bench's truth)
            conts = []
            for c in out[:: args.chains]:
                for a, _ in completion_spans(c, delim, tok.eos_token_id)[1:]:
                    conts += [GenerationRequest(c.prompt_ids, c.response_ids[:a], c.segment_ids[:a])] * args.k
            dt, _, stats = phase(backend, conts, rollout.sampling(2000 + r), cfg)
            rows[decoding]["continuations"].append(
                {"s": dt, "tokens": stats["tokens"], "prefill": stats["prefill_tokens"], "requests": len(conts)})
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"round {r} {decoding:8s} chains {rows[decoding]['chains'][-1]['s']:7.1f} s, "
                  f"continuations ({len(conts)}) {dt:7.1f} s; peak RSS so far {peak:.2f} GiB", flush=True)
    print(f"\nmodel {path}, {args.prompts} prompts x {args.chains} chains, K = {args.k}, "
          f"threads {args.threads}, path {backend.accelerator.path}")
    med = {d: {ph: {k: statistics.median(x[k] for x in v) for k in v[0]} for ph, v in rows[d].items()} for d in rows}
    for ph in ("chains", "continuations"):
        a, b = med["rounds"][ph], med["one_pass"][ph]
        print(f"{ph:14s} rounds {a['s']:7.1f} s ({a['tokens']:.0f} generated, {a['prefill']:.0f} prefilled) | "
              f"one pass {b['s']:7.1f} s ({b['tokens']:.0f}, {b['prefill']:.0f}) | rounds / one pass {a['s'] / b['s']:.2f}x, "
              f"per generated token {a['s'] / a['tokens'] / (b['s'] / b['tokens']):.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
