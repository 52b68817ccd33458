"""Model recipe ``smollm2_135m_word_problems``: SmolLM2-135M-Instruct (recipe ``smollm2_135m``) with
a LoRA adapter warm-started on real worked solutions, shipped and hashed (docs/real-problems.md).

The training texts are the ``word_problems`` task's own: GSM8K train problems of one to three steps,
the prompt as rollouts encode it (the chat template's user turn and generation prompt; masked out of
the loss), then the worked solution with its calculator annotations removed, ending ``#### <n>``,
then ``<|im_end|>``. Nothing of the project's templates: the model reads GSM8K's own phrasings.
The last ``validation_problems`` training problems are held out of the warm start and scored greedily
at its end (the held-out sets, GSM8K test and SVAMP, are never looked at here).

Supervised fine-tuning of LoRA adapters (``r``, ``alpha``, every linear layer) with AdamW, linear
warm-up then cosine decay, over ``epochs`` passes, under bf16 autocast (``precision: bf16-mixed``,
the default: fp32 weights and optimizer; about 1.7x fp32's speed in a 3-step probe on the AMX
machine that built the shipped adapter) or in fp32 (``precision: "32"``, for a CPU without bf16 units, where autocast is
emulated and slower). The adapter is merged into the base weights in
float64 and rounded once to fp32, so that the same adapter bytes give the same model bytes on every
machine.

A build differs by CPU (long training amplifies rounding: ``docs/reproducing.md``), so the adapter
that results are quoted for ships in ``warm_starts/<cache key>/`` (about 19 MiB; every file's sha256
in ``warm_starts/manifest.json``, checked at load); the recipe uses it whenever its arguments name
a shipped key, unless ``shipped: false`` asks for a rebuild. ``init`` (a shipped adapter's key)
starts the LoRA weights from that adapter instead of LoRA's zero start: more epochs as a warm
restart, each within a session (docs/real-problems.md, "A second epoch").
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from creditlab_arith import shipped
from creditlab_arith.model import build_cached, cache_root, merge_args
from creditlab_arith.sft_loop import warm_start

from creditlab_smollm2 import convert

#: Bump when the recipe changes in a way that changes the produced weights (2: the output layer
#: runs on the target positions only, the same losses summed in another order).
RECIPE_VERSION = 2
#: The shipped adapters of this recipe and their manifest.
SHIPPED = Path(__file__).parent / "warm_starts"
#: The files of a shipped adapter.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "creditlab_recipe.json")
DEFAULTS: dict[str, Any] = {
    "base": {},
    "r": 16,
    "alpha": 32,
    "epochs": 1,
    "batch_size": 16,
    "lr": 1e-3,  # 2e-4 before: 1e-3 got lower held-out loss sooner (docs/real-problems.md)
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "seed": 0,
    "threads": 2,
    "max_ops": 3,
    "validation_problems": 128,
    "max_new_tokens": 256,
    "precision": "bf16-mixed",
    "shipped": True,
    "save_every": 10,
    "init": None,  # a shipped adapter's cache key: train on from it (a warm restart), not from LoRA's zero start
}
#: Arguments that change how fast a build runs, where it comes from or how it survives a kill, not
#: what it is.
_NOT_IN_KEY = ("threads", "shipped", "save_every")


def resolve_args(args: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge ``args`` over :data:`DEFAULTS`, validating them (ValueError naming the bad key)."""
    out = merge_args("smollm2_135m_word_problems", DEFAULTS, args)
    out["base"] = convert.resolve_args(out["base"])
    for key in ("r", "epochs", "batch_size", "validation_problems", "max_new_tokens", "threads", "save_every"):
        if isinstance(out[key], bool) or not (isinstance(out[key], int) and out[key] > 0):
            raise ValueError(f"smollm2_135m_word_problems: {key} must be a positive integer, got {out[key]!r}")
    if out["max_ops"] not in (1, 2, 3):
        raise ValueError(f"smollm2_135m_word_problems: max_ops must be 1, 2 or 3, got {out['max_ops']!r}")
    if out["precision"] not in ("32", "bf16-mixed"):
        raise ValueError(f"smollm2_135m_word_problems: precision must be '32' or 'bf16-mixed', got {out['precision']!r}")
    if out["init"] is not None and out["init"] not in shipped.manifest(SHIPPED):
        raise ValueError(f"smollm2_135m_word_problems: init must be null or a shipped adapter's cache key "
                         f"({sorted(shipped.manifest(SHIPPED))}), got {out['init']!r}")
    if not isinstance(out["shipped"], bool):
        raise ValueError(f"smollm2_135m_word_problems: shipped must be true or false, got {out['shipped']!r}")
    return out


