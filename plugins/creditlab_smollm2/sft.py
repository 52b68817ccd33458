"""Model recipe ``smollm2_135m_sft``: SmolLM2-135M-Instruct (recipe ``smollm2_135m``) after a short
supervised warm start on a creditlab task, cached: the SFT -> RL pipeline of the field at laptop
scale (docs/real-model.md).

Out of the box the model does not answer in a task's format (on ``arith`` prompts it writes prose
about "telescoping series"; greedy pass@1 0). A few dozen steps of supervised fine-tuning on
reference solutions teach the format, and the model's own arithmetic does the rest; the warm start
stops at the first check where greedy pass@1 on ``validation_problems`` held-out problems reaches
``stop_at_pass1`` (default 0.3: inside the learnable band 0.2-0.6 on every machine, whatever the
float rounding; see ``creditlab_arith.model`` for why a set accuracy rather than a set number of
steps).

Training texts are the prompt as rollouts encode it (``chat_template``: the chat template's user
turn and generation prompt, as ``rollout.chat_template=auto`` does; masked out of the loss)
followed by the reference solution and the end-of-turn token ``<|im_end|>`` (the model's eos and
pad token). A further ``localization`` x (number of supervised problems) examples teach the answer
format of SRPO's self-localization prompt (``localization_template``, by default ``paper``, the one
the ``smollm2_135m`` presets use): a supervised problem's chain with one step made wrong
(``creditlab_arith.localization``), answered ``Step k is the first wrong step.`` and ``\\boxed{k}``.
Without them the warm-started model answers every prompt, the localization request included, with
an arith chain (the parser then falls back to step 1 every time), and the untrained instruct model
answers in prose ("The last step is incorrect."). They teach the format, not the skill: whether the
model then finds its errors is measured (``train/rollout/reset/oracle_exact``, credit-bench). The
supervised and validation problems are fresh draws of the task's distribution,
disjoint from both of its splits (``creditlab_arith.model.sft_problems``). Full fine-tuning in fp32
(AdamW, linear warmup then cosine decay over ``steps``), every weight trained.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from creditlab_arith.localization import localization_example
from creditlab_arith.model import (
    build_cached, cache_root, check_task_and_stop, greedy_pass1, merge_args, sft_problems,
)
from creditlab_arith.sft_loop import warm_start
from creditlab_arith.task import ArithTask
from creditlab_smollm2 import convert

#: Bump when the recipe changes in a way that changes the produced weights.
RECIPE_VERSION = 2
#: Recipe arguments and their defaults (``task`` holds ArithTask.Config overrides; ``base`` the
#: arguments of recipe ``smollm2_135m``).
DEFAULTS: dict[str, Any] = {
    "base": {},
    "task": {},
    "chat_template": True,
    "steps": 200,
    "batch_size": 16,
    "lr": 5e-5,
    "warmup_steps": 10,
    "weight_decay": 0.0,
    "seed": 0,
    "threads": 2,
    "sft_problems": 4000,
    "stop_at_pass1": 0.3,
    "validation_problems": 128,
    "validate_every": 5,
    "max_new_tokens": 96,
    "localization": 0.25,
    "localization_template": "paper",
}


def resolve_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge ``args`` over :data:`DEFAULTS`, validating them (ValueError naming the bad key)."""
    out = merge_args("smollm2_135m_sft", DEFAULTS, args)
    check_task_and_stop("smollm2_135m_sft", out)
    out["base"] = convert.resolve_args(out["base"])
    for key in ("steps", "batch_size", "sft_problems", "validation_problems", "validate_every", "max_new_tokens"):
        if isinstance(out[key], bool) or not (isinstance(out[key], int) and out[key] > 0):
            raise ValueError(f"smollm2_135m_sft: {key} must be a positive integer, got {out[key]!r}")
    if not (isinstance(out["localization"], (int, float)) and 0 <= out["localization"] <= 4):
        raise ValueError(f"smollm2_135m_sft: localization must be a share in [0, 4], got {out['localization']!r}")
    from creditlab_resets.localize import TEMPLATES

    if out["localization_template"] not in TEMPLATES:
        raise ValueError(f"smollm2_135m_sft: localization_template must be one of {sorted(TEMPLATES)} "
                         f"(as reset_selector.template), got {out['localization_template']!r}")
    if not isinstance(out["chat_template"], bool):
        raise ValueError(f"smollm2_135m_sft: chat_template must be true or false (as rollout.chat_template), "
                         f"got {out['chat_template']!r}")
    return out


