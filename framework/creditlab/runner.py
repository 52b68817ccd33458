"""One rank's run: build the model, the parts, the data and the module from validated config
sections, fit them with a ``lightning.Trainer``, and (rank 0) summarize the run directory."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.utilities import rank_zero_only
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf

from creditlab.config import build_parts
from creditlab.datamodule import TaskDataModule
from creditlab.loggers import JsonlLogger, read_metrics
from creditlab.models import is_peft, load_policy
from creditlab.module import CreditAssignmentModule, Parts
from creditlab.rollout import RolloutSampler

log = logging.getLogger(__name__)

# The policy stays in eval mode (no dropout) so trainer log-probs match the sampler's; checkpoints
# are taken after the optimizer step on purpose; batches are a function of the step, so the
# step loader needs no state to resume; the run resolves its own resume checkpoint (`resume`), so
# Lightning's "ckpt_path=None ... last" guess (made because OnExceptionCheckpoint is present) is moot.
for _pattern in (
    r"Found \d+ module\(s\) in eval mode",
    r"Using ModelCheckpoint with manual optimization",
    r"You're resuming from a checkpoint that ended before the epoch ended",
    r"Checkpoint directory .* exists and is not empty",
    r"`\.fit\(ckpt_path=None\)` was called without a model",
    r'\.fit\(ckpt_path="last"\) is set, but there is no last checkpoint available',
):
    warnings.filterwarnings("ignore", message=_pattern)


def _resume_path(resume: str | None, out_dir: Path) -> Path | None:
    if not resume:
        return None
    if resume == "auto":
        last = out_dir / "checkpoints" / "last.ckpt"
        return last if last.exists() else None
    path = Path(resume)
    if not path.exists():
        raise FileNotFoundError(f"resume={resume}: no such checkpoint. Use resume=auto or null.")
    return path


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
        logger.log_hyperparams({**OmegaConf.to_container(cfg, resolve=True), "recorded": recorded or {}})
        loggers.append(logger)
    return loggers


def fit(cfg: DictConfig, checked: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Build model, parts, data, module and trainer; fit; return the run's summary (rank 0; other
    ranks return ``{}``). One process of the run: :mod:`creditlab.launch` decides how many."""
    run_cfg, rollout, loss, eval_cfg = checked["run"], checked["rollout"], checked["loss"], checked["eval"]
    L.seed_everything(run_cfg.seed, workers=True, verbose=False)

    model, tokenizer, model_path = load_policy(checked["model"], run_cfg.seed)
    parts = build_parts(checked, model, tokenizer)
    described = {"accelerator": checked["model"].accelerator, "backend": parts["backend"].describe()}
    _record(out_dir / "environment.json", model_path=str(model_path), **described)
    reference = None
    if loss.kl_coef > 0:
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    sampler = RolloutSampler(rollout, parts["backend"], parts["verifier"])
    steps = int(cfg.trainer.max_steps)
    data = TaskDataModule(parts["task"], run_cfg.prompts_per_step, steps, run_cfg.seed)
    data.train_problems  # load and check both splits now: bad data fails before training starts
    module = CreditAssignmentModule(
        model, tokenizer,
        Parts(parts["backend"], parts["verifier"], parts["segmenter"], parts["advantage"],
              parts["rollout"], sampler, parts["reset_selector"]),
        data.problems_for_step, data.test_problems, loss, rollout, eval_cfg,
        instantiate(cfg.optim, _partial_=True), run_cfg.seed, run_cfg.grad_clip, reference,
    )

    ckpt = _resume_path(run_cfg.resume, out_dir)
    resume_step = None
    if ckpt is not None:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        resume_step = int(state["global_step"]) // loss.updates_per_batch
        print(f"[creditlab] resuming from {ckpt} at RL step {resume_step}")
    updates = loss.updates_per_batch
    every = run_cfg.checkpoint_every or steps
    callbacks = [ModelCheckpoint(
        dirpath=out_dir / "checkpoints", filename="step{step}", every_n_train_steps=every * updates,
        save_last=True, save_top_k=1, monitor=None, auto_insert_metric_name=False,
    ), OnExceptionCheckpoint(dirpath=out_dir / "checkpoints", filename="interrupted")]
    if is_peft(model):
        callbacks.append(AdapterCheckpoint(out_dir / "adapter"))
    trainer_cfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    # The step loader yields step indices; the module shards each step's prompts over the ranks.
    trainer_cfg.update(max_steps=steps * updates, max_epochs=-1, default_root_dir=str(out_dir),
                       use_distributed_sampler=False)
    loggers = _loggers(cfg, out_dir, resume_step, run_cfg, described)
    trainer = instantiate(trainer_cfg, callbacks=callbacks, logger=loggers)
    try:
        trainer.fit(module, train_dataloaders=data.train_dataloader(), ckpt_path=str(ckpt) if ckpt else None)
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
    lines.append(f"  metrics: {out_dir / 'metrics.jsonl'}   config: {out_dir / 'config.yaml'}")
    if "plot" in summary:
        lines.append(f"  plot:    {summary['plot']}")
    wandb_dir = out_dir / "wandb"
    if wandb_dir.exists():
        lines.append(f"  W&B offline run: {wandb_dir} (upload with `wandb sync {wandb_dir}/offline-run-*`)")
    lines.append(f"  model:   {model_path}")
    print("\n".join(lines))
