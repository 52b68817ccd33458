"""One rank's run: build the model, the parts, the data and the module from validated config
sections, fit them with a ``lightning.Trainer``, and (rank 0) summarize the run directory."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from creditlab.analysis.headline import headline
from creditlab.analysis.problem_records import read_records
from creditlab.errors import InputError
from creditlab.run.config import build_parts
from creditlab.run.datamodule import TaskDataModule
from creditlab.run.loggers import JsonlLogger, read_metrics
from creditlab.run.memory import auto_token_budget
from creditlab.run.models import is_peft, load_policy
from creditlab.run.progress import StepProgressBar, quiet_library_output
from creditlab.run.rundir_guard import RunStopped
from creditlab.step.module import CreditAssignmentModule, Parts
from creditlab.step.rollout import RolloutSampler

log = logging.getLogger(__name__)

# The policy stays in eval mode (no dropout) so trainer log-probs match the sampler's; checkpoints
# are taken after the optimizer step on purpose; batches are a function of the step, so the
# step loader needs no state to resume; the run resolves its own resume checkpoint (`resume`).
for _pattern in (
    r"Found \d+ module\(s\) in eval mode",
    r"Using ModelCheckpoint with manual optimization",
    r"You're resuming from a checkpoint that ended before the epoch ended",
    r"Checkpoint directory .* exists and is not empty",
):
    warnings.filterwarnings("ignore", message=_pattern)


def _step_of(path: Path) -> int | None:
    """The checkpoint's ``global_step`` (Lightning's optimizer steps), or None when the file cannot
    be read (truncated, corrupt, not a checkpoint). Memory-mapped: nothing but the header is read."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        return int(state["global_step"])
    except Exception:  # any failure to read means the file cannot be resumed from
        return None


def resume_checkpoint(resume: str | None, out_dir: Path, updates: int = 1) -> tuple[Path | None, int]:
    """The checkpoint a run resumes from and its ``global_step`` (``(None, 0)``: start afresh).

    ``resume=auto`` takes the intact checkpoint with the most steps in ``<out_dir>/checkpoints``
    (``last.ckpt``, ``step<N>.ckpt``, or ``interrupted.ckpt`` when a signal stopped the run after
    the last periodic checkpoint); an unreadable one (e.g. truncated by a kill while it was being
    written) is named and passed over, so a resume loses nothing that an intact file holds.

    Raises:
        InputError: ``resume`` is a path that does not exist or cannot be read.
    """
    if not resume:
        return None, 0
    if resume != "auto":
        path = Path(resume)
        if not path.is_file():
            raise InputError(f"resume={resume}: no such checkpoint. Use resume=auto or null.")
        step = _step_of(path)
        if step is None:
            raise InputError(f"resume={resume}: the checkpoint cannot be read (truncated or corrupt); "
                             "use another checkpoint or resume=auto.")
        return path, step
    found = sorted((out_dir / "checkpoints").glob("*.ckpt"), key=lambda p: (p.name != "last.ckpt", p.name))
    steps = {p: _step_of(p) for p in found}
    broken = [p for p, step in steps.items() if step is None]
    intact = [p for p in found if steps[p] is not None]
    best = max(intact, key=lambda p: steps[p], default=None)  # max keeps the first of equals
    if broken:
        instead = (f"resuming from {best.name} (RL step {steps[best] // updates}), the newest intact checkpoint"
                   if best is not None else "no intact checkpoint is left: starting over")
        _say(f"[creditlab] warning: {', '.join(str(p) for p in broken)} cannot be read (truncated or "
             f"corrupt); {instead}")
    return (best, steps[best]) if best is not None else (None, 0)


@rank_zero_only
def _say(message: str, stream: Any = None) -> None:
    print(message, file=stream or sys.stderr)


