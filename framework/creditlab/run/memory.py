"""Memory before the model loads: a configured run's peak memory per device, estimated from the
model's config alone (``creditlab train --dry-run``; docs/gpu.md, "Memory before the model loads").

The shape comes from ``config.json`` (``AutoConfig``; a recipe model from its
``creditlab.model_recipe_config`` entry point), parameter and layer shapes from the model built on
torch's ``meta`` device (no weights). ``P`` parameters, ``P_t`` trained ones (LoRA: the adapters,
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
  3I) · a`` (one layer at a time, no grad). ``backend=vllm``: the engine's weight copy and
  ``backend.kv_cache_gib`` instead.
* checkpoint: Lightning serializes the trained weights and the optimizer state into memory before
  writing them, ``(1 + k) · P_t · w_t`` (host memory; frozen weights are left out).

Peak = the largest phase: update (weights, gradients, optimizer, activations, vocabulary tensors),
generation and evaluation (weights, optimizer, KV cache, decoding tensors) or checkpoint (weights,
optimizer, buffer). The update's sum is an upper bound: gradients grow while activations are
freed. Not counted: the runtime (Python, torch, a CUDA context), the data, the fused decoder's
weight copies (at most ``backend.fused_copy_budget_mb``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from creditlab.errors import ConfigError
from creditlab.registry import registry
from creditlab.run.models import DTYPES, ModelConfig
from creditlab.step.fused_head import DEFAULT_TOKEN_CHUNK
from creditlab.step.policy import encode_prompt
from creditlab.step.token_logprobs import FUSED_MIN_VOCAB, fused_head_of

GIB = 2**30
#: The components each phase holds at once (``evaluation``: those of ``generation``, for its rows).
PHASE_PARTS = {
    "update": ("weights", "reference", "gradients", "optimizer", "autocast copies", "activations", "logits"),
    "generation": ("weights", "reference", "optimizer", "generation tensors", "kv cache"),
    "checkpoint": ("weights", "reference", "optimizer", "checkpoint buffer"),
}
HALF_TRUE = ("bf16-true", "16-true")
MIXED = ("bf16-mixed", "bf16", "16-mixed", "16", "transformer-engine", "transformer-engine-float16")


@dataclass(frozen=True)
class Shape:
    """What the estimate needs of a model, from its config (``linears``: ``(name, in, out)`` of
    every linear layer but the output head, for LoRA)."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    kv_heads: int
    head_dim: int
    vocab: int
    linears: tuple[tuple[str, int, int], ...]
    fusable_head: bool = False


def shape_of(config: Any, trust_remote_code: bool = False) -> Shape:
    """The :class:`Shape` of a ``transformers`` config: the model built on the ``meta`` device."""
    text = config.get_text_config()
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    head = model.get_output_embeddings()
    linears = tuple((n, m.in_features, m.out_features) for n, m in model.named_modules()
                    if isinstance(m, torch.nn.Linear) and m is not head)
    heads = text.num_attention_heads
    return Shape(
        params=sum(p.numel() for p in model.parameters()), layers=text.num_hidden_layers,
        hidden=text.hidden_size, intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
        linears=linears, fusable_head=fused_head_of(model, "on") is not None,
    )


def lora_linears(shape: Shape, targets: Any) -> list[tuple[str, int, int]]:
    """The linear layers LoRA adapts: ``all-linear`` (every one but the output head, as peft) or
    those whose name is a target or ends with ``.<target>``."""
    if targets == "all-linear":
        return list(shape.linears)
    names = [targets] if isinstance(targets, str) else list(targets)
    return [lin for lin in shape.linears if any(lin[0] == t or lin[0].endswith("." + t) for t in names)]


def load_shape(model: ModelConfig) -> tuple[Shape, Any, str]:
    """``(shape, tokenizer or None, where it came from)`` without loading weights or building a
    recipe's checkpoint.

    Raises:
        ConfigError: No config to read: a folder without ``config.json``, a hub id this machine
            cannot reach, or a recipe that registers no shape.
    """
    if not model.name_or_path:
        shapes = registry("model_recipe_config")
        if model.recipe not in shapes:
            raise ConfigError(
                f"model.recipe={model.recipe} builds its checkpoint when the run starts and registers no "
                f"shape (entry-point group 'creditlab.model_recipe_config'), so its size is unknown before it "
                f"is built: run it once, then pass the folder it printed as 'model:' as model.name_or_path."
            )
        try:
            config, tokenizer = shapes.get(model.recipe)(dict(model.recipe_args))
        except ValueError as exc:
            raise ConfigError(f"model.recipe_args: {exc}") from exc
        return shape_of(config), tokenizer, "its creditlab.model_recipe_config entry, nothing built"
    path = model.name_or_path
    local = Path(path).expanduser()
    if local.is_dir() and not (local / "config.json").is_file():
        have = ", ".join(sorted(p.name for p in local.iterdir())[:8]) or "nothing"
        raise ConfigError(
            f"model.name_or_path={path} is a folder without config.json (it holds: {have}). Point it at a "
            f"folder written by save_pretrained (config.json, weights, tokenizer), or at a hub model id."
        )
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the config of model.name_or_path={path}: {str(exc).strip().rstrip('.')}. Pass a local folder holding "
            f"config.json, or a hub id on a machine with network access (HF_HUB_OFFLINE unset)."
        ) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError):
        tokenizer = None
    return shape_of(config, model.trust_remote_code), tokenizer, f"{path}/config.json"


