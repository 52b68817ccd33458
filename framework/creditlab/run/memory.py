"""Memory before the model loads: a configured run's peak memory per device, estimated from the
model's config alone (``creditlab train --dry-run``; docs/gpu.md, "Memory before the model loads").

The shape comes from the model's config (:mod:`creditlab.run.memory_shape`: ``config.json``, a
recipe's ``creditlab.model_recipe_config`` entry point, or a config shipped for a preset's hub
model), parameter and layer shapes from the model built on torch's ``meta`` device (no weights). ``P`` parameters, ``P_t`` trained ones (LoRA: the adapters,
``r · (in + out)`` per adapted linear), ``w`` bytes per weight, ``a`` per activation, ``n``
layers, ``H`` hidden, ``I`` MLP width, ``V`` vocabulary, ``b`` rows of one update micro-batch,
``T`` response tokens (``loss.micro_batch_tokens`` caps ``b`` at ``budget // (prompt + T)``). Bytes:

* weights ``P · w`` (+ adapters ``P_t · w_a``: peft keeps them in fp32 unless ``*-true`` half
  precision); a KL reference (``loss.kl_coef > 0``) is a second copy.
* gradients ``P_t · w_t``; optimizer ``k · P_t · w_t`` (Adam/AdamW ``k = 2``: torch keeps both
  moments in the parameter's dtype; SGD 1 with momentum, else 0). DDP adds buckets ``P_t · w_t``;
  FSDP/DeepSpeed shard all three (not modeled: this is one unsharded rank).
* activations kept for the backward ``(u · prompt + b · T) · (n · layer + top) + (b - u) · prompt ·
  n · 2aH`` (the shared-prompt forward runs the micro-batch's ``u`` distinct prompts once, each row
  keeps its prompt's keys and values), ``layer = 2 · norm + 4aH + 4aI`` (+ LoRA: ``w_a · r`` per
  adapted linear, ``+ w_a · in`` where peft casts its input to the adapter's dtype), ``norm = 4H +
  2aH`` (RMSNorm in fp32; ``14H`` under autocast), ``top = norm + aH``: the tensors Llama/Qwen2
  layers save (transformers 5.24, sdpa; no ``L²`` scores), within 3%. Gradient checkpointing keeps
  ``n · w · H + layer`` per token instead of ``n · layer`` (each layer's input, one layer rebuilt
  at a time) and runs every row's prompt (``u = b``).
* the loss's vocabulary-sized tensors ``b · T · V · (a + 12 + 4 [logits / temperature, unless it is
  1] + 4 [fp32 copy, when a < 4])``: the logits, the log-sum-exp and gather gradients and one
  temporary of the backward (measured: 16 to 22 bytes, exactly these). With the fused head
  (``loss.fused_head``, a supported model: :mod:`creditlab.step.token_logprobs`) instead
  ``12 · min(c, b · T) · V + b · T · H · (a + 4) + 4 · V · H``: three fp32 tiles of a token chunk
  (``c`` = 512), the response's hidden states and their fp32 gradient, and the head's fp32 gradient
  accumulator when the head trains (not under LoRA).
* generation: KV cache ``2 · n · kv_heads · head_dim · w · rows · (prompt + T)``; per decoding step
  ``rows · V · (a + 16 [+ 8: sort indices for top-p / top-k])``; prefill ``rows · prompt · (4H +
  3I) · a`` (one layer at a time, no grad); the HF backend's prefix store keeps the decoded rows'
  keys/values, at most ``backend.prefix_cache_mb`` and ``rows · (prompt + T)`` tokens' worth, until
  the update (released before it). ``backend=vllm``: the engine's weight copy and
  ``backend.kv_cache_gib`` instead.
* checkpoint: Lightning serializes the trained weights and the optimizer state into memory before
  writing them, ``(1 + k) · P_t · w_t`` (host memory; frozen weights are left out).

* an advantage estimator's own tensors while it estimates, as its plug-in states them, and
  credit-bench's phases: :mod:`creditlab.run.memory_phases`.

Peak = the largest phase: update (weights, gradients, optimizer, activations, vocabulary tensors),
generation and evaluation (weights, optimizer, KV cache, decoding tensors), the estimator's
(weights, optimizer, its tensors) or checkpoint (weights, optimizer, buffer). The update's sum is
an upper bound: gradients grow while activations are freed. Not counted: the runtime (Python,
torch, a CUDA context), the data, the fused decoder's weight copies (at most
``backend.fused_copy_budget_mb``).

``loss.micro_batch_tokens=auto`` (the default) is resolved from this plan and the memory ``M``
there is (:func:`available_memory`: the CPU's RAM, the smaller of the machine's and its cgroup's
limit; a CUDA device's free memory before the model moves there): usable ``U = 0.9 · M - 2 GiB``
(the runtime, allocator slack), and a micro-batch's own tensors (activations and vocabulary
tensors) may take ``M / 8`` (``BATCH_SHARE``: more buys no speed). When the update of the whole
mini-batch fits both, auto is 0 (no budget: the very update a run without one does; the tiny
demo). Otherwise it is the largest multiple of 256 tokens, at least one longest row, for which both
hold; when not even one row fits, the smallest such budget, and the plan says what does not fit. Ranks on the CPU share its RAM: each plans for its
share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from omegaconf import DictConfig, OmegaConf

from creditlab.errors import ConfigError
from creditlab.run.config import vllm_weight_sync
from creditlab.run.memory_budget import (
    BATCH_SHARE, GIB, MARGIN_BYTES, MARGIN_FRACTION, available_memory, fit_notes, resolve_token_budget, usable,
)
from creditlab.run.memory_phases import StepDims, bench_phases, estimator_parts, segments_bound
from creditlab.run.memory_shape import Shape, load_shape, lora_linears, prompt_tokens, shape_of
from creditlab.run.models import DTYPES
from creditlab.step.fused_head import DEFAULT_TOKEN_CHUNK
from creditlab.step.token_logprobs import FUSED_MIN_VOCAB

__all__ = ["GIB", "PHASE_PARTS", "Plan", "Shape", "auto_token_budget", "available_memory", "bench_phases", "bench_plan",
           "estimate", "load_shape", "lora_linears", "plan_run", "prompt_tokens", "resolve_token_budget", "shape_of",
           "sized_plan", "usable"]

#: The components each phase holds at once (``evaluation``: those of ``generation``, for its rows;
#: ``advantage``: the estimator's own components, :mod:`creditlab.run.memory_phases`).
PHASE_PARTS = {
    "update": ("weights", "reference", "gradients", "optimizer", "autocast copies", "activations", "logits"),
    "generation": ("weights", "reference", "optimizer", "generation tensors", "kv cache", "prefix store"),
    "checkpoint": ("weights", "reference", "optimizer", "checkpoint buffer"),
}
HALF_TRUE = ("bf16-true", "16-true")
MIXED = ("bf16-mixed", "bf16", "16-mixed", "16", "transformer-engine", "transformer-engine-float16")


def precision_bytes(precision: Any, dtype: str) -> tuple[int, int, bool]:
    """``(w, a, autocast)``: bytes per weight and per activation under ``trainer.precision``, and
    whether autocast runs fp32 weights in half precision (``*-mixed``)."""
    w, p = DTYPES[dtype].itemsize, str(precision)
    if p in HALF_TRUE or p in ("64-true", "64"):
        return (8, 8, False) if p.startswith("64") else (2, 2, False)
    return (w, 2, w > 2) if p in MIXED else (w, w, False)


@dataclass
class Plan:
    """The estimate: bytes per component and phase, and what it assumed (``phase_parts``: the
    components each phase holds; ``dims``: the step's numbers the estimator formulas read)."""

    parts: dict[str, float]
    phases: dict[str, float]
    facts: dict[str, Any]
    notes: list[str]
    phase_parts: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(PHASE_PARTS))
    dims: StepDims | None = field(default=None, repr=False)

    @property
    def peak(self) -> tuple[str, float]:
        """``(phase, bytes)`` of the largest phase."""
        return max(self.phases.items(), key=lambda kv: kv[1])