def _loggers(
    cfg: DictConfig, out_dir: Path, resume_step: int | None, run_cfg: Any, recorded: dict | None = None
) -> list[Any]:
    """``metrics.jsonl`` plus the configured loggers, which get the resolved config and what the
    run recorded (``recorded``, e.g. the backend's speed path) as hyperparameters."""
    loggers: list[Any] = [JsonlLogger(out_dir / "metrics.jsonl", resume_step)]
    for name, node in (cfg.get("logger") or {}).items():
        if node is None or "_target_" not in node:
            # logger=none keeps settings merged in by a sweep (e.g. logger.wandb.group): no logger
            continue
        kwargs: dict[str, Any] = {"save_dir": str(out_dir)}
        if "WandbLogger" in str(node.get("_target_", "")):
            kwargs.update(
                name=out_dir.name,
                id=node.get("id") or f"{out_dir.name}-{hashlib.md5(str(out_dir.resolve()).encode()).hexdigest()[:8]}",
                group=node.get("group") or run_cfg.method,
                tags=list(node.get("tags") or []) + list(run_cfg.tags or []) + [run_cfg.method],
            )
        logger = instantiate(node, **kwargs)
        init = getattr(logger, "_wandb_init", None)  # WandbLogger's wandb.init arguments, still unused
        if isinstance(init, dict):
            init.pop("anonymous", None)  # Lightning passes None, which W&B warns about on every run
            if node.get("offline") and "settings" not in node:  # the run's summary names the offline
                init["settings"] = {"silent": True}             # run and its sync command
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "recorded": recorded or {}})
        loggers.append(logger)
    return loggers