def checkpoint_dir(args: Mapping[str, Any] | None = None) -> Path:
    """Where the warm-started checkpoint for ``args`` lives: the hash covers this recipe's version
    and arguments (``threads`` aside) and the converted base checkpoint's own directory name."""
    resolved = resolve_args(args)
    resolved.pop("threads")  # speed only
    base = convert.checkpoint_dir(resolved.pop("base")).name
    blob = json.dumps({"recipe": RECIPE_VERSION, "base": base, "args": resolved}, sort_keys=True)
    return cache_root() / "models" / f"smollm2_135m_sft-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def build_smollm2_sft(args: Mapping[str, Any] | None = None) -> str:
    """Warm-start (or reuse from the cache) SmolLM2-135M-Instruct on ``arith``; return its directory.

    Args:
        args: Overrides of :data:`DEFAULTS`: ``base`` (recipe ``smollm2_135m``'s arguments),
            ``task`` (ArithTask.Config fields), ``chat_template`` (encode prompts as
            ``rollout.chat_template=true`` does, or as plain text), ``steps`` (at most), ``batch_size``,
            ``lr``, ``warmup_steps``, ``weight_decay``, ``seed``, ``threads``, ``sft_problems``,
            ``stop_at_pass1`` (null: all ``steps``), ``validation_problems``, ``validate_every``,
            ``max_new_tokens`` (of the validation's greedy answers), ``localization`` (share of
            localization examples) and ``localization_template`` (their prompt).
    """
    resolved = resolve_args(args)
    base = convert.build_smollm2(resolved["base"])
    return build_cached(checkpoint_dir(resolved), lambda tmp: _train(resolved, base, tmp))


def _train(args: dict[str, Any], base: str, out_dir: Path) -> dict[str, Any]:
    import torch
    from creditlab import encode_prompt
    from transformers import AutoModelForCausalLM, AutoTokenizer

    task = ArithTask(ArithTask.Config(**args["task"]))
    tokenizer = AutoTokenizer.from_pretrained(base)
    n_sft, n_val = args["sft_problems"], args["validation_problems"] if args["stop_at_pass1"] is not None else 0
    problems = sft_problems(task, n_sft + n_val)

    def encode(prompt: str) -> list[int]:
        return list(encode_prompt(tokenizer, prompt, args["chat_template"], "recipe_args.chat_template"))

    data = []
    for p in problems[:n_sft]:
        prompt = encode(p.prompt)
        target = tokenizer(p.metadata["solution"], add_special_tokens=False)["input_ids"]
        data.append((prompt + target + [tokenizer.eos_token_id], len(prompt), 1.0))
    data += _localization_examples(task, problems[:n_sft], args, encode, tokenizer)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(args["threads"]))
    try:
        torch.manual_seed(args["seed"])
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        validate = None
        if n_val:
            def validate() -> float:
                return greedy_pass1(model, tokenizer, problems[n_sft:], args["max_new_tokens"], encode, 64)
        info = warm_start(model, data, tokenizer.pad_token_id, args, validate, name="smollm2_135m_sft")
    finally:
        torch.set_num_threads(old_threads)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return {"recipe": "smollm2_135m_sft", "version": RECIPE_VERSION, "base": base, "args": args, **info}


def _localization_examples(
    task: ArithTask, problems: list[Any], args: dict[str, Any], encode: Any, tokenizer: Any
) -> list[tuple[list[int], int, float]]:
    """``localization`` x ``len(problems)`` examples: a chain of a supervised problem with one step
    made wrong, in the localization prompt, answered with that step (checked by the step oracle)."""
    import random

    from creditlab_resets.localize import TEMPLATES

    template, c = TEMPLATES[args["localization_template"]], task.config
    rng = random.Random(f"smollm2-localization-{args['seed']}")
    out = []
    for i in range(int(round(args["localization"] * len(problems)))):
        p = problems[i % len(problems)]
        thoughts, _ = localization_example(p, rng, "boxed", c.max_operand, c.numbered, c.delimiter)
        k = p.oracle(thoughts) + 1
        prompt = encode(template(p.prompt, thoughts, delimiter=c.delimiter))
        target = tokenizer(f"Step {k} is the first wrong step.\n\\boxed{{{k}}}", add_special_tokens=False)["input_ids"]
        out.append((prompt + target + [tokenizer.eos_token_id], len(prompt), 1.0))
    return out
