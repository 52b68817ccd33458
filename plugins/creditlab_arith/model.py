"""Model recipe ``arith_tiny``: a small Llama with a character tokenizer, warm-started on ``arith``.

``build_tiny_model(args)`` returns a local directory holding an ordinary HF checkpoint (model,
tokenizer, generation config) loadable with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``. The warm start is supervised fine-tuning on reference
solutions (prompt tokens masked out of the loss); its result is cached
under ``$CREDITLAB_CACHE/models/arith_tiny-<hash>`` (default cache ``~/.cache/creditlab``), the
hash covering the resolved arguments and :data:`RECIPE_VERSION`.

The supervised problems are ``sft_problems`` fresh problems of the task's distribution, drawn with
another seed and disjoint (by prompt) from both of the task's splits: RL then trains on problems
the warm start never saw, and held-out accuracy measures generalization, not recall. (Recipes up to
v3 fitted the task's own 2,000 train problems for 16 epochs; the model then solved its RL problems
far more often than held-out ones — 0.50 against 0.375 sampled accuracy — and RL's gains on them did
not carry over.)

Training texts: ``<s> + prompt`` (masked) followed by ``solution + </s>`` (trained), the same
token ids as the tokenizer produces for ``tokenizer(prompt)`` and
``tokenizer(solution, add_special_tokens=False)``. For SRPO's self-localization,
``localization`` x (number of supervised problems) further examples teach the ``compact``
localization prompt (:func:`creditlab_resets.localize.compact_prompt`): a supervised problem's chain
with one step made wrong, answered in the ``localization_answer`` style with that step (checked
against the task's step oracle); see :mod:`creditlab_arith.localization`. The default ``boxed``
answers teach the format but not the skill (the model localizes at chance); ``resolve`` answers,
used by the ``tiny_localize`` model preset, teach it (docs/methods/srpo.md).

Shipped warm starts: the recipe's result differs by CPU, so the warm starts that documented
results and the demo start from ship with creditlab as fixed bytes (:mod:`creditlab_arith.shipped`)
and are loaded, hash-checked, whenever the resolved arguments name one; ``shipped: false`` rebuilds
from the recipe instead.

``stop_at_pass1`` ends the warm start early, at the first check where greedy pass@1 on
``validation_problems`` further fresh problems (disjoint from the supervised ones and from both
splits) reaches it. The ``tiny`` preset sets 0.5: the 1,000-step warm start sits on the steep part
of its learning curve (held-out greedy pass@1 0.55 -> 0.68 -> 0.77 over its last 200 steps for
seed 0 on one machine), so where it ends depends on float rounding and seed (0.55 to 0.82 over
recipe seeds 0-2 and AVX2 kernels), and RL within the demo's budget only closes the gap to the
warm start's pass@4 (+0.01 from 0.82, +0.07 from 0.55). Stopping at a set accuracy puts every
machine's warm start at about the same place with room above it (docs/reproducing.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from creditlab_arith import shipped
from creditlab_arith.answer import check
from creditlab_arith.localization import ANSWERS, localization_example
from creditlab_arith.sft_loop import warm_start
from creditlab_arith.task import ArithTask
from creditlab_arith.tokenizer import build_char_tokenizer

#: Bump when the recipe changes in a way that changes the produced weights.
RECIPE_VERSION = 4
#: Written last inside a finished checkpoint; its presence marks the directory as complete.
MARKER = "creditlab_recipe.json"

#: Recipe arguments and their defaults (``task`` holds ArithTask.Config overrides).
DEFAULTS: dict[str, Any] = {
    "task": {},
    "layers": 4,
    "hidden_size": 128,
    "heads": 4,
    "intermediate_size": 512,
    "steps": 1000,
    "batch_size": 32,
    "lr": 1.5e-3,
    "warmup_steps": 30,
    "weight_decay": 0.01,
    "seed": 0,
    "threads": 2,
    "localization": 0.25,
    "localization_weight": 1.0,
    "localization_answer": "boxed",
    "sft_problems": 24000,
    "stop_at_pass1": None,
    "validation_problems": 256,
    "validate_every": 25,
    "shipped": True,
}
#: Arguments added after recipe v4 that leave the checkpoint's identity alone at these values.
_IDENTITY_DEFAULTS = ("localization_weight", "localization_answer", "stop_at_pass1")
#: Arguments that matter only when ``stop_at_pass1`` is set.
_STOP_ARGS = ("validation_problems", "validate_every")


def cache_root() -> Path:
    """``$CREDITLAB_CACHE`` or ``~/.cache/creditlab``."""
    return Path(os.environ.get("CREDITLAB_CACHE") or Path.home() / ".cache" / "creditlab")


def merge_args(recipe: str, defaults: Mapping[str, Any], args: Mapping[str, Any] | None, hint: str = "") -> dict[str, Any]:
    """``args`` merged over a recipe's ``defaults``.

    Raises:
        ValueError: A key ``defaults`` lacks, named with the valid ones (and ``hint``).
    """
    args = dict(args or {})
    unknown = sorted(set(args) - set(defaults))
    if unknown:
        raise ValueError(f"unknown {recipe} argument(s) {unknown}; valid: {', '.join(sorted(defaults))}{hint}")
    return {**defaults, **args}


#: Task options added after recipes' cache keys were first written, with their defaults: left out
#: of a resolved task config at their default, so that existing cached checkpoints keep their keys.
_LATER_TASK_FIELDS = {"render": "symbolic", "free_words": 0, "trap": 0.0, "trap_at": 0, "traps": 1}


def check_task_and_stop(recipe: str, out: dict[str, Any]) -> None:
    """Resolve ``out["task"]`` (ArithTask.Config overrides) to a full task config in place, and
    check ``out["stop_at_pass1"]`` (null or in (0, 1]); ValueError naming the recipe otherwise."""
    fields = {f.name for f in dataclasses.fields(ArithTask.Config)}
    task = dict(out["task"] or {})
    bad = sorted(set(task) - fields)
    if bad:
        raise ValueError(f"unknown task option(s) {bad} for {recipe}; valid: {sorted(fields)}")
    out["task"] = dataclasses.asdict(ArithTask.Config(**task))
    for key, default in _LATER_TASK_FIELDS.items():  # keep the cache keys built before they existed
        if out["task"][key] == default:
            del out["task"][key]
    stop = out["stop_at_pass1"]
    if stop is not None and not (isinstance(stop, (int, float)) and 0 < stop <= 1):
        raise ValueError(f"{recipe}: stop_at_pass1 must be null or in (0, 1], got {stop!r}")


def resolve_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge ``args`` over :data:`DEFAULTS`, validating keys and the task overrides.

    Raises:
        ValueError: On an unknown key (recipe or task).
    """
    out = merge_args("arith_tiny", DEFAULTS, args, " (task options go under 'task')")
    check_task_and_stop("arith_tiny", out)
    for key in _STOP_ARGS:
        if not (isinstance(out[key], int) and out[key] > 0):
            raise ValueError(f"arith_tiny: {key} must be a positive integer, got {out[key]!r}")
    if not isinstance(out["shipped"], bool):
        raise ValueError(f"arith_tiny: shipped must be true or false, got {out['shipped']!r}")
    if out["localization_answer"] not in ANSWERS:
        raise ValueError(
            f"arith_tiny: localization_answer must be one of {list(ANSWERS)}, got {out['localization_answer']!r}"
        )
    return out


