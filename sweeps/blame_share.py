"""Where a uniform negative advantage actually pushes: the share of GRPO's gradient on a failed
chain's first wrong step, before any RL (docs/methods/horizon.md).

    python sweeps/blame_share.py ~/.cache/creditlab/models/arith_tiny-<hash>

GRPO gives every token of a failed chain the same negative advantage A, so its *advantage* mass
is spread in proportion to thought length (``train/credit/neg_mass_*``). The gradient it sends
into the logits at token t is ``A * (onehot(y_t) - softmax_t)``, whose norm
``g_t = sqrt((1 - p_t)^2 + sum_{j != y_t} p_j^2)`` vanishes where the policy is sure of the token
it sampled. This script samples chains at temperature 1 on held-out problems (as the rollouts
do), and for each failed chain with a step oracle splits ``sum_t g_t`` into the shares on the
thoughts before the first wrong one, on it, and after it, next to the share of tokens. When the
policy is confident on its right steps and its slips are unlikely tokens, the uniform advantage
already lands on the slip, and the oracle reset's exact credit has little left to add.

On a trap preset (``task.trap``, docs/methods/positive_control.md) score the RL task, not the warm
start's own mix: ``--task trap=1``. It then also reports where chains of trap problems fail: how
often the first wrong step is the trap, and the accuracy at the trap and at each step before it,
each given a right prefix. With several traps per problem (``task.traps``, issue 38's regime
``experiment=credit_multi``) it gives the accuracy at each trap in order, and the share of GRPO's
push that lands on *right trap steps* before the first wrong one: blame on right but uncertain,
outcome-relevant steps, which a credit oracle spares and GRPO pushes toward a wrong quotient.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from pathlib import Path

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from creditlab.step.generation import merge_eos_tail, span_texts, thought_spans
from creditlab.step.policy import encode_prompt
from creditlab_arith.task import ArithTask


def shares(weights: list[float], spans: tuple[tuple[int, int], ...], k: int) -> tuple[float, float, float]:
    """Shares of ``sum(weights)`` on the spans before ``k``, on span ``k`` and after it."""
    per = [sum(weights[a:b]) for a, b in spans]
    total = sum(per) or 1.0
    return sum(per[:k]) / total, per[k] / total, sum(per[k + 1 :]) / total


#: A thought's label ("3:") and the free words after it (task.free_words): letters and spaces.
_FREE = re.compile(r"\s*(?:\d+:)?([a-z ]*)")


def free_word_mask(pieces: list[str], spans: tuple[tuple[int, int], ...]) -> list[bool]:
    """Which response tokens belong to a thought's opening free words (``task.free_words``).

    Args:
        pieces: the response's tokens as text, one string per token.
        spans: the thoughts' token spans.

    Returns:
        One flag per token: True inside the run of letters and spaces that opens a thought after
        its optional ``k:`` label, the words that never change an outcome.
    """
    mask = [False] * len(pieces)
    for a, b in spans:
        lo, hi = _FREE.match("".join(pieces[a:b])).span(1)
        lengths = [len(p) for p in pieces[a:b]]
        for j, end in enumerate(itertools.accumulate(lengths)):
            mask[a + j] = lengths[j] > 0 and lo <= end - lengths[j] and end <= hi
    return mask


def task_overrides(pairs: list[str]) -> dict:
    """``["trap=1", ...]`` as task options (values read as YAML); a clear error on a malformed pair."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--task takes KEY=VALUE (e.g. --task trap=1), got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def trap_steps(problem) -> tuple[int, ...]:
    """0-based indices of ``problem``'s trap steps (its exact divisions, ``task.trap``/``traps``)."""
    return tuple(i for i, (op, *_) in enumerate(problem.metadata["steps"]) if op == "/")


def trap_step(problem) -> int | None:
    """0-based index of ``problem``'s first trap step, or None."""
    return next(iter(trap_steps(problem)), None)


