"""One GRPO training step: creditlab vs. TRL's ``GRPOTrainer``, side by side in one process.

Both sides train their own copy of the SAME local checkpoint (a tiny Llama: 4 layers, hidden 256,
4 heads, MLP 1024, character tokenizer) on the SAME work per optimizer step:

* P prompts x G completions x exactly N new tokens (default 8 x 8 x 32), CPU, fp32, the same
  ``torch`` thread count;
* sampling at temperature 1.0, top_p 1.0, no top-k;
* the GRPO clipped loss (eps 0.2) with seq-mean-token-mean aggregation, group-std advantages,
  beta = 0 (no reference model), one optimizer update per batch (no old-logprob pass), the same
  torch AdamW (fused by default, as transformers' default optim on torch >= 2.8; ``--adamw plain``),
  learning rate and weight decay 0, grad-norm clipping at 1.0, no gradient checkpointing, no
  logging, no evaluation, no checkpoints;
* reward: the fraction of digit characters in the completion text (deterministic, trivial).

Exactly N new tokens: the checkpoint's EOS token (``<eos>``) has an id *outside* the model's output
vocabulary (the LM head has ``len(tokenizer) - 1`` rows), so neither sampler can ever emit it and
every completion runs to the budget. Both reward functions check that every completion has exactly
N tokens.

What is timed (per optimizer step, after ``--warmup`` discarded steps):

* creditlab: a real ``lightning.Trainer.fit`` of ``CreditAssignmentModule`` built from its parts
  (HFBackend, a digit-fraction Verifier, WholeSegmenter, GRPOAdvantage, the plain rollout
  strategy). ``step`` = ``on_train_batch_start`` -> ``on_train_batch_end``, i.e. the whole
  ``training_step``: prompt encoding, generation, scoring, collate, segmentation, advantages,
  forward/backward, grad clipping, AdamW step, metric computation.
* TRL: ``GRPOTrainer.train``. ``step`` = ``on_step_begin`` -> ``on_step_end``, which contains
  ``Trainer.training_step`` -> ``GRPOTrainer._prepare_inputs`` -> ``_generate_and_score_completions``
  (tokenization, ``model.generate``, decoding, rewards, advantages, metrics), then the loss
  forward/backward, grad clipping, the optimizer and scheduler steps.
* ``cycle`` (both): one full iteration of the trainer's loop, from the moment the side got the CPU
  back after its previous step to the end of this step; it adds the loop's own overhead (next
  batch from the dataloader, callbacks, logging bookkeeping) to ``step``.

The two sides run in two threads that hand the CPU to each other after every step (never running
at the same time), so a change in machine load hits both alike; each thread calls
``torch.set_num_threads(--threads)`` and the thread count seen inside every step is reported.
``--only`` runs one side alone (on the main thread). ``--profile SIDE`` profiles the measured
steps of one side (cProfile, or ``--profiler torch`` with ``--only``).

Usage::

    python benchmarks/grpo_step_vs_trl.py                    # 2 threads, 2 warm-up + 10 steps each
    python benchmarks/grpo_step_vs_trl.py --threads 2 --steps 12 --warmup 2 --json out.json
    python benchmarks/grpo_step_vs_trl.py --only creditlab  # no TRL needed
    python benchmarks/grpo_step_vs_trl.py --model smollm2_135m --new-tokens 128 --steps 3 --warmup 1
                                   # a real model (SmolLM2-135M-Instruct, docs/real-model.md) instead

``--model`` takes a local model directory or a model recipe; its copy gets an EOS token outside the
model's logits (:func:`adopt_checkpoint`), so the exact-length rule above holds for it too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import shutil
import statistics
import string
import sys
import tempfile
import threading
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: find bench_common
from bench_common import (  # noqa: E402
    SIDES,
    Baton,
    PythonProfiler,
    Recorder,
    TorchProfiler,
    describe_optimizer,
    fmt,
    side_stats,
    versions,
)


# ------------------------------------------------------------------------------------------------
# The shared checkpoint and reward
# ------------------------------------------------------------------------------------------------
def build_checkpoint(path: Path, seed: int = 0) -> int:
    """Save a tiny Llama and its character tokenizer into ``path``; return the model's vocab size.

    The tokenizer has ``<pad>`` 0, ``<bos>`` 1, ``<unk>`` 2, one token per ``string.printable``
    character, then ``<eos>`` as the LAST id. The model's vocabulary stops just before ``<eos>``:
    its logits never include EOS, so sampling never ends early.
    """
    import torch
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ("<pad>", "<bos>", "<unk>")
    vocab = {t: i for i, t in enumerate(specials)}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    model_vocab = len(vocab)
    vocab["<eos>"] = model_vocab  # unreachable: outside the LM head
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in (*specials, "<eos>")])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", unk_token="<unk>",
        eos_token="<eos>", clean_up_tokenization_spaces=False,
    )
    config = LlamaConfig(
        vocab_size=model_vocab, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model_vocab


def adopt_checkpoint(source: str, path: Path) -> int:
    """Save a copy of a real checkpoint into ``path`` that, like the tiny one, can only stop at the
    token budget; return the model's vocab size.

    ``source`` is a local model directory or a creditlab model recipe name (``smollm2_135m``: the
    converted SmolLM2-135M-Instruct, built or taken from the cache). The copy's tokenizer gets a new
    EOS token whose id is past the model's last logit, and the model's own end tokens stop nothing
    (``eos_token_id`` cleared in its config and generation config); the weights are unchanged.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(source).is_dir():
        from creditlab.run.models import ModelConfig, resolve_model_path

        source = resolve_model_path(ModelConfig(recipe=source))
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(source)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.add_special_tokens({"eos_token": "<bench-eos>"})
    if tok.eos_token_id < model.config.vocab_size:
        raise RuntimeError(f"{source}: the new EOS id {tok.eos_token_id} is inside the model's "
                           f"{model.config.vocab_size} logits (the tokenizer is shorter than the model)")
    model.config.eos_token_id = None
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model.config.vocab_size