def checkpoint_dir(args: Mapping[str, Any] | None = None) -> Path:
    """The cache folder of the merged model for ``args``: the hash covers this recipe's version,
    its arguments (speed and source aside), the converted base's own folder name and the training
    file's sha256 (a rebuilt data set is another warm start, not the shipped one); ``init``, where
    given, names the adapter it trains on from, and so is part of it."""
    from creditlab_wordproblems.task import DATA

    resolved = {k: v for k, v in resolve_args(args).items() if k not in _NOT_IN_KEY}
    if resolved["init"] is None:  # a build from LoRA's zero start keeps the key it had before init existed
        del resolved["init"]
    base = convert.checkpoint_dir(resolved.pop("base")).name
    blob = json.dumps({"recipe": RECIPE_VERSION, "base": base, "args": resolved,
                       "train_data_sha256": shipped.sha256(DATA / "train.jsonl")}, sort_keys=True)
    return cache_root() / "models" / f"smollm2_135m_word_problems-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def build(args: Mapping[str, Any] | None = None) -> str:
    """The merged model's folder for ``args``: from the shipped adapter when one ships for them
    (``shipped: true``, the default), else warm-started here; cached either way."""
    resolved = resolve_args(args)
    final = checkpoint_dir(resolved)
    base = convert.build_smollm2(resolved["base"])
    if resolved["shipped"]:
        adapter = shipped.load(final.name, root=SHIPPED, weights="adapter_model.safetensors")
        if adapter is None:
            raise ValueError(
                f"smollm2_135m_word_problems: no adapter ships for these arguments (cache key {final.name}; "
                f"shipped: {sorted(shipped.manifest(SHIPPED))}). '+model.recipe_args={{shipped: false}}' builds "
                f"it on this CPU (about 75 minutes on 2 cores, resumed where it stopped if killed; a rebuild differs by CPU)")
        return build_cached(final, lambda tmp: _merge(base, adapter, tmp, {"adapter": "shipped", "key": final.name}))

    # a build killed part-way carries on from here when run again (creditlab_arith.resume)
    point = resume_point(final)

    def train_and_merge(tmp: Path) -> dict[str, Any]:
        info = _train(resolved, base, tmp / "adapter", point)
        (tmp / "adapter" / "creditlab_recipe.json").write_text(json.dumps(info, indent=2, sort_keys=True))
        return _merge(base, tmp / "adapter", tmp, info)

    out = build_cached(final, train_and_merge)
    point.unlink(missing_ok=True)
    return out


def resume_point(final: Path) -> Path:
    """Where a build of the cache folder ``final`` keeps its resume point while it runs."""
    return final.parent / f".{final.name}.resume.pt"