def prompt_tokens(problems: list[Any], tokenizer: Any, chat_template: Any) -> tuple[int, str]:
    """``(tokens, how)`` of the longest prompt, encoded as rollouts encode it (the 500 longest by
    characters); without a tokenizer its characters (an upper bound for byte-pair tokenizers).

    Raises:
        ConfigError: The tokenizer encodes every one of those prompts to no token (an empty or
            unfitting tokenizer: every prompt would reach the model empty).
    """
    longest = sorted((p.prompt for p in problems), key=len, reverse=True)[:500]
    if tokenizer is None or not longest:
        return len(longest[0]) if longest else 0, "characters (no tokenizer)"
    tokens = max(len(encode_prompt(tokenizer, t, chat_template)) for t in longest)
    if tokens == 0 and longest[0]:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"the tokenizer of {name} encodes every prompt to no token (e.g. {longest[0][:60]!r}): it is "
            "empty or does not fit this text; give model.name_or_path a folder whose tokenizer encodes "
            "the task's prompts, or pass --prompt-tokens N to plan without it")
    return tokens, "tokens"


def precision_bytes(precision: Any, dtype: str) -> tuple[int, int, bool]:
    """``(w, a, autocast)``: bytes per weight and per activation under ``trainer.precision``, and
    whether autocast runs fp32 weights in half precision (``*-mixed``)."""
    w, p = DTYPES[dtype].itemsize, str(precision)
    if p in HALF_TRUE or p in ("64-true", "64"):
        return (8, 8, False) if p.startswith("64") else (2, 2, False)
    return (w, 2, w > 2) if p in MIXED else (w, w, False)


@dataclass
class Plan:
    """The estimate: bytes per component and phase, and what it assumed."""

    parts: dict[str, float]
    phases: dict[str, float]
    facts: dict[str, Any]
    notes: list[str]

    @property
    def peak(self) -> tuple[str, float]:
        """``(phase, bytes)`` of the largest phase."""
        return max(self.phases.items(), key=lambda kv: kv[1])


def estimate(cfg: DictConfig, checked: dict[str, Any], shape: Shape, prompt: int, eval_prompt: int,
             eval_count: int) -> Plan:
    """The memory plan of one rank of the run (the module docstring has every formula): ``cfg``
    composed, ``checked`` its :func:`~creditlab.run.config.validate` sections, ``prompt`` /
    ``eval_prompt`` the longest prompt's tokens (train / test split), ``eval_count`` test problems."""
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

    rows = math.ceil(run.prompts_per_step / world) * rollout.group_size
    mini = math.ceil(rows / loss.updates_per_batch)
    b = min(loss.micro_batch_size, mini) if loss.micro_batch_size else mini
    if loss.micro_batch_tokens:  # rows of the longest prompt and response under the token budget
        b = max(1, min(b, loss.micro_batch_tokens // (prompt + rollout.response_budget)))
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

    def generation(g_rows: int, context: int, sampled: bool) -> tuple[float, float]:
        """(decoding and prefill tensors, KV cache) of ``g_rows`` rows."""
        if backend == "vllm":
            return weights, float(OmegaConf.select(cfg, "backend.kv_cache_gib", default=1.0)) * GIB
        decode = g_rows * V * (a + 16 + (8 if sampled else 0))
        return decode + g_rows * context * (4 * H + 3 * I) * a, g_rows * (context + T) * kv_token

    truncates = rollout.top_p < 1 or rollout.top_k > 0
    gen_rows = min(rows, max_rows)
    parts["generation tensors"], parts["kv cache"] = generation(gen_rows, prompt, truncates)
    parts["checkpoint buffer"] = (1 + k) * trained * w_t  # Lightning serializes into memory first
    eval_rows = min(ev.batch_size, max_rows, (ev.problems or eval_count) * max(1, ev.samples)) if ev.every else 0
    phases = {phase: sum(parts[name] for name in names) for phase, names in PHASE_PARTS.items()}
    if OmegaConf.select(cfg, "trainer.accelerator", default="cpu") != "cpu":
        del phases["checkpoint"]  # the buffer is host memory, the rest stays on the device
        notes.append(f"a checkpoint save also fills {parts['checkpoint buffer'] / GIB:.2f} GiB of host memory")
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
    return Plan(parts, phases, facts, notes)


def plan_run(cfg: DictConfig, checked: dict[str, Any], prompt: int | None = None) -> tuple[Plan, list[tuple[str, str]]]:
    """The plan of a validated config and what it resolved to, without loading the model (its
    config and tokenizer only) or writing anything: ``prompt`` tokens, else measured on the
    task's prompts (loaded as the run loads them).

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
    plan = estimate(cfg, checked, shape, lengths[0], lengths[1], eval_count)
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