def make_prompts(n: int) -> list[str]:
    """``n`` distinct prompts of equal length (no padding on either side)."""
    return [f"Add: {10 + 7 * i % 90:02d}+{(31 + 13 * i) % 90 + 10:02d}=" for i in range(n)]


def digit_fraction(text: str) -> float:
    """The reward: the fraction of digit characters in ``text`` (0 for an empty text)."""
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


# ------------------------------------------------------------------------------------------------
# creditlab
# ------------------------------------------------------------------------------------------------
def run_creditlab(args, ckpt: str, rec: Recorder, info: dict) -> None:
    import lightning as L
    import torch
    from creditlab.backends.hf import HFBackend
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

    torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens
    for name in ("lightning.pytorch", "lightning.fabric"):  # set at import by lightning
        logging.getLogger(name).setLevel(logging.ERROR)

    class DigitFractionVerifier(Verifier):
        """Reward = fraction of digits in the completion text; checks the forced length."""

        def score(self, problems, completions) -> Rewards:
            bad = [len(c.response_ids) for c in completions if len(c.response_ids) != new_tokens]
            if bad:
                raise RuntimeError(f"creditlab completions not {new_tokens} tokens long: {bad[:5]}")
            values = tuple(digit_fraction(c.text) for c in completions)
            return Rewards(values, tuple({"parsed": None, "outcome": "wrong"} for _ in values))

    model, tokenizer, _ = load_policy(ModelConfig(name_or_path=ckpt, dtype="float32"))
    problems = [Problem(id=str(i), prompt=p, answer="") for i, p in enumerate(make_prompts(args.prompts))]
    rollout = RolloutConfig(
        group_size=args.generations, temperature=1.0, top_p=1.0, top_k=0,
        max_new_tokens=new_tokens, truncation="keep",
    )
    loss = LossConfig(
        mode="clip", agg="seq-mean-token-mean", clip_eps_low=0.2, clip_eps_high=0.2,
        kl_coef=0.0, updates_per_batch=1, micro_batch_size=0, micro_batch_tokens=args.micro_batch_tokens,
    )
    # bf16 on both sides: TRL's bf16=True generates under the same autocast as its update, so
    # creditlab decodes in bf16 too (backend.dtype, as precision=bf16 sets it)
    backend = HFBackend(HFBackend.Config(dtype="bfloat16" if args.dtype == "bf16" else "auto"),
                        model=model, tokenizer=tokenizer)
    verifier = DigitFractionVerifier()
    strategy, sampler = PlainRolloutStrategy(rollout=rollout), RolloutSampler(rollout, backend, verifier)
    module = CreditAssignmentModule(
        model, tokenizer,
        Parts(backend, verifier, WholeSegmenter(tokenizer=tokenizer), GRPOAdvantage(), strategy,
              sampler, NoResetSelector()),
        problems_for_step=lambda step: problems, eval_problems=problems[:1],
        loss=loss, rollout=rollout, eval_cfg=EvalConfig(every=0),
        optimizer=lambda params: torch.optim.AdamW(
            params, lr=args.lr, weight_decay=0.0, fused=args.adamw == "fused"),
        seed=args.seed, grad_clip=1.0, reference=None,
    )
    # Part timings (thin wrappers; training_step itself is untouched).
    backend.generate = rec.timed("generate", backend.generate)
    strategy.collect = rec.timed("rollout", strategy.collect)
    module.update = rec.timed("update", module.update)

    class Timing(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            rec.begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            rec.end()

    total = args.warmup + args.steps
    trainer = L.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu", devices=1, max_steps=total, max_epochs=-1,
        precision="bf16-mixed" if args.dtype == "bf16" else "32-true",
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
        deterministic=False, default_root_dir=str(Path(args.workdir) / "creditlab"),
        callbacks=[Timing()],
    )
    steps = DataLoader(list(range(total)), batch_size=1, num_workers=0)
    rec.baton.wait("creditlab")
    trainer.fit(module, train_dataloaders=steps)
    info["effective_sampling"] = {
        k: backend.last_effective.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")
    }
    info["stop_on"] = "tokenizer EOS id %s (outside the model's %d logits)" % (
        tokenizer.eos_token_id, model.config.vocab_size)
    info["optimizer"] = describe_optimizer(trainer.optimizers[0])