def _merge(base: str, adapter: Path, out_dir: Path, info: dict[str, Any]) -> dict[str, Any]:
    """Save ``base`` + ``adapter`` as a plain checkpoint: ``W + (alpha / r) B A`` in float64, the
    rank-r sum as r outer products added in a fixed order with elementwise operations (no BLAS
    reduction, whose order and fused multiply-adds vary by CPU), rounded once to fp32: the same
    bytes from the same adapter on any machine."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((adapter / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    modules = dict(model.named_modules())
    merged = 0
    with torch.no_grad():
        for key, a in lora.items():
            if ".lora_A." not in key:
                continue
            name = key.split("base_model.model.", 1)[1].split(".lora_A.")[0]
            b = lora[key.replace(".lora_A.", ".lora_B.")]
            weight = modules[name].weight
            delta = torch.zeros(weight.shape, dtype=torch.float64)
            for k in range(a.shape[0]):  # (out, 1) * (1, in), added rank by rank
                delta += b[:, k: k + 1].double() * a[k: k + 1, :].double()
            weight.copy_((weight.double() + scaling * delta).float())
            merged += 1
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(base).save_pretrained(out_dir)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return {**info, "merged_modules": merged, "merged_weights_sha256": digest.hexdigest(), "adapter_dir": str(adapter)}


def _train(args: dict[str, Any], base: str, out_dir: Path, point: Path | None = None) -> dict[str, Any]:
    """LoRA warm start on the task's training solutions; saves the adapter in ``out_dir``. With
    ``point``, a resume point every ``save_every`` steps, and it resumes from one found there."""
    import torch
    from creditlab import encode_prompt
    from creditlab_wordproblems.task import WordProblemsTask
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from creditlab_arith.shipped import sha256
    from creditlab_wordproblems.task import DATA

    data_sha256 = sha256(DATA / "train.jsonl")  # the file as read now, not as it is hours later
    problems = list(WordProblemsTask(WordProblemsTask.Config(max_ops=args["max_ops"])).load("train"))
    n_val = args["validation_problems"]
    train, held = problems[:-n_val], problems[-n_val:]
    tokenizer = AutoTokenizer.from_pretrained(base)

    def encode(prompt: str) -> list[int]:
        return list(encode_prompt(tokenizer, prompt, True, "recipe_args"))

    data = []
    for p in train:
        prompt = encode(p.prompt)
        target = tokenizer(p.metadata["solution"], add_special_tokens=False)["input_ids"]
        data.append((prompt + target + [tokenizer.eos_token_id], len(prompt), 1.0))
    steps = math.ceil(args["epochs"] * len(data) / args["batch_size"])
    old_threads = torch.get_num_threads()
    torch.set_num_threads(int(args["threads"]))
    began = time.time()
    try:
        torch.manual_seed(args["seed"])
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = get_peft_model(model, LoraConfig(r=args["r"], lora_alpha=args["alpha"], lora_dropout=0.0,
                                                 target_modules="all-linear"))
        if args["init"] is not None:
            _load_adapter(model, args["init"], args["r"], args["alpha"])

        def validate() -> float:
            return greedy_accuracy(model, tokenizer, held, args["max_new_tokens"], encode)

        schedule = {**args, "steps": steps, "stop_at_pass1": None, "validate_every": steps, "head_on_targets": True,
                    "resume_path": point}
        # cache_enabled=False: autocast caches its bf16 copies of the weights for as long as the
        # context lasts, and the context spans every optimizer step here: the forward would see
        # the first step's adapter for ever (measured: the loss did not move in 170 steps)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args["precision"] == "bf16-mixed",
                            cache_enabled=False):
            info = warm_start(model, data, tokenizer.pad_token_id, schedule, None, name="smollm2_135m_word_problems")
        model.save_pretrained(out_dir)  # before the validation: hours of training survive a failure in it
        info["validation_greedy_accuracy"] = validate()
    finally:
        torch.set_num_threads(old_threads)
    return {"recipe": "smollm2_135m_word_problems", "version": RECIPE_VERSION, "base": base, "args": args,
            "train_data_sha256": data_sha256,
            "train_problems": len(data), "validation_problems": n_val, "steps": steps,
            "seconds": round(time.time() - began), **info}


def _load_adapter(model: Any, key: str, r: int, alpha: int) -> None:
    """Set the LoRA weights of ``model`` (a fresh peft wrapper of rank ``r``) to the shipped adapter
    ``key``'s, its files checked against their sha256; the ranks and scalings must agree."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = shipped.load(key, root=SHIPPED, weights="adapter_model.safetensors")
    config = json.loads((folder / "adapter_config.json").read_text())
    if (config["r"], config["lora_alpha"]) != (r, alpha):
        raise ValueError(f"smollm2_135m_word_problems: init {key} has r {config['r']}, alpha {config['lora_alpha']}; "
                         f"this build asks for r {r}, alpha {alpha}: give the same r and alpha")
    result = set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))
    if result.unexpected_keys:
        raise ValueError(f"smollm2_135m_word_problems: init {key} holds weights this model has no place for: "
                         f"{result.unexpected_keys[:3]}")


def greedy_accuracy(model: Any, tokenizer: Any, problems: list[Any], max_new_tokens: int, encode: Any,
                    batch_size: int = 32) -> float:
    """Share of ``problems`` whose greedy answer the ``gsm8k`` verifier accepts (its default
    options: the task's verifier), checked in this process."""
    import torch
    from creditlab_math.verifiers import GSM8KVerifier

    verifier = GSM8KVerifier()

    training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    correct = 0
    try:
        with torch.no_grad():
            for i in range(0, len(problems), batch_size):
                batch = problems[i: i + batch_size]
                enc = tokenizer.pad({"input_ids": [encode(p.prompt) for p in batch]}, return_tensors="pt")
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                correct += sum(verifier.check(p.answer, t)["outcome"] == "correct" for p, t in zip(batch, texts))
    finally:
        model.train(training)
        tokenizer.padding_side = side
    return correct / len(problems)


def ship(folder: Path, name: str) -> str:
    """Add a finished build's adapter (``<cache folder>/adapter``) to the shipped set under the
    build's cache key (the folder's name); returns the key.

        python -c "from creditlab_smollm2.word_problems import ship; ship(Path(DIR), 'default')"
    """
    return shipped.add(folder / "adapter", name, root=SHIPPED, files=ADAPTER_FILES, key=folder.name)