def checkpoint_dir(args: Mapping[str, Any] | None = None) -> Path:
    """Where the checkpoint for ``args`` lives (whether or not it exists yet)."""
    resolved = resolve_args(args)
    resolved.pop("threads")  # speed only (and float rounding): not part of the identity
    resolved.pop("shipped")  # where the bytes come from, not what they are
    for key in _IDENTITY_DEFAULTS:  # added later: their defaults keep existing caches valid
        if resolved[key] == DEFAULTS[key]:
            resolved.pop(key)
    if resolved.get("stop_at_pass1") is None:
        for key in _STOP_ARGS:
            resolved.pop(key)
    blob = json.dumps({"recipe": RECIPE_VERSION, "args": resolved}, sort_keys=True)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return cache_root() / "models" / f"arith_tiny-{digest}"


def build_tiny_model(args: Mapping[str, Any] | None = None) -> str:
    """Build (or reuse from the cache) the warm-started tiny model; return its directory.

    Args:
        args: Optional overrides of :data:`DEFAULTS`: ``task`` (ArithTask.Config fields),
            ``layers``, ``hidden_size``, ``heads``, ``intermediate_size``, ``steps`` (warm-start
            optimizer steps), ``batch_size``, ``lr``, ``warmup_steps``, ``weight_decay``,
            ``seed``, ``threads`` (torch CPU threads while training), ``localization`` (share of
            localization examples), ``localization_weight`` (loss weight of a localization
            example's answer tokens against a solution token's 1), ``localization_answer``
            (``boxed``: `` \\boxed{k}`` alone; ``worked``: the steps re-done and checked up to
            the first wrong one; ``resolve``: the problem re-solved, every step checked; see
            :mod:`creditlab_arith.localization`), ``sft_problems`` (supervised
            problems, see the module doc), ``stop_at_pass1`` (stop once greedy pass@1 on
            ``validation_problems`` held-out problems, checked every ``validate_every`` steps,
            reaches it; ``None``: train all ``steps``), ``shipped`` (default true: when these
            arguments name a warm start that ships with creditlab, :mod:`creditlab_arith.shipped`,
            load those verified bytes instead of building; false rebuilds it here, which gives
            other weights on another CPU).

    Returns:
        The checkpoint directory, as a string.
    """
    resolved = resolve_args(args)
    final = checkpoint_dir(resolved)
    if resolved["shipped"] and (folder := shipped.load(final.name)) is not None:
        return str(folder)
    return build_cached(final, lambda tmp: _train(resolved, tmp))


