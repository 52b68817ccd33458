"""bf16 on the CPU, the closest stand-in here for a GPU's precision (issue 28, item 4): every method
preset in conf/method/ runs 3 steps on ``trainer=cpu`` with ``trainer.precision=bf16-mixed`` and the
integration tests' small settings (``SMALL``, with tests/gpu/test_train_cuda.py's per-preset
``EXTRA``), finite and learning.

The small model (40 warm-start steps) never solves a problem, so every reward would be 0, every
advantage 0 and nothing would train (nor would any estimator's arithmetic be exercised). The runs
therefore penalize truncation (``rollout.truncation=penalize``, reward -1 for a completion cut at
the 32-token limit, 0 otherwise): the real verifier, rollouts and estimators, with rewards that
differ within groups.

Each run is observed in process (wrappers on :class:`~creditlab.step.module.CreditAssignmentModule`,
the policy class's ``forward`` and the fused decoder's step; nothing is taken from the config; an
observed run's metrics.jsonl equals an unobserved one's, checked for every preset) and must show:

* **bf16 autocast**: every training step ran inside CPU autocast with dtype bfloat16, and the
  policy's logits were bfloat16 in the rollouts (the model's forwards and the fused decoding
  steps), in the estimator (OAR-P/OAR-G probes and input gradients, RREDCoT values, Monte-Carlo
  value rollouts), in the update and in every evaluation (step 0 and the last one too, which
  Lightning runs outside ``training_step``: the module enters the training precision itself);
  the master weights stayed float32. The ``32-true`` run of the same preset, the control, saw
  float32 logits everywhere.
* **finite**: ``status.json`` finished, training rows for steps 1..3, every metric finite.
* **learning**, deterministic for the seed: at every step some trained token had a non-zero
  advantage, the weights moved and stayed finite, and the bf16 gradient of the step's loss points
  where the float32 gradient of the same loss on the same batch from the same weights points
  (cosine > 0.99; the float32 one is computed first, with autocast off); at step 1 (Adam's first
  step follows the gradient's sign, with no momentum from other batches) the float32 loss on the
  step's own batch went down. A zeroed, NaN or scrambled bf16 gradient fails these (checked by
  mutation: zeroing fails "moved", noise fails the cosine).

``pytest -s`` prints, per preset, the dtypes seen and each update's numbers beside the control's.
Seen on the 2-core CI machine: bf16 and float32 gradients agree to a cosine of 1 - 1e-5 on this
tiny model; the first step samples the same tokens in both precisions (same rewards; only the
engine/trainer log-prob mismatch, entropy and gradient norm differ), later steps may not.
Runs use one torch thread: with the machine busy, 2 threads ran up to 10x slower (OpenMP). The
file takes 25-40 s there (10 presets x 2 runs, 2.5-4 s a preset, by load) once the small model is
built (shared with the other integration tests).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.helpers import check_finished_run
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow

METHODS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "method").glob("*.yaml"))
#: Per-preset settings that keep a 3-step run short (as tests/gpu/test_train_cuda.py).
EXTRA = {"vineppo": ["advantage.rollouts=2"], "srpo": ["reset_selector.max_new_tokens=8"]}
#: Rewards that differ within a group on the small model (see the module docstring).
SIGNAL = ["rollout.truncation=penalize", "rollout.truncation_reward=-1"]
#: IBPO moves credit only in groups with both outcomes: a completion that ends counts as correct.
#: reward_flip flips r -> 1 - r and needs rewards in [0, 1]: truncation scores 0, and the flips
#: (rate 0.25) are the signal. RAFT trains only on successes (reward >= its threshold, 1 by
#: default): a completion that ends (reward 0) counts as one.
SIGNAL_EXTRA = {"ibpo": ["rollout.success_reward=0"], "reward_flip": ["rollout.truncation_reward=0"],
                "raft": ["advantage.threshold=0"]}
STEPS = 3


def _overrides(run_dir: Path, method: str, precision: str) -> list[str]:
    return [*SMALL, *SIGNAL, "threads=1", "trainer=cpu", f"trainer.precision={precision}",
            f"trainer.max_steps={STEPS}", f"method={method}", f"run_dir={run_dir}",
            *EXTRA.get(method, []), *SIGNAL_EXTRA.get(method, [])]


def _autocast() -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


@dataclass
class Seen:
    """What the wrappers saw during one run."""

    step_autocast: list[tuple[bool, torch.dtype]] = field(default_factory=list)  # per training step
    evals: list[tuple[int, bool, list[str]]] = field(default_factory=list)  # step, autocast, dtypes
    # logits dtype of each policy forward (and fused decoding step) in the rollouts, the
    # estimator and the update (backward_rows)
    rollout_logits: list[torch.dtype] = field(default_factory=list)
    fused_logits: list[torch.dtype] = field(default_factory=list)  # the rollouts' fused decoding steps
    estimate_logits: list[torch.dtype] = field(default_factory=list)
    update_logits: list[torch.dtype] = field(default_factory=list)
    param_dtypes: set[torch.dtype] = field(default_factory=set)
    updates: list[dict] = field(default_factory=list)  # per update: gradients, losses, moves


@contextlib.contextmanager
def _logits_dtypes(model: torch.nn.Module, sink: list[torch.dtype], fused: list[torch.dtype] | None = None):
    """Append the dtype of the logits of every forward of ``model`` (before any caller's cast to
    float32, e.g. :func:`creditlab.step.forward.response_logits`'s) to ``sink`` while in the block, and
    those of the fused decoder's one-token steps to ``fused`` (or ``sink``).

    Both are wrapped on their classes, signatures kept: a hook on the model, or a ``forward`` set
    on the instance, would turn the fused decoder off (:func:`creditlab.accel.support.supported`),
    and a changed signature the shared-prompt forward (:func:`creditlab.step.forward.response_logits`);
    the observed run equals an unobserved one (checked: identical metrics.jsonl)."""
    from creditlab.accel.fused_decode import FusedDecoder

    cls = type(model)
    forward, step = cls.forward, FusedDecoder.step

    @functools.wraps(forward)  # its signature too: creditlab.step.forward reads it (logits_to_keep)
    def forward_(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if self is model and getattr(out, "logits", None) is not None:
            sink.append(out.logits.dtype)
        return out

    def step_(self, tokens, positions):
        out = step(self, tokens, positions)
        (sink if fused is None else fused).append(out.dtype)
        return out

    cls.forward, FusedDecoder.step = forward_, step_
    try:
        yield
    finally:
        cls.forward, FusedDecoder.step = forward, step


def _flat_grads(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().flatten()
                      for p in params])


def _observe(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Wrap the module's step, evaluation, update, gradient clipping and update forward."""
    from creditlab.step.aggregation import MiniBatchStats
    from creditlab.step.losses import policy_loss
    from creditlab.step.module import CreditAssignmentModule as M

    seen = Seen()
    orig = {name: getattr(M, name) for name in
            ("training_step", "run_evaluation", "update", "backward_rows", "clip_gradients_and_norm")}

    def training_step(self, batch, batch_idx):
        seen.step_autocast.append(_autocast())
        estimator = self.parts.advantage
        inner = estimator.estimate

        def estimate(rollout, ctx):  # the policy's forwards inside the estimator, by logits dtype
            with _logits_dtypes(self.policy, seen.estimate_logits):
                return inner(rollout, ctx)

        strategy = self.parts.rollout
        collect = strategy.collect

        def collect_(*args, **kwargs):  # the rollouts: the policy's forwards and the fused decoding steps
            with _logits_dtypes(self.policy, seen.rollout_logits, seen.fused_logits):
                return collect(*args, **kwargs)

        estimator.estimate, strategy.collect = estimate, collect_
        try:
            return orig["training_step"](self, batch, batch_idx)
        finally:
            del estimator.estimate, strategy.collect

    def run_evaluation(self, step):
        dtypes: list[torch.dtype] = []
        with _logits_dtypes(self.policy, dtypes):
            out = orig["run_evaluation"](self, step)
        seen.evals.append((step, _autocast()[0], sorted({str(d) for d in dtypes})))
        return out

    def backward_rows(self, rollout, advantages, rows, stats, old, ref):
        with _logits_dtypes(self.policy, seen.update_logits):
            return orig["backward_rows"](self, rollout, advantages, rows, stats, old, ref)

    def fp32_loss(self, rollout, advantages, logprobs, old):
        stats = MiniBatchStats.from_mask(rollout.loss_mask, self.loss_cfg)
        loss, _ = policy_loss(logprobs, old, advantages, rollout.loss_mask, self.loss_cfg, stats)
        return float(loss)

    def update(self, rollout, advantages):
        assert self.loss_cfg.updates_per_batch == 1, "the float32 reference below is one mini-batch"
        params = [p for p in self.policy.parameters() if p.requires_grad]
        seen.param_dtypes |= {p.dtype for p in params}
        before = [p.detach().clone() for p in params]
        with torch.autocast("cpu", enabled=False):  # the float32 reference, from the same weights
            assert all(p.grad is None for p in params)
            stats = MiniBatchStats.from_mask(rollout.loss_mask, self.loss_cfg).all_reduce()
            rows = torch.arange(rollout.size, device=rollout.device)
            orig["backward_rows"](self, rollout, advantages, rows, stats, None, None)
            g32 = _flat_grads(params)
            for p in params:
                p.grad = None
            lp0 = self.old_logprobs(rollout)
        record: dict = {"g32": g32}
        seen.updates.append(record)
        out = orig["update"](self, rollout, advantages)  # under the run's precision
        with torch.autocast("cpu", enabled=False):
            lp1 = self.old_logprobs(rollout)
        record["loss_before"] = fp32_loss(self, rollout, advantages, lp0, lp0)
        record["loss_after"] = fp32_loss(self, rollout, advantages, lp1, lp0)
        record["moved"] = max(float((p.detach() - b).abs().max()) for p, b in zip(params, before))
        record["finite"] = all(bool(torch.isfinite(p).all()) for p in params)
        mask = rollout.loss_mask > 0
        record["adv_nonzero"] = int(((advantages != 0) & mask).sum())
        record["gain"] = float(((lp1 - lp0) * advantages * rollout.loss_mask).sum())  # Σ A·Δlog π
        return out

    def clip_gradients_and_norm(self):  # called once per mini-batch, before the optimizer step
        params = [p for p in self.policy.parameters() if p.requires_grad]
        seen.updates[-1]["g_run"] = _flat_grads(params)
        return orig["clip_gradients_and_norm"](self)

    for name, fn in [("training_step", training_step), ("run_evaluation", run_evaluation), ("update", update),
                     ("backward_rows", backward_rows), ("clip_gradients_and_norm", clip_gradients_and_norm)]:
        monkeypatch.setattr(M, name, fn)
    return seen


def _train(run_dir: Path, method: str, precision: str) -> tuple[Seen, list[dict]]:
    from creditlab.run.compose import compose
    from creditlab.run.launch import run

    with pytest.MonkeyPatch.context() as mp:
        seen = _observe(mp)
        summary = run(compose(_overrides(run_dir, method, precision)), run_dir)
    assert summary["steps"] == STEPS
    return seen, check_finished_run(run_dir, STEPS)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def _report(method: str, seen: Seen, control: Seen, rows: list[dict], rows32: list[dict]) -> None:
    """What the runs showed (``pytest -s``)."""
    def kinds(xs):
        return {str(k).replace("torch.", ""): xs.count(k) for k in set(xs)}

    def train(rs, key):
        return [round(r[key], 4) for r in rs if key in r and "train/reward/mean" in r]

    first, first32 = ([r for r in rs if r["step"] == 1 and "train/loss" in r][0] for rs in (rows, rows32))
    differ = sorted(k for k in first if k in first32 and first[k] != first32[k]
                    and not k.startswith(("time/", "wall")) and not k.endswith(("_s", "seconds", "per_s")))
    print(f"\n[{method}] logits (dtype: forwards) rollout {kinds(seen.rollout_logits)} + fused steps "
          f"{kinds(seen.fused_logits)} estimate "
          f"{kinds(seen.estimate_logits)} update {kinds(seen.update_logits)}; evaluations (step, autocast "
          f"at the call, logits) {seen.evals}\n  step 1, bf16 vs 32-true, differ in: {differ}")
    for name, s, rs in (("bf16", seen, rows), ("fp32", control, rows32)):
        print(f"  {name}: reward {train(rs, 'train/reward/mean')} grad_norm {train(rs, 'train/grad_norm')}")
        for u in s.updates:
            print(f"    cos {_cos(u['g_run'], u['g32']):.6f} |g| {float(u['g_run'].norm()):.4g} (fp32 "
                  f"{float(u['g32'].norm()):.4g}) fp32 loss {u['loss_before']:.5g} -> {u['loss_after']:.5g} "
                  f"sum A*dlogp {u['gain']:.3g} max|dw| {u['moved']:.3g} tokens A!=0 {u['adv_nonzero']}")


@pytest.mark.parametrize("method", METHODS)
def test_preset_trains_3_steps_in_bf16_mixed_on_cpu(tmp_path, method):
    seen, rows = _train(tmp_path / "bf16", method, "bf16-mixed")
    control, rows32 = _train(tmp_path / "fp32", method, "32-true")

    _report(method, seen, control, rows, rows32)

    # bf16 autocast, observed: every training step (rollouts, estimator, update) and every
    # evaluation (at steps 0, 2 and, from on_train_end, 3) ran inside it ...
    assert seen.step_autocast == [(True, torch.bfloat16)] * STEPS
    assert seen.rollout_logits and set(seen.rollout_logits) == {torch.bfloat16}
    assert seen.fused_logits and set(seen.fused_logits) == {torch.bfloat16}  # the fused decoder ran in it
    assert set(seen.estimate_logits) <= {torch.bfloat16}  # OAR-P/G, RREDCoT, MC values run the policy
    assert seen.update_logits and set(seen.update_logits) == {torch.bfloat16}
    assert seen.param_dtypes == {torch.float32}, "bf16-mixed keeps float32 master weights"
    bf16 = ["torch.bfloat16"]
    assert [(step, dtypes) for step, _, dtypes in seen.evals] == [(0, bf16), (2, bf16), (3, bf16)], seen.evals
    # ... and the 32-true control saw none of it.
    assert [on for on, _ in control.step_autocast] == [False] * STEPS
    assert control.fused_logits and set(control.fused_logits) == {torch.float32}
    assert set(control.rollout_logits + control.estimate_logits + control.update_logits) == {torch.float32}
    assert {d for _, _, dtypes in control.evals for d in dtypes} == {"torch.float32"}

    # learning, at every step: the weights moved, stayed finite, along the float32 gradient.
    assert len(seen.updates) == STEPS
    for step, u in enumerate(seen.updates, 1):
        assert u["adv_nonzero"] > 0, f"step {step}: every advantage is 0 (nothing to learn)"
        assert u["finite"] and u["moved"] > 0, f"step {step}: finite {u['finite']}, moved {u['moved']}"
        assert torch.isfinite(u["g_run"]).all() and u["g_run"].norm() > 0, f"step {step}: bf16 gradient"
        cos = _cos(u["g_run"], u["g32"])
        assert cos > 0.99, f"step {step}: bf16 gradient vs float32 gradient cosine {cos:.4f}"
    first = seen.updates[0]
    assert first["loss_after"] < first["loss_before"], first
    for u in control.updates:  # the control's own gradients are its float32 ones
        assert _cos(u["g_run"], u["g32"]) > 0.9999