def fit(cfg: DictConfig, checked: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Build model, parts, data, module and trainer; fit; return the run's summary (rank 0; other
    ranks return ``{}``). One process of the run: :mod:`creditlab.run.launch` decides how many."""
    run_cfg, rollout, loss, eval_cfg = checked["run"], checked["rollout"], checked["loss"], checked["eval"]
    updates = loss.updates_per_batch
    ckpt, global_step = resume_checkpoint(run_cfg.resume, out_dir, updates)  # before the model loads
    L.seed_everything(run_cfg.seed, workers=True, verbose=False)
    quiet_library_output()

    steps = int(cfg.trainer.max_steps)
    task_cls, task_config = checked["task"]
    data = TaskDataModule(task_cls(task_config), run_cfg.prompts_per_step, steps, run_cfg.seed, eval_cfg)
    data.setup()  # both splits loaded and the held-out rows settled before the model loads

    model, tokenizer, model_path = load_policy(checked["model"], run_cfg.seed)
    budget, sized = auto_token_budget(cfg, checked, model.config, tokenizer, data.train_problems, data.test_problems)
    loss = dataclasses.replace(loss, micro_batch_tokens=budget)  # loss.micro_batch_tokens=auto, sized once here
    for note in sized.get("does_not_fit", []):
        _say(f"[creditlab] warning: the memory plan says this run {note}")
    parts = build_parts(checked, model, tokenizer, task=data.task)
    described = {"accelerator": checked["model"].accelerator, "backend": parts["backend"].describe()}
    if sized:
        described["micro_batch_tokens"] = sized
    _record(out_dir / "environment.json", model_path=str(model_path), **described)
    reference = None
    if loss.kl_coef > 0:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    sampler = RolloutSampler(rollout, parts["backend"], parts["verifier"])
    data.check_rows(tokenizer, model, rollout)  # load and check every row now: bad data fails before training
    module = CreditAssignmentModule(
        model, tokenizer,
        Parts(parts["backend"], parts["verifier"], parts["segmenter"], parts["advantage"],
              parts["rollout"], sampler, parts["reset_selector"]),
        data.problems_for_step, data.test_problems, loss, rollout, eval_cfg,
        instantiate(cfg.optim, _partial_=True), run_cfg.seed, run_cfg.grad_clip, reference,
        names={"task": cfg.task.name, "verifier": cfg.verifier.name},
    )

    resume_step = None
    if ckpt is not None:
        resume_step = global_step // updates
        _say(f"[creditlab] resuming from {ckpt} at RL step {resume_step}", sys.stdout)
    elif run_cfg.resume and _has_rows(out_dir / "metrics.jsonl"):
        resume_step = -1  # nothing to resume from: the same run starts over and logs its rows anew
        _say(f"[creditlab] no checkpoint in {out_dir / 'checkpoints'}: starting over from step 0 "
             "(the rows metrics.jsonl holds are logged anew)")
    every = run_cfg.checkpoint_every or steps
    callbacks = [ModelCheckpoint(
        dirpath=out_dir / "checkpoints", filename="step{step}", every_n_train_steps=every * updates,
        save_last=True, save_top_k=1, monitor=None, auto_insert_metric_name=False,
        enable_version_counter=False,  # one last.ckpt, also in a moved run_dir (no last-v1.ckpt)
    ), StopAtStepEnd(out_dir / "checkpoints" / "interrupted.ckpt")]
    if is_peft(model):
        callbacks.append(AdapterCheckpoint(out_dir / "adapter"))
    if cfg.trainer.get("enable_progress_bar", True) is not False:
        callbacks.append(StepProgressBar(steps))
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    # The step loader yields step indices; the module shards each step's prompts over the ranks.
    trainer_cfg.update(max_steps=steps * updates, max_epochs=-1, default_root_dir=str(out_dir),
                       use_distributed_sampler=False)
    loggers = _loggers(cfg, out_dir, resume_step, run_cfg, described)
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers)
    stopper = callbacks[1]
    try:
        with stopper:
            trainer.fit(module, train_dataloaders=data.train_dataloader(), ckpt_path=str(ckpt) if ckpt else None)
    except (StopRequested, SIGTERMException):  # Lightning's (a signal before training started)
        name = stopper.signal or "SIGTERM"
        if stopper.saved:
            raise RunStopped(name, module.rl_step, steps, stopper.path, True) from None
        raise RunStopped(name, module.rl_step, steps, resume_checkpoint("auto", out_dir, updates)[0], False) from None
    except SystemExit:  # Lightning ends a KeyboardInterrupt (a second Ctrl-C) with sys.exit(1)
        if not stopper.hard:
            raise
        raise RunStopped("SIGINT", module.rl_step, steps, resume_checkpoint("auto", out_dir, updates)[0], False) from None
    finally:
        parts["verifier"].close()
        parts["backend"].close()
    if trainer.global_rank != 0:
        return {}
    rows = read_metrics(out_dir / "metrics.jsonl")
    summary = _summarize(rows, out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary, out_dir, model_path)
    return summary


def _has_rows(path: Path) -> bool:
    return path.is_file() and bool(path.read_text(errors="replace").strip())


class StopRequested(Exception):
    """Raised on every rank at the end of the RL step in which the run got SIGTERM or Ctrl-C."""


class StopAtStepEnd(Callback):
    """SIGTERM and a first Ctrl-C (SIGINT) stop the run at the end of its RL step, saving
    ``path`` (``interrupted.ckpt``); a second Ctrl-C stops at once, saving nothing. A failure in
    the middle of a step saves nothing either: a half-done step (weights updated, its metrics not
    logged) would resume to other metrics than an uninterrupted run, so the resume then takes the
    last periodic checkpoint. ``path`` is removed when a fit ends normally.

    Lightning's own SIGTERM handler is replaced once training starts: it broadcasts from inside
    the handler, which on several ranks can meet another collective and hang (seen with two gloo
    ranks); here rank 0's decision is broadcast at the step's end, where every rank is. Not
    Lightning's ``OnExceptionCheckpoint`` either: with one, ``fit(ckpt_path=None)`` silently
    resumes from the newest checkpoint in the folder, even where no resume was asked.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.in_step = False
        self.signal: str | None = None
        self.hard = False
        self.saved = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopAtStepEnd:
        self._install(signal.SIGINT)  # SIGTERM once Lightning has set its own (on_train_start)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:  # Lightning restores SIGTERM itself
                signal.signal(signum, previous)
        self._previous = {}

    def _install(self, signum: int) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None and signum == signal.SIGINT:
            self.hard = True
            raise KeyboardInterrupt
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            what = "Ctrl-C" if signum == signal.SIGINT else self.signal
            _say(f"\n[creditlab] {what}: stopping after this RL step and saving a checkpoint"
                 + (" (Ctrl-C again stops at once, without saving the step)" if signum == signal.SIGINT else ""))

    def on_train_start(self, *args: Any, **kwargs: Any) -> None:
        self._install(signal.SIGTERM)

    def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
        self.in_step = True

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self.in_step = False
        stop = self.signal is not None
        if trainer.world_size > 1:
            stop = bool(trainer.strategy.broadcast(stop, src=0))
        if stop and trainer.global_step < trainer.max_steps:  # the last step: let the run finish
            raise StopRequested(self.signal or "SIGTERM")

    def on_exception(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        # global step 0: nothing trained yet, and the step-0 evaluation would be logged twice
        if not self.in_step and trainer.global_step > 0:
            trainer.save_checkpoint(self.path, weights_only=False)
            self.saved = True

    def teardown(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        trainer.strategy.remove_checkpoint(self.path)


class AdapterCheckpoint(Callback):
    """Saves a LoRA run's adapter in ``peft`` format (``save_pretrained``) to ``dirpath`` at every
    checkpoint and at the end of training (rank 0), loadable with
    ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), dirpath)``; the
    base model's path is in its ``adapter_config.json``."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = Path(dirpath)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        self._save(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._save(trainer, pl_module)

    def _save(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.is_global_zero:
            pl_module.policy.save_pretrained(str(self.dirpath))


def _summarize(rows: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    evals = [r for r in rows if "eval/pass@1" in r]
    train = [r for r in rows if "train/reward/mean" in r]
    summary: dict[str, Any] = {"steps": max((r["step"] for r in train), default=0)}
    if evals:
        summary["eval_pass@1_first"] = evals[0]["eval/pass@1"]
        summary["eval_pass@1_last"] = evals[-1]["eval/pass@1"]
        summary["eval_steps"] = [r["step"] for r in evals]
        if "eval/sample_accuracy" in evals[0]:
            summary["eval_sample_accuracy_first"] = evals[0]["eval/sample_accuracy"]
            summary["eval_sample_accuracy_last"] = evals[-1]["eval/sample_accuracy"]
        if (gain := headline(read_records(out_dir))) is not None:
            summary["headline"] = gain.as_dict()
            summary["headline_text"] = gain.describe()
    if train:
        summary["train_reward_last"] = train[-1]["train/reward/mean"]
        summary["time_s"] = train[-1].get("time/train_s")
    try:
        summary["plot"] = str(_plot(train, evals, out_dir / "curves.png"))
    except Exception as exc:  # plotting must never lose a finished run
        log.warning("could not plot learning curves: %s", exc)
    return summary


def _plot(train: list[dict[str, Any]], evals: list[dict[str, Any]], path: Path) -> Path:
    fig = Figure(figsize=(6, 3.5))  # no pyplot: no global figure state, no GUI backend
    ax = fig.subplots()
    ax.plot([r["step"] for r in train], [r["train/reward/mean"] for r in train], label="train reward", alpha=0.6)
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval/pass@1"] for r in evals], "o-", label="held-out pass@1 (greedy)")
        sampled = [r for r in evals if "eval/sample_accuracy" in r]
        if sampled:
            ax.plot([r["step"] for r in sampled], [r["eval/sample_accuracy"] for r in sampled], "s--",
                    label="held-out sampled accuracy")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


@rank_zero_only
def _record(path: Path, **values: Any) -> None:
    """Add ``values`` to the JSON object in ``path`` (created when missing)."""
    data = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**data, **values}, indent=2))


def _print_summary(summary: dict[str, Any], out_dir: Path, model_path: str) -> None:
    lines = [f"[creditlab] run finished: {out_dir}"]
    if "eval_pass@1_first" in summary:
        lines.append(
            f"  held-out pass@1: {summary['eval_pass@1_first']:.3f} (step 0) -> "
            f"{summary['eval_pass@1_last']:.3f} (step {summary['eval_steps'][-1]}), greedy"
        )
    if "eval_sample_accuracy_first" in summary:
        lines.append(
            f"  held-out sampled accuracy: {summary['eval_sample_accuracy_first']:.3f} -> "
            f"{summary['eval_sample_accuracy_last']:.3f}"
        )
    if "headline_text" in summary:
        lines.append(f"  headline: {summary['headline_text']}")
    lines.append(f"  metrics: {out_dir / 'metrics.jsonl'}   config: {out_dir / 'config.yaml'}")
    if "plot" in summary:
        lines.append(f"  plot:    {summary['plot']}")
    wandb_dir = out_dir / "wandb"
    if wandb_dir.exists():
        lines.append(f"  W&B offline run: {wandb_dir} (upload with `wandb sync {wandb_dir}/offline-run-*`)")
    lines.append(f"  model:   {model_path}")
    print("\n".join(lines))