def build_cached(final: Path, build: Callable[[Path], dict[str, Any]]) -> str:
    """``final`` as a finished checkpoint directory, built by ``build`` unless it is already one.

    ``build(tmp)`` writes the checkpoint into a fresh directory beside ``final`` and returns what
    goes into its :data:`MARKER` file (written last); the directory is then renamed to ``final``.
    An interrupted build leaves no ``final``; of two processes building at once, one copy wins.

    Returns:
        ``final``, as a string.
    """
    if (final / MARKER).is_file():
        return str(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        info = build(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True))
        if final.exists():  # an incomplete leftover, or another process won the race
            if (final / MARKER).is_file():
                shutil.rmtree(tmp, ignore_errors=True)
                return str(final)
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:  # another process renamed its copy in between: use that one
            if not (final / MARKER).is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(final)


def sft_problems(task: ArithTask, n: int) -> list[Any]:
    """``n`` problems of ``task``'s distribution (another generation seed) whose prompts are in
    neither of ``task``'s splits."""
    taken = {p.prompt for split in ("train", "test") for p in task.load(split)}
    extra = len(taken) + 100  # room for draws that repeat a prompt of the task's splits
    fresh = ArithTask(dataclasses.replace(task.config, seed=task.config.seed + 1_000_003, num_train=n + extra, num_test=0))
    try:
        out = [p for p in fresh.load("train") if p.prompt not in taken][:n]
    except ValueError as exc:  # the distribution holds too few distinct problems
        raise ValueError(f"arith_tiny: cannot draw {n} supervised problems ({exc}); lower sft_problems") from exc
    if len(out) < n:
        raise ValueError(f"arith_tiny: could draw only {len(out)} of {n} supervised problems; lower sft_problems")
    return out


