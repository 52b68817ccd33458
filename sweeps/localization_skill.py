"""How well a warm-started arith model solves and localizes the first wrong step (SRPO's
self-localization), before any RL.

    python sweeps/localization_skill.py ~/.cache/creditlab/models/arith_tiny-<hash>

Asks the model, greedily and with the ``compact`` localization prompt, for the first wrong step of
(1) synthetic corruptions of held-out problems (the warm start's own training distribution: one
step made wrong, later steps consistent) and (2) its own failed chains (sampled at temperature 1,
judged by the task's step oracle). Prints the exact-hit rate of each next to uniform random
(the mean of 1/n over the chains: what RRPO's random reset scores). Results: docs/methods/srpo.md.

It first prints the solver's held-out greedy pass@1 and how its greedy failures break: the number
of wrong steps per failed chain, a step counted wrong when it is not the problem's operation
applied to the chain's own previous result (so one slip followed by correct steps from the wrong
value is one wrong step) — the regime where a reset at the first error should matter
(docs/methods/horizon.md). The task is the one the model was warm-started on (its
``creditlab_recipe.json``).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from creditlab_arith.localization import corrupted_thoughts
from creditlab_arith.task import ArithTask, apply_op, parse_step, split_thoughts
from creditlab_resets.localize import compact_prompt, parse_localization


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a warm-started arith_tiny checkpoint directory")
    p.add_argument("--problems", type=int, default=300, help="held-out problems (default 300)")
    p.add_argument("--samples", type=int, default=2, help="own chains sampled per problem (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="localization answer budget")
    p.add_argument("--horizon", type=int, default=0, help="score problems of exactly this many steps (default: the warm start's task)")
    p.add_argument("--solve-tokens", type=int, default=64, help="solution budget (default 64)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    recipe = json.loads((Path(args.model) / "creditlab_recipe.json").read_text())
    task_args = dict(recipe["args"]["task"])
    if args.horizon:  # problems of exactly this many steps (a model warm-started on a range of them)
        task_args.update(min_steps=args.horizon, max_steps=args.horizon)
    task = ArithTask(ArithTask.Config(**task_args))
    problems = task.load("test")[: args.problems]
    rng = random.Random(0)

    def generate(prompts: list[str], max_new: int, temperature: float = 0.0) -> list[str]:
        out = []
        for i in range(0, len(prompts), 64):
            enc = tok(prompts[i : i + 64], return_tensors="pt", padding=True, padding_side="left")
            with torch.no_grad():
                ids = model.generate(**enc, max_new_tokens=max_new, do_sample=temperature > 0,
                                     temperature=temperature or None, pad_token_id=tok.pad_token_id)
            out += tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        return out

    def report(name: str, chains: list[tuple[object, int, list[str]]]) -> None:
        answers = generate([compact_prompt(pr.prompt, th) for pr, _, th in chains], args.max_new_tokens)
        hits = [parse_localization(a, len(th))[0] - 1 == k for (_, k, th), a in zip(chains, answers)]
        uniform = sum(1 / len(th) for _, _, th in chains) / len(chains)
        print(f"{name:28s} exact {sum(hits) / len(hits):.3f}   uniform random {uniform:.3f}   chains {len(chains)}")

    solutions = generate([pr.prompt for pr in problems], args.solve_tokens)
    wrong = collections.Counter(
        _wrong_steps(pr, split_thoughts(text, task.config.delimiter)) for pr, text in zip(problems, solutions)
        if pr.oracle(split_thoughts(text, task.config.delimiter)) is not None
    )
    failed = sum(wrong.values())
    print(f"held-out greedy pass@1 {1 - failed / len(problems):.3f} ({len(problems)} problems, "
          f"{task.config.min_steps}-{task.config.max_steps} steps); failed chains by wrong steps: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(wrong.items()))
          + (f"; one wrong step {wrong[1] / failed:.2f}" if failed else ""))

    synthetic = []
    for pr in problems:
        k = rng.randrange(len(pr.metadata["steps"]))
        synthetic.append((pr, k, corrupted_thoughts(pr, k, rng, task.config.max_operand, task.config.numbered)))
    report("synthetic corruptions", synthetic)

    own = []
    sampled = generate([pr.prompt for pr in problems] * args.samples, args.solve_tokens, temperature=1.0)
    for pr, text in zip(problems * args.samples, sampled):
        thoughts = split_thoughts(text, task.config.delimiter)
        k = pr.oracle(thoughts) if thoughts else None
        if k is not None:
            own.append((pr, k, thoughts))
    report("own failures (T = 1)", own)


def _wrong_steps(problem: object, thoughts: list[str]) -> int:
    """Operation thoughts that are not the problem's operation applied to the chain's own previous
    result (missing or malformed ones count; a wrong final answer with every step right counts 0)."""
    value, wrong = problem.metadata["start"], 0
    for i, (op, b, _) in enumerate(problem.metadata["steps"]):
        step = parse_step(thoughts[i].strip()) if i < len(thoughts) else None
        if step is None or step[1:4] != (value, op, b) or step[4] != apply_op(value, op, b):
            wrong += 1
        value = step[4] if step is not None else apply_op(value, op, b)
    return wrong


if __name__ == "__main__":
    main()