def traps_report(rows: list[tuple[int | None, tuple[int, ...]]]) -> str:
    """Where chains of problems with several traps (``task.traps``) fail, from ``(first wrong
    thought or None, trap steps)`` per chain: the accuracy at each trap in order and at the other
    steps, each given a right prefix (as :func:`trap_report`), and how often the first wrong step
    is a trap."""
    rows = [(k, t) for k, t in rows if t]
    failed = [(k, t) for k, t in rows if k is not None]
    reached = lambda k, j: k is None or k >= j  # noqa: E731
    passed = lambda k, j: k is None or k > j  # noqa: E731
    width = max(len(t) for _, t in rows)
    per_trap = []
    for i in range(width):
        hits = [passed(k, t[i]) for k, t in rows if i < len(t) and reached(k, t[i])]
        per_trap.append(f"{sum(hits) / max(len(hits), 1):.3f} of {len(hits)}")
    other = [passed(k, j) for k, t in rows for j in range(max(t) + 1) if j not in t and reached(k, j)]
    # A chain right through trap i that fails later: GRPO blames that right choice, a step oracle
    # does not. Its share q_i (1 - p_i) is how much faster oracle credit pushes right over wrong at
    # trap i than GRPO does, in expectation at the success rate r: (p_i (1 - r) + r) / p_i = 1 + q_i (1 - p_i),
    # q_i = P(right through trap i), p_i = P(success | right through trap i) (decomposition.md).
    blamed = []
    for i in range(width):
        with_i = [(k, t) for k, t in rows if i < len(t)]
        blamed.append(f"{sum(k is not None and passed(k, t[i]) for k, t in with_i) / max(len(with_i), 1):.3f}")
    return (f"trap problems: {len(rows)} chains, {len(failed)} failed; first wrong step is a trap in "
            f"{sum(k in t for k, t in failed) / max(len(failed), 1):.3f} of failed chains; right at trap 1, 2, ... "
            f"(given a right prefix): {', '.join(per_trap)}; at the other steps up to the last trap "
            f"{sum(other) / max(len(other), 1):.3f}; right through trap 1, 2, ... and failed later (oracle "
            f"credit's extra push there, relative to GRPO's): {', '.join(blamed)}")


def trap_report(firsts: list[tuple[int | None, int | None]]) -> str:
    """Where chains of trap problems fail, from ``(first wrong thought or None, trap step)``.

    Per-step accuracies are conditional on a right prefix: a step is *reached* when every
    thought before it is right, and passed when it is right too (``None``: the chain is correct).
    """
    rows = [(k, t) for k, t in firsts if t is not None]
    failed = [(k, t) for k, t in rows if k is not None]

    def reached_passed(k: int | None, j: int) -> tuple[bool, bool]:
        return k is None or k >= j, k is None or k > j

    reached_trap = [reached_passed(k, t) for k, t in rows if reached_passed(k, t)[0]]
    passed_trap = sum(p for _, p in reached_trap)
    before = [reached_passed(k, j) for k, t in rows for j in range(t) if reached_passed(k, j)[0]]
    reached, passed = len(before), sum(p for _, p in before)
    return (f"trap problems: {len(rows)} chains, {len(failed)} failed; first wrong step is the trap in "
            f"{sum(k == t for k, t in failed) / max(len(failed), 1):.3f} of failed chains; right at the trap "
            f"{passed_trap / max(len(reached_trap), 1):.3f} of {len(reached_trap)} reached, at each step before it "
            f"{passed / max(reached, 1):.3f}")