def _examples(
    task: ArithTask, tokenizer: Any, localization: float, seed: int, problems: list[Any],
    localization_weight: float = 1.0, localization_answer: str = "boxed",
) -> list[tuple[list[int], int, float]]:
    """(token ids, number of masked prompt tokens, loss weight of the target tokens): one solution
    per supervised problem (``problems``, from :func:`sft_problems`; weight 1), then
    ``localization`` x as many localization examples (weight ``localization_weight``)."""
    from creditlab_resets.localize import compact_prompt

    def example(prompt_text: str, target_text: str, weight: float = 1.0) -> tuple[list[int], int, float]:
        prompt = tokenizer(prompt_text)["input_ids"]
        target = tokenizer(target_text, add_special_tokens=False)["input_ids"]
        return prompt + target + [tokenizer.eos_token_id], len(prompt), weight

    out = [example(p.prompt, p.metadata["solution"]) for p in problems]
    rng = random.Random(f"arith-localization-{seed}")
    c = task.config
    for i in range(int(round(localization * len(problems)))):
        p = problems[i % len(problems)]
        thoughts, answer = localization_example(p, rng, localization_answer, c.max_operand, c.numbered, c.delimiter)
        out.append(example(compact_prompt(p.prompt, thoughts), answer, localization_weight))
    return out


def tiny_config(args: Mapping[str, Any], tokenizer: Any) -> Any:
    """The ``LlamaConfig`` of the model for resolved recipe ``args`` (also read, without building
    anything, by :mod:`creditlab_arith.shape`)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args["hidden_size"],
        intermediate_size=args["intermediate_size"],
        num_hidden_layers=args["layers"],
        num_attention_heads=args["heads"],
        num_key_value_heads=args["heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _train(args: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Build tokenizer and model, warm-start them, save both into ``out_dir``."""
    from transformers import GenerationConfig, LlamaForCausalLM

    task = ArithTask(ArithTask.Config(**args["task"]))
    tokenizer = build_char_tokenizer(task.config.delimiter)
    config = tiny_config(args, tokenizer)
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(args["threads"]))
    try:
        torch.manual_seed(args["seed"])
        model = LlamaForCausalLM(config)
        n_sft = int(args["sft_problems"])
        n_val = int(args["validation_problems"]) if args["stop_at_pass1"] is not None else 0
        problems = sft_problems(task, n_sft + n_val)  # the first n_sft do not depend on n_val
        data = _examples(
            task, tokenizer, float(args["localization"]), int(args["seed"]), problems[:n_sft],
            float(args["localization_weight"]), str(args["localization_answer"]),
        )
        held_out = problems[n_sft:]
        # The greedy budget fits the longest gold solution (8 numbered steps with free words run
        # past 96 tokens); 96 at least, which every 2-5-step default solution fits (same stops).
        budget = max([96] + [len(tokenizer(p.metadata["solution"], add_special_tokens=False).input_ids) + 8
                             for p in held_out])
        validate = (lambda: greedy_pass1(model, tokenizer, held_out, budget)) if n_val else None
        loss = warm_start(model, data, tokenizer.pad_token_id, args, validate)
    finally:
        torch.set_num_threads(old_threads)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    return {"recipe": "arith_tiny", "version": RECIPE_VERSION, "args": args,
            "parameters": n_params, **loss}


@torch.no_grad()
def greedy_pass1(
    model: Any, tokenizer: Any, problems: list[Any], max_new_tokens: int = 96,
    encode: Callable[[str], list[int]] | None = None, batch_size: int = 256,
) -> float:
    """Greedy pass@1 of ``model`` on ``problems`` (``model.generate`` on left-padded batches of
    ``batch_size`` prompts, each answer checked as the ``arith`` verifier checks it). ``encode``
    turns a prompt into ids (default: the tokenizer with its special tokens; a chat model passes
    its chat-template encoding). The model's training mode and the tokenizer's padding side are
    restored afterwards."""
    training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    correct = 0
    try:
        for i in range(0, len(problems), batch_size):
            batch = problems[i : i + batch_size]
            if encode is None:
                enc = tokenizer([p.prompt for p in batch], return_tensors="pt", padding=True)
            else:
                enc = tokenizer.pad({"input_ids": [list(encode(p.prompt)) for p in batch]}, return_tensors="pt")
            out = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(check(p.answer, t)["outcome"] == "correct" for p, t in zip(batch, texts))
    finally:
        model.train(training)
        tokenizer.padding_side = side
    return correct / max(1, len(problems))