# ------------------------------------------------------------------------------------------------
# TRL
# ------------------------------------------------------------------------------------------------
def run_trl(args, ckpt: str, rec: Recorder, info: dict) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    new_tokens = args.new_tokens

    def digit_fraction_reward(completions, completion_ids=None, **kwargs) -> list[float]:
        bad = [len(c) for c in completion_ids if len(c) != new_tokens]
        if bad:
            raise RuntimeError(f"TRL completions not {new_tokens} tokens long: {bad[:5]}")
        return [digit_fraction(c) for c in completions]

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(ckpt)
    batch = args.prompts * args.generations
    micro = args.trl_micro_batch or batch  # rows per forward/backward; the rest by gradient accumulation
    if batch % micro:
        raise SystemExit(f"--trl-micro-batch {micro} must divide the batch's {batch} rows")
    info["trl_micro_batch"] = f"{micro} rows x {batch // micro} accumulation steps"
    total = args.warmup + args.steps
    config_kwargs = dict(
        output_dir=str(Path(args.workdir) / "trl"),
        use_cpu=args.device == "cpu", bf16=args.dtype == "bf16", fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
        generation_batch_size=batch, num_generations=args.generations,
        max_completion_length=new_tokens, num_iterations=1, beta=0.0,
        temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0,
        loss_type="grpo", scale_rewards="group", epsilon=0.2, mask_truncated_completions=False,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
        optim="adamw_torch_fused" if args.adamw == "fused" else "adamw_torch",
        weight_decay=0.0, max_grad_norm=1.0,
        max_steps=total, report_to="none", logging_strategy="no", logging_steps=10**9,
        save_strategy="no", eval_strategy="no", disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, dataloader_pin_memory=False, seed=args.seed,
    )
    try:
        config = GRPOConfig(**config_kwargs)
    except (TypeError, ValueError) as exc:
        import trl

        raise RuntimeError(f"TRL {trl.__version__} rejects this GRPOConfig ({exc}); the benchmark "
                           "was written for TRL 1.x (tested with 1.16): pip install 'trl>=1.0'") from exc
    dataset = Dataset.from_dict({"prompt": make_prompts(args.prompts)})

    class Timing(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            rec.begin()

        def on_step_end(self, a, state, control, **kw):
            rec.end()

    trainer = GRPOTrainer(
        model=model, reward_funcs=[digit_fraction_reward], args=config, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[Timing()],
    )
    # Part timings: generation (+ tokenize/decode), and the whole generate-and-score stage.
    for attr, part in (("_generate", "generate"), ("_generate_and_score_completions", "rollout")):
        if callable(getattr(trainer, attr, None)):  # private TRL methods: skip if renamed
            setattr(trainer, attr, rec.timed(part, getattr(trainer, attr)))
    gc = trainer.generation_config
    info["effective_sampling"] = {
        "temperature": gc.temperature, "top_p": gc.top_p, "top_k": gc.top_k,
        "max_new_tokens": gc.max_new_tokens, "do_sample": gc.do_sample,
    }
    info["stop_on"] = f"eos ids {trainer.eos_token_ids} (outside the model's {model.config.vocab_size} logits)"
    rec.baton.wait("trl")
    trainer.train()
    info["optimizer"] = describe_optimizer(getattr(trainer.optimizer, "optimizer", trainer.optimizer))



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads for both sides (default 2)")
    ap.add_argument("--steps", type=int, default=10, help="measured steps per side (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="discarded first steps per side (default 2)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt")
    ap.add_argument("--new-tokens", type=int, default=32, help="exact completion length")
    ap.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate (both sides)")
    ap.add_argument("--micro-batch-tokens", type=int, default=0,
                    help="creditlab's loss.micro_batch_tokens (0: the whole batch at once; a run's default, "
                         "auto, is sized by the memory plan: 2048 for SmolLM2 at 8 x 8 x 128 on a 24 GiB machine)")
    ap.add_argument("--trl-micro-batch", type=int, default=0,
                    help="TRL's rows per forward/backward (per_device_train_batch_size, the rest by "
                         "gradient_accumulation_steps; 0: the whole batch at once). TRL's own memory bound, "
                         "beside creditlab's --micro-batch-tokens: one optimizer step per batch either way")
    ap.add_argument("--adamw", choices=("fused", "plain"), default="fused",
                    help="torch AdamW implementation on both sides: fused (transformers' default "
                         "optim 'adamw_torch_fused' for torch>=2.8) or plain ('adamw_torch')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where both sides train (cuda: Lightning accelerator=gpu; TRL use_cpu=False)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                    help="precision of both sides: fp32, or bf16 autocast (Lightning "
                         "bf16-mixed and backend.dtype=bfloat16; TRL bf16=True) with fp32 weights")
    ap.add_argument("--model", default=None,
                    help="a local model directory or a model recipe (e.g. smollm2_135m) instead of the "
                         "tiny Llama; its EOS is made unreachable so every completion is --new-tokens long")
    ap.add_argument("--target", type=float, default=0.67, help="ratio target printed with the result")
    ap.add_argument("--only", choices=SIDES, help="run one side alone")
    ap.add_argument("--first", choices=SIDES, default="creditlab", help="side that takes the first turn")
    ap.add_argument("--main-thread", choices=SIDES, default="trl",
                    help="side that runs on the main thread (the other runs on a worker thread)")
    ap.add_argument("--json", type=Path, help="also write raw per-step times and stats here")
    ap.add_argument("--profile", choices=SIDES, help="profile this side's measured steps")
    ap.add_argument("--profiler", choices=("python", "torch"), default="python",
                    help="cProfile (default; the side's thread only) or torch.profiler (use --only)")
    ap.add_argument("--profile-out", type=Path, default=None,
                    help="profile output file (default grpo_bench_<side>.prof / .trace.json)")
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be >= 1 (cycle times need one step before them)")
    if args.generations < 2:
        ap.error("--generations must be >= 2 (GRPO groups)")

    active = (args.only,) if args.only else SIDES
    if "trl" in active and importlib.util.find_spec("trl") is None:
        print("TRL is not installed, so the comparison cannot run.\n"
              "  install it with:  pip install -e '.[bench]'   (or run `make bench`)\n"
              "  or time creditlab alone:  python benchmarks/grpo_step_vs_trl.py --only creditlab",
              file=sys.stderr)
        return 2

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda, but torch.cuda.is_available() is False here (use --device cpu)")
    for name in ("lightning", "lightning.pytorch", "transformers", "trl", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:  # pragma: no cover
        pass

    load_before = os.getloadavg()
    args.workdir = tempfile.mkdtemp(prefix="grpo-bench-")  # checkpoint + trainer dirs, removed at exit
    ckpt = str(Path(args.workdir) / "checkpoint")
    if args.model:
        adopt_checkpoint(args.model, Path(ckpt))
    else:
        build_checkpoint(Path(ckpt), seed=args.seed)

    baton = Baton(first=args.first if not args.only else args.only, active=active)
    profiler = None
    if args.profile:
        if args.profile not in active:
            ap.error(f"--profile {args.profile} but that side does not run")
        suffix = ".prof" if args.profiler == "python" else ".trace.json"
        out = args.profile_out or Path(f"grpo_bench_{args.profile}{suffix}")
        profiler = PythonProfiler(out) if args.profiler == "python" else TorchProfiler(out)
    recs = {
        s: Recorder(s, baton, args.threads, args.warmup, args.warmup + args.steps,
                    profiler if s == args.profile else None)
        for s in active
    }
    infos: dict[str, dict] = {s: {} for s in active}
    errors: dict[str, str] = {}
    runners = {"creditlab": run_creditlab, "trl": run_trl}

    def run_side(side: str) -> None:
        try:
            runners[side](args, ckpt, recs[side], infos[side])
        except BaseException:  # report, and never leave the other side waiting
            errors[side] = traceback.format_exc()
        finally:
            baton.finish(side)

    t_start = time.perf_counter()
    # By default TRL (transformers' Trainer) runs on the main thread and creditlab's Lightning loop
    # on a worker thread (--main-thread swaps them); a side run alone (--only) runs on the main one.
    main_side = args.main_thread if args.main_thread in active else active[0]
    workers = [threading.Thread(target=run_side, args=(s,), name=s) for s in active if s != main_side]
    for w in workers:
        w.start()
    run_side(main_side)
    for w in workers:
        w.join()
    wall = time.perf_counter() - t_start
    load_after = os.getloadavg()
    shutil.rmtree(args.workdir, ignore_errors=True)

    for side, err in errors.items():
        print(f"\n[{side}] FAILED:\n{err}", file=sys.stderr)
    if errors:
        return 1

    stats = {s: side_stats(recs[s].rows, args.warmup) for s in active}
    vers = versions()
    print()
    print(f"model: {args.model or 'the tiny Llama (4 layers, hidden 256)'}; device {args.device}, {args.dtype}")
    print(f"GRPO step: {args.prompts} prompts x {args.generations} completions x "
          f"{args.new_tokens} new tokens, {args.dtype}, {args.device.upper()}, {args.threads} threads; "
          f"{args.warmup} warm-up + {args.steps} measured steps per side"
          f"{', sides interleaved step by step' if len(active) == 2 else ''}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"load avg (1/5/15 min) before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
          f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f}; wall {wall:.0f} s")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    for side in active:
        print(f"{side}: threads seen in steps {sorted(recs[side].thread_counts)}; "
              f"sampling {infos[side].get('effective_sampling')};\n    stop: {infos[side].get('stop_on')}; "
              f"optimizer {infos[side].get('optimizer')}")
    print()
    print("seconds per optimizer step: median ±IQR (step: also the min)")
    header = (f"{'side':<10} {'step':>14} {'min':>6} {'cycle':>14} {'rollout':>14} {'generate':>14} "
              f"{'update':>14} {'other':>14}")
    print(header)
    print("-" * len(header))
    for side in active:
        st = stats[side]
        print(f"{side:<10} {fmt(st.get('step'))} {st['step']['min']:6.3f} {fmt(st.get('cycle'))} "
              f"{fmt(st.get('rollout'))} {fmt(st.get('generate'))} {fmt(st.get('update'))} "
              f"{fmt(st.get('other'))}")
    print("  step     on_step_begin/on_train_batch_start -> on_step_end/on_train_batch_end (one optimizer step)\n"
          "  cycle    the step + the trainer loop's own overhead until the next step (dataloader, hooks)\n"
          "  rollout  creditlab: the rollout strategy's collect (encode, generate, verify); TRL: "
          "_generate_and_score_completions\n"
          "           (tokenize, generate, decode, rewards, advantages, metrics)\n"
          "  generate creditlab: HFBackend.generate (incl. decode); TRL: _generate "
          "(tokenize, model.generate, decode)\n"
          "  update   creditlab: module.update (fwd/bwd, entropy, clip, AdamW); TRL: step - rollout "
          "(loss fwd/bwd, clip, AdamW, scheduler)\n"
          "  other    creditlab: step - rollout - update (collate, segment, advantages, metrics)")
    ratio = None
    if len(active) == 2:
        ratio = stats["creditlab"]["step"]["median"] / stats["trl"]["step"]["median"]
        ratio_cycle = stats["creditlab"]["cycle"]["median"] / stats["trl"]["cycle"]["median"]
        ratio_min = stats["creditlab"]["step"]["min"] / stats["trl"]["step"]["min"]
        pairs = [c["step"] / t["step"] for c, t in
                 zip(recs["creditlab"].rows[args.warmup:], recs["trl"].rows[args.warmup:])]
        paired = statistics.median(pairs)
        verdict = "meets" if ratio <= args.target else "MISSES"
        print(f"\nratio creditlab/TRL of median step: {ratio:.3f}   (median cycle: {ratio_cycle:.3f}; "
              f"min step: {ratio_min:.3f};\n  median of the per-step paired ratios (step k of each side, "
              f"run back to back): {paired:.3f});  target <= {args.target}: {verdict}")
    if profiler is not None:
        profiler.report()
    if args.json:
        args.json.write_text(json.dumps({
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                     if k != "workdir"},
            "load_before": load_before, "load_after": load_after, "versions": vers,
            "stats": stats, "ratio_step": ratio, "info": infos,
            "rows": {s: recs[s].rows for s in active},
        }, indent=2))
        print(f"raw times: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