def estimate(cfg: DictConfig, checked: dict[str, Any], shape: Shape, prompt: int, eval_prompt: int,
             eval_count: int, token_budget: int | None = None) -> Plan:
    """The memory plan of one rank of the run (the module docstring has every formula): ``cfg``
    composed, ``checked`` its :func:`~creditlab.run.config.validate` sections, ``prompt`` /
    ``eval_prompt`` the longest prompt's tokens (train / test split), ``eval_count`` test problems,
    ``token_budget`` the update's ``loss.micro_batch_tokens`` (None: the configured one, ``auto``
    taken as 0)."""
    run, rollout, loss, model, ev = (checked[k] for k in ("run", "rollout", "loss", "model", "eval"))
    launch = checked.get("launch")
    world = launch.world_size if launch is not None else 1
    precision = str(OmegaConf.select(cfg, "trainer.precision", default="32-true"))
    w, a, autocast = precision_bytes(precision, model.dtype)
    lora = lora_linears(shape, model.lora.target_modules) if model.lora.enabled else []
    adapters = sum(model.lora.r * (i + o) for _, i, o in lora)
    w_a = 2 if precision in HALF_TRUE else 4  # peft keeps adapters in fp32 beside half weights
    trained, w_t = (adapters, w_a) if lora else (shape.params, w)
    optim = str(OmegaConf.select(cfg, "optim._target_", default="torch.optim.AdamW")).rsplit(".", 1)[-1]
    k = {"Adam": 2, "AdamW": 2, "SGD": 1 if OmegaConf.select(cfg, "optim.momentum", default=0) else 0}.get(optim, 2)
    k += 1 if OmegaConf.select(cfg, "optim.amsgrad", default=False) else 0
    notes = [] if optim in ("Adam", "AdamW", "SGD") else [f"optimizer {optim}: state taken as AdamW's"]

    if token_budget is None:
        token_budget = 0 if loss.micro_batch_tokens == "auto" else loss.micro_batch_tokens
    rows = math.ceil(run.prompts_per_step / world) * rollout.group_size
    mini = math.ceil(rows / loss.updates_per_batch)
    b = min(loss.micro_batch_size, mini) if loss.micro_batch_size else mini
    if token_budget:  # rows of the longest prompt and response under the token budget
        b = max(1, min(b, token_budget // (prompt + rollout.response_budget)))
    T, H, I, n, V = rollout.response_budget, shape.hidden, shape.intermediate, shape.layers, shape.vocab
    norm = 14 * H if autocast else 4 * H + 2 * a * H
    layer = 2 * norm + 4 * a * H + 4 * a * I
    layer += sum(w_a * model.lora.r + (w_a * i if w_a != a else 0) for _, i, _ in lora) / n
    kept = n * w * H + layer if model.gradient_checkpointing else n * layer
    # the shared-prompt forward runs u distinct prompts once; each row keeps its prompt's keys/values
    u = b if model.gradient_checkpointing else min(b, math.ceil(run.prompts_per_step / world))
    vocab = a + 12 + (4 if rollout.temperature not in (0, 1) else 0) + (4 if a < 4 else 0)
    fused = shape.fusable_head and (loss.fused_head == "on" or (loss.fused_head == "auto" and V >= FUSED_MIN_VOCAB))
    if fused:  # three fp32 tiles of a token chunk, the chunk's hidden states and their fp32 gradient
        vocab_tensors = 12 * min(DEFAULT_TOKEN_CHUNK, b * T) * V + b * T * H * (a + 4) + (0 if lora else 4 * V * H)
    else:
        vocab_tensors = b * T * V * vocab
    ddp = launch is not None and launch.strategy == "ddp" and world > 1

    weights = shape.params * w + adapters * w_a
    parts = {
        "weights": weights,
        "reference": weights if loss.kl_coef > 0 else 0,
        "gradients": trained * w_t * (2 if ddp else 1),
        "optimizer": k * trained * w_t,
        "autocast copies": trained * 2 if autocast else 0,
        "activations": (u * prompt + b * T) * (kept + norm + a * H) + (b - u) * prompt * n * 2 * a * H,
        "logits": vocab_tensors,
    }
    backend = OmegaConf.select(cfg, "backend.name", default="hf")
    max_rows = OmegaConf.select(cfg, "backend.max_batch_size", default=256) or 256
    kv_token = 2 * n * shape.kv_heads * shape.head_dim * w
    truncates = rollout.top_p < 1 or rollout.top_k > 0

    def generation(g_rows: int, context: int, sampled: bool = truncates) -> tuple[float, float]:
        """(decoding and prefill tensors, KV cache) of ``g_rows`` rows (at most ``max_rows`` a batch)."""
        if backend == "vllm":
            return weights, float(OmegaConf.select(cfg, "backend.kv_cache_gib", default=1.0)) * GIB
        g_rows = min(g_rows, max_rows)
        decode = g_rows * V * (a + 16 + (8 if sampled else 0))
        return decode + g_rows * context * (4 * H + 3 * I) * a, g_rows * (context + T) * kv_token

    gen_rows = min(rows, max_rows)
    parts["generation tensors"], parts["kv cache"] = generation(gen_rows, prompt)
    store = float(OmegaConf.select(cfg, "backend.prefix_cache_mb", default=1024.0) or 0) * 2**20
    parts["prefix store"] = min(store, rows * (prompt + T) * kv_token) if backend == "hf" else 0
    parts["checkpoint buffer"] = (1 + k) * trained * w_t  # Lightning serializes into memory first
    sync_mode = str(OmegaConf.select(cfg, "backend.weight_sync", default="auto"))
    if backend == "vllm" and vllm_weight_sync(sync_mode, OmegaConf.select(cfg, "backend.engine_kwargs") or {}) == "file":
        parts["weight sync file"] = weights  # on tmpfs
    eval_rows = min(ev.batch_size, max_rows, (ev.problems or eval_count) * max(1, ev.samples)) if ev.every else 0
    phase_parts = dict(PHASE_PARTS)
    seg_cls, seg_config = checked["segmenter"]
    dims = StepDims(shape, rows, rollout.group_size, prompt, T, w, a, kept + norm + a * H, fused,
                    loss.micro_batch_size, segments_bound(str(OmegaConf.select(cfg, "segmenter.name", default="whole")),
                                                          seg_config, T, rollout.thoughts, rollout.max_thoughts),
                    lambda g, context: generation(g, context), tokens=token_budget)
    name = str(OmegaConf.select(cfg, "advantage.name", default="grpo"))
    own = estimator_parts(name, checked["advantage"][1], dims)
    if own is None:
        notes.append(f"advantage {name}: its own memory while it estimates is not modeled (only the batch's)")
    elif own:
        parts.update(own)
        phase_parts[f"advantage ({name})"] = ("weights", "reference", "optimizer", *own)
    on_cpu = OmegaConf.select(cfg, "trainer.accelerator", default="cpu") == "cpu"
    if "weight sync file" in parts and on_cpu:  # the snapshot's file stays in memory all run long
        phase_parts = {phase: (*names, "weight sync file") for phase, names in phase_parts.items()}
    phases = {phase: sum(parts[p] for p in names) for phase, names in phase_parts.items()}
    if not on_cpu:
        del phases["checkpoint"]  # the buffer is host memory, the rest stays on the device
        notes.append(f"a checkpoint save also fills {parts['checkpoint buffer'] / GIB:.2f} GiB of host memory")
        if "weight sync file" in parts:
            notes.append(f"backend.weight_sync=file keeps a {parts['weight sync file'] / GIB:.2f} GiB "
                         "weights file in host memory (/dev/shm)")
    if eval_rows:
        base = parts["weights"] + parts["reference"] + parts["optimizer"]
        phases["evaluation"] = base + sum(generation(eval_rows, eval_prompt, ev.samples > 0 and truncates))
    if launch is not None and launch.strategy in ("fsdp", "deepspeed"):
        notes.append(f"{launch.strategy} shards weights, gradients and optimizer state; this is one unsharded rank")
    facts = {
        "parameters": f"{shape.params:,} ({trained:,} trained)", "bytes per weight / activation": f"{w} / {a}",
        "rows per step, this rank": rows, "update micro-batch rows": b, "generation rows": gen_rows,
        "evaluation rows": eval_rows, "optimizer": f"{optim}: {k} state tensors per trained parameter",
    }
    return Plan(parts, phases, facts, notes, phase_parts, dims)


def sized_plan(cfg: DictConfig, checked: dict[str, Any], shape: Shape, prompt: int, eval_prompt: int,
               eval_count: int, memory: tuple[int, str] | None) -> tuple[Plan, int, str]:
    """``(plan, loss.micro_batch_tokens, how it was set)``: :func:`estimate` at the configured
    budget, or at ``auto``'s (:func:`resolve_token_budget`) for ``memory`` (``(bytes, what)``;
    ``None``: unknown here, planned as 0), with notes on what does not fit ``memory``."""
    loss, model, launch = checked["loss"], checked["model"], checked.get("launch")
    cpu = OmegaConf.select(cfg, "trainer.accelerator", default="cpu") == "cpu"
    if memory is not None and cpu and launch is not None and launch.devices > 1:  # ranks share the RAM
        memory = (memory[0] // launch.devices, f"{memory[1]}, shared by {launch.devices} ranks")

    def at(budget: int) -> Plan:
        return estimate(cfg, checked, shape, prompt, eval_prompt, eval_count, budget)

    if loss.micro_batch_tokens != "auto":
        budget, how = loss.micro_batch_tokens, "set"
    elif memory is None:
        budget, how = 0, ("auto, sized at run start from the device's memory (unknown here: --memory-gib M plans "
                          "for M GiB); planned as 0")
    else:
        rows = at(0).facts["rows per step, this rank"]
        row = prompt + checked["rollout"].response_budget
        budget, why = resolve_token_budget(at, row, math.ceil(rows / loss.updates_per_batch) * row, usable(memory[0]),
                                           memory[0] * BATCH_SHARE)
        how = f"auto: {why}"
    plan = at(budget)
    if memory is not None:
        plan.notes += fit_notes(plan, memory[0], memory[1], model.lora.enabled, model.gradient_checkpointing)
        plan.facts["memory"] = (f"{memory[0] / GIB:.1f} GiB ({memory[1]}), {usable(memory[0]) / GIB:.1f} GiB usable "
                                f"({MARGIN_FRACTION:.0%} and {MARGIN_BYTES / GIB:.0f} GiB kept for the runtime)")
    plan.facts["loss.micro_batch_tokens"] = f"{f'{budget} tokens' if budget else '0 = off'} ({how})"
    return plan, budget, how


def auto_token_budget(cfg: DictConfig, checked: dict[str, Any], config: Any, tokenizer: Any, train: list[Any],
                      test: list[Any]) -> tuple[int, dict[str, Any]]:
    """At run start: ``loss.micro_batch_tokens`` with ``auto`` resolved for the loaded model's
    ``config`` and ``tokenizer``, the task's ``train`` / ``test`` problems and this machine's
    memory, and what to record about it (empty when the budget was set)."""
    loss, model, rollout = checked["loss"], checked["model"], checked["rollout"]
    if loss.micro_batch_tokens != "auto":
        return loss.micro_batch_tokens, {}
    memory = available_memory(str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu")))
    prompt, _ = prompt_tokens(train, tokenizer, rollout.chat_template)
    eval_prompt, _ = prompt_tokens(test or train, tokenizer, rollout.chat_template)
    plan, budget, how = sized_plan(cfg, checked, shape_of(config, model.trust_remote_code), prompt, eval_prompt,
                                   len(test), memory)
    record = {"configured": "auto", "resolved": budget, "how": how, "update_gib": round(plan.phases["update"] / GIB, 3),
              "peak_gib": round(plan.peak[1] / GIB, 3), "peak_phase": plan.peak[0]}
    if memory is not None:
        record.update(memory_gib=round(memory[0] / GIB, 3), memory=memory[1],
                      does_not_fit=[n for n in plan.notes if n.startswith("does not fit")])
    return budget, record


def bench_plan(cfg: DictConfig, checked: dict[str, Any], shape: Shape, prompt: int, prompts: int,
               estimators: dict[str, tuple[Any, str, Any]],
               memory: tuple[int, str] | None = None) -> tuple[dict[str, float], list[str]]:
    """credit-bench's phases (:func:`~creditlab.run.memory_phases.bench_phases`) for ``prompts``
    prompts: ``cfg`` / ``checked`` the bench's composed run, ``estimators`` name -> (advantage
    config, segmenter name, segmenter config), the handle's token budget the one the bench
    resolves for ``memory`` (:func:`sized_plan`; None: planned as 0)."""
    run, rollout, loss = checked["run"], checked["rollout"], checked["loss"]
    plan = sized_plan(cfg, checked, shape, prompt, prompt, 1, memory)[0]
    rows = prompts * rollout.group_size
    dims = replace(plan.dims, rows=rows, micro=loss.micro_batch_size or run.prompts_per_step * rollout.group_size)
    per = {name: (config, replace(dims, segments=segments_bound(seg, seg_cfg, dims.T, rollout.thoughts,
                                                                rollout.max_thoughts)))
           for name, (config, seg, seg_cfg) in estimators.items()}
    return bench_phases(dims, per, plan.parts["weights"])


def plan_run(cfg: DictConfig, checked: dict[str, Any], prompt: int | None = None,
             memory: tuple[int, str] | None = None) -> tuple[Plan, list[tuple[str, str]]]:
    """The plan of a validated config and what it resolved to, without loading the model (its
    config and tokenizer only) or writing anything: ``prompt`` tokens, else measured on the
    task's prompts (loaded as the run loads them); ``memory`` ``(bytes, what)`` to size ``auto``
    for, else this machine's for the config's accelerator (:func:`available_memory`).

    Raises:
        ConfigError: The model's config cannot be read, or the task's data cannot be loaded
            (then ``--prompt-tokens N`` stands for the prompt length).
    """
    model, rollout = checked["model"], checked["rollout"]
    shape, tokenizer, source = load_shape(model)
    lengths, eval_count = (prompt, prompt, "tokens (--prompt-tokens)"), checked["eval"].problems or 500
    if prompt is None:
        task_cls, task_config = checked["task"]
        try:
            task = task_cls(task_config)
            train, test = list(task.load("train")), list(task.load("test"))
        except Exception as exc:  # noqa: BLE001 - any failure to read the data ends the same way
            raise ConfigError(f"prompt lengths unknown: task {cfg.task.name} could not load its data ({exc}); "
                              f"fix that, or pass --prompt-tokens N (the longest prompt, in tokens)") from exc
        (p_train, how), (p_test, _) = (prompt_tokens(s, tokenizer, rollout.chat_template) for s in (train, test))
        lengths, eval_count = (p_train, p_test, how), len(test)
    if memory is None:
        memory = available_memory(str(OmegaConf.select(cfg, "trainer.accelerator", default="cpu")))
    plan, _, _ = sized_plan(cfg, checked, shape, lengths[0], lengths[1], eval_count, memory)
    if tokenizer is None and prompt is None:
        plan.notes.append("prompt lengths are the prompts' characters (no tokenizer here): an upper bound of their "
                          "tokens for byte-pair tokenizers, but a chat template's own tokens are not counted; the run "
                          "measures prompts in tokens (--prompt-tokens N plans with N)")
    lora = model.lora
    resolved = [
        ("method", str(cfg.get("method", "custom"))),
        *[(kind, str(OmegaConf.select(cfg, f"{kind}.name", default="plain" if kind == "rollout" else "?")))
          for kind in ("task", "advantage", "segmenter", "reset_selector", "rollout", "backend", "verifier")],
        ("model", f"{model.name_or_path or 'recipe ' + str(model.recipe)} (shape: {source})"),
        ("precision", f"{OmegaConf.select(cfg, 'trainer.precision', default='32-true')}, model.dtype={model.dtype}"),
        ("LoRA", f"r={lora.r}, alpha={lora.alpha}, {lora.target_modules}" if lora.enabled else "off"),
        ("gradient checkpointing", "on" if model.gradient_checkpointing else "off"),
        ("batch", f"{checked['run'].prompts_per_step} prompts x {rollout.group_size} completions, micro_batch_size="
                  f"{checked['loss'].micro_batch_size or 'whole mini-batch'}; prompt <= {lengths[0]} {lengths[2]} "
                  f"(test split {lengths[1]}), response <= {rollout.response_budget} tokens"),
        *[(k, str(v)) for k, v in plan.facts.items()],
    ]
    return plan, resolved