def logit_gradient_norms(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Norm of ``d log p(y_t) / d logits_t = onehot(y_t) - softmax_t`` per token.

    Args:
        probs: (n, vocab) next-token distributions.
        tokens: (n,) the tokens taken.

    Returns:
        (n,) ``sqrt((1 - p_t)^2 + sum_{j != y_t} p_j^2)``: 0 for a certain token, up to sqrt(2).
    """
    return (torch.nn.functional.one_hot(tokens, probs.shape[-1]).to(probs.dtype) - probs).norm(dim=-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a warm-started arith checkpoint directory (arith_tiny or smollm2_135m_sft)")
    p.add_argument("--problems", type=int, default=300, help="held-out problems (default 300)")
    p.add_argument("--samples", type=int, default=2, help="chains sampled per problem (default 2)")
    p.add_argument("--max-new-tokens", type=int, default=160, help="solution budget (default 160)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--task", action="append", default=[], metavar="KEY=VALUE",
                   help="override the warm start's task option, e.g. --task trap=1 (the RL task of a trap preset)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    recipe = json.loads((Path(args.model) / "creditlab_recipe.json").read_text())
    task = ArithTask(ArithTask.Config(**{**recipe["args"]["task"], **task_overrides(args.task)}))
    delimiter = tok.encode(task.config.delimiter, add_special_tokens=False)
    problems = task.load("test")[: args.problems] * args.samples

    sums = {"tokens": [0.0, 0.0, 0.0], "gradient": [0.0, 0.0, 0.0]}
    firsts: list[tuple[int | None, tuple[int, ...]]] = []  # (first wrong thought, trap steps) per chain
    free_before = {"tokens": 0.0, "gradient": 0.0}  # the part of "before" on free words
    on_right_traps = {"tokens": 0.0, "gradient": 0.0}  # the part of "before" on right trap steps
    failed = chains = 0
    for i in range(0, len(problems), 64):
        batch = problems[i : i + 64]
        # As rollouts encode them (rollout.chat_template=auto: the chat template where there is one).
        enc = tok.pad({"input_ids": [list(encode_prompt(tok, pr.prompt)) for pr in batch]},
                      return_tensors="pt", padding_side="left")
        with torch.no_grad():
            ids = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=True,
                                 temperature=1.0, pad_token_id=tok.pad_token_id)
            mask = (ids != tok.pad_token_id).long()
            mask[:, : enc["input_ids"].shape[1]] = enc["attention_mask"]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            probs = logits[:, :-1].float().softmax(-1)
        start = enc["input_ids"].shape[1]
        for row, pr in enumerate(batch):
            chains += 1
            response = ids[row, start:].tolist()
            n = len(response) - response.count(tok.pad_token_id)
            response = response[:n]
            spans = merge_eos_tail(thought_spans(response, delimiter), response, tok.eos_token_id)
            k = pr.oracle(span_texts(tok, response, spans)) if spans else None
            firsts.append((k if spans else 0, trap_steps(pr)))
            if k is None:
                continue
            failed += 1
            k = min(k, len(spans) - 1)
            p_rows = probs[row, start - 1 : start - 1 + n]  # (n, vocab): the distribution of each response token
            g = logit_gradient_norms(p_rows, torch.tensor(response)).tolist()  # per unit advantage
            free = free_word_mask([tok.decode([t]) for t in response], spans)
            for key, weights in (("tokens", [1.0] * n), ("gradient", g)):
                for j, share in enumerate(shares(weights, spans, k)):
                    sums[key][j] += share
                before_free = sum(w for w, f in zip(weights[: spans[k][0]], free) if f)
                free_before[key] += before_free / (sum(weights) or 1.0)  # the spans partition the response
                right_traps = sum(sum(weights[a:b]) for j, (a, b) in enumerate(spans[:k]) if j in trap_steps(pr))
                on_right_traps[key] += right_traps / (sum(weights) or 1.0)
    print(f"{failed} failed of {chains} sampled chains (T = 1), {task.config.min_steps}-{task.config.max_steps} steps")
    for key, label in (("tokens", "share of tokens (GRPO's advantage mass)"), ("gradient", "share of GRPO's logit gradient")):
        before, at, after = (s / max(failed, 1) for s in sums[key])
        print(f"{label:42s} before {before:.3f}   first wrong step {at:.3f}   after {after:.3f}"
              f"   (before, on free words {free_before[key] / max(failed, 1):.3f}, "
              f"on right trap steps {on_right_traps[key] / max(failed, 1):.3f})")
    if any(len(t) > 1 for _, t in firsts):
        print(traps_report(firsts))
    elif any(t for _, t in firsts):
        print(trap_report([(k, t[0] if t else None) for k, t in firsts]))


if __name__ == "__main__":
    main()
