"""``creditlab credit-bench``: score every advantage estimator and reset selector against a
Monte-Carlo ground truth on the same sampled groups, without training (docs/credit-bench.md).

1. Sample ``G`` chains per prompt with the run's settings (:class:`~creditlab.step.rollout.PlainRolloutStrategy`).
2. Value every thought boundary by ``K`` continuations (:mod:`creditlab.creditbench.truth`);
   refuse to score when the truth is mostly noise.
3. Run each estimator on the groups (its config from ``conf/advantage/<name>.yaml``, its segmenter
   the one a method config pairs it with, else ``thought``), reduce its per-token advantages to
   per-thought credit and score it (:mod:`creditlab.creditbench.scores`); run each reset
   selector on the failed chains.
4. Intervals by bootstrap over prompts; costs per part.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf

from creditlab.creditbench.result import (
    REDUCTIONS,
    SCORES,
    BenchResult,
    EstimatorScores,
    Interval,
    SelectorScores,
    Separation,
)
from creditlab.creditbench.scores import (
    CreditScorer,
    interval,
    intervals,
    most_negative,
    prompt_weights,
    selector_scores,
    weighted_mean,
)
from creditlab.creditbench.truth import ChainTruth, compute_truth, k_needed, noise
from creditlab.errors import ConfigError
from creditlab.registry import REGISTRIES, conf_dirs
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import build_config, build_parts, validate
from creditlab.run.memory import auto_token_budget
from creditlab.run.memory_budget import peak_memory, reset_peak_memory
from creditlab.run.models import load_policy
from creditlab.step.generation import completion_spans, span_texts
from creditlab.step.policy import ModelPolicyHandle
from creditlab.step.rollout import PlainRolloutStrategy, RolloutSampler, collate, with_segments
from creditlab.types import Spans, Trajectory

#: Run-config overrides the bench applies before the user's: chains sampled thought by thought,
#: and thought segments for the estimators that segment.
BENCH_DEFAULTS = ["rollout.thoughts=true", "segmenter=thought"]


class BenchError(ConfigError):
    """The bench cannot score (bad settings, or a truth too noisy for the effects measured)."""


@dataclass(frozen=True)
class BenchSettings:
    """Attributes:
    prompts: Prompts of ``split`` (the first ones, in the task's order).
    k: Monte-Carlo continuations per state (>= 2).
    split: Task split.
    estimators: Names to score (None = every registered estimator).
    selectors: Names to score (None = every registered selector except ``none``; ``oracle`` only
        when the task has a step oracle).
    sign_threshold: |A_k| above which a step's sign is scored.
    min_reliability: The advantage reliability below which the bench refuses to score.
    bootstrap: Resamples of prompts for the intervals.
    rank_by: ``"<score>/<reduction>"`` the estimators are ranked by.
    """

    prompts: int = 64
    k: int = 32
    split: str = "test"
    estimators: tuple[str, ...] | None = None
    selectors: tuple[str, ...] | None = None
    sign_threshold: float = 0.25
    min_reliability: float = 0.5
    bootstrap: int = 1000
    rank_by: str = "error/mean"

    def check(self) -> None:
        """Raise BenchError naming the bad setting (before anything loads)."""
        if self.prompts < 2:
            raise BenchError(f"--prompts must be at least 2 (intervals resample prompts); got {self.prompts}")
        if self.k < 2:
            raise BenchError(f"--k must be at least 2 continuations per state (the noise estimate needs two halves); got {self.k}")
        if not 0 < self.min_reliability < 1:
            raise BenchError(f"--min-reliability must be between 0 and 1; got {self.min_reliability}")
        if self.bootstrap < 100:
            raise BenchError(f"--bootstrap must be at least 100 resamples; got {self.bootstrap}")
        score, _, reduction = self.rank_by.partition("/")
        if score not in SCORES or reduction not in REDUCTIONS:
            raise BenchError(f"--rank-by must be <score>/<reduction> with score in {', '.join(SCORES)} and "
                             f"reduction in {', '.join(REDUCTIONS)}; got {self.rank_by!r}")
        for kind, names in (("advantage", self.estimators), ("reset_selector", self.selectors)):
            for name in names or ():
                REGISTRIES[kind].get(name)  # RegistryError naming the options


def method_segmenters() -> dict[str, str]:
    """Estimator name -> the segmenter a method config pairs it with (``defaults`` of every
    ``method/*.yaml`` in creditlab's and the plug-ins' config folders)."""
    out: dict[str, str] = {}
    for folder in [CONF_DIR, *(Path(path) for _, path in conf_dirs())]:
        for path in sorted((folder / "method").glob("*.yaml")) if (folder / "method").is_dir() else ():
            chosen: dict[str, str] = {}
            for entry in OmegaConf.load(path).get("defaults", []) or []:
                if isinstance(entry, DictConfig):
                    for key, value in entry.items():
                        chosen[str(key).split("/")[-1]] = str(value)
            if "advantage" in chosen and "segmenter" in chosen:
                out.setdefault(chosen["advantage"], chosen["segmenter"])
    return out


def _section(cfg: DictConfig, kind: str) -> tuple[type, Any]:
    """``(class, checked config)`` of one part's section of a composed config."""
    options = dict(OmegaConf.to_container(cfg[kind], resolve=True) or {})
    cls = REGISTRIES[kind].get(options.pop("name", None) or "")
    return cls, build_config(cls.Config, options, kind)


def part_sections(overrides: list[str], kind: str, names: Sequence[str],
                  extra: Callable[[str], list[str]]) -> dict[str, dict[str, tuple[type, Any]]]:
    """``name -> {kind: (class, config), "segmenter": (class, config)}`` from the run composed with
    ``<kind>=<name>`` (its shipped config) and ``extra(name)``; a name without a config file gets
    its class defaults."""
    out = {}
    for name in names:
        try:
            cfg = compose([*BENCH_DEFAULTS, *overrides, f"{kind}={name}", *extra(name)])
            out[name] = {kind: _section(cfg, kind)}
        except MissingConfigException:  # a plug-in part without a shipped config: its defaults
            cfg = compose([*BENCH_DEFAULTS, *overrides, *extra(name)])
            cls = REGISTRIES[kind].get(name)
            out[name] = {kind: (cls, build_config(cls.Config, {}, kind))}
        out[name]["segmenter"] = _section(cfg, "segmenter")
    return out


class CountingHandle(ModelPolicyHandle):
    """The policy handle, counting the tokens of extra forward passes (``forward_tokens``)."""

    forward_tokens = 0

    def logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.forward_tokens += int(attention_mask.sum())
        return super().logprobs(input_ids, attention_mask, positions)

    def branch_logprobs(self, input_ids, attention_mask, rows, at, branch_ids, branch_mask, *, chunk=0):  # type: ignore[no-untyped-def]
        self.forward_tokens += int(attention_mask[rows.unique()].sum() + branch_mask.sum()) if len(rows) else 0
        return super().branch_logprobs(input_ids, attention_mask, rows, at, branch_ids, branch_mask, chunk=chunk)

    def read_logits(self, input_ids, attention_mask, read, *, frozen=0):  # type: ignore[no-untyped-def]
        self.forward_tokens += int(attention_mask.sum())
        return super().read_logits(input_ids, attention_mask, read, frozen=frozen)

    def branch_read_logits(self, input_ids, attention_mask, rows, at, branch_ids, branch_mask, read, *, chunk=0):  # type: ignore[no-untyped-def]
        self.forward_tokens += int(attention_mask[rows.unique()].sum() + branch_mask.sum()) if len(rows) else 0
        return super().branch_read_logits(input_ids, attention_mask, rows, at, branch_ids, branch_mask, read, chunk=chunk)

    def input_gradients(self, input_ids, attention_mask, objective, *, embedding_offset=None, read=None, frozen=0):  # type: ignore[no-untyped-def]
        self.forward_tokens += int(attention_mask.sum())
        return super().input_gradients(
            input_ids, attention_mask, objective, embedding_offset=embedding_offset, read=read, frozen=frozen)


def per_thought(adv: torch.Tensor, mask: torch.Tensor, spans: Spans) -> tuple[np.ndarray, np.ndarray]:
    """(n,) credit per thought of one row: the sum and the mean of ``adv`` (T,) over the thought's
    trained tokens (``mask`` (T,) > 0; a thought with none gets 0)."""
    sums, means = [], []
    for a, e in spans:
        m = mask[a:e] > 0
        s = float(adv[a:e][m].sum()) if m.any() else 0.0
        sums.append(s)
        means.append(s / int(m.sum()) if m.any() else 0.0)
    return np.array(sums), np.array(means)


class Bench:
    """One bench run: loads the model and parts, samples the groups and the truth, scores parts.

    Args:
        overrides: Hydra overrides of the run config (``model=...``, ``task=...``, ``seed=...``).
        settings: The bench's own settings.
        say: Where progress lines go.
    """

    def __init__(self, overrides: list[str], settings: BenchSettings, say: Callable[[str], None] = print) -> None:
        settings.check()
        self.settings, self.overrides, self.say, self.tokens = settings, list(overrides), say, 0  # tokens: set at load
        self.cfg = compose([*BENCH_DEFAULTS, *overrides])
        self.checked = validate(self.cfg)
        self.seed = self.checked["run"].seed
        est = list(settings.estimators or REGISTRIES["advantage"].names())
        segs = method_segmenters()
        self.estimators = part_sections(overrides, "advantage", est, lambda n: [f"segmenter={segs[n]}"] if n in segs else [])
        sel = list(settings.selectors or [n for n in REGISTRIES["reset_selector"].names() if n != "none"])
        self.selectors = part_sections(overrides, "reset_selector", sel, lambda n: [])
        task_cls, task_cfg = self.checked["task"]
        self.task = task_cls(task_cfg)
        problems = list(self.task.load(settings.split))
        if len(problems) < settings.prompts:
            raise BenchError(f"--prompts {settings.prompts} but split '{settings.split}' of task "
                             f"'{self.cfg.task.name}' has {len(problems)} problems; ask for at most that many")
        self.problems = problems[: settings.prompts]
        if settings.selectors is None and self.problems[0].oracle is None:
            self.selectors.pop("oracle", None)

    def handle(self, model: Any, tokenizer: Any, backend: Any, sampler: RolloutSampler, stream: int,
               tokens: int = 0) -> CountingHandle:
        rollout = self.checked["rollout"]
        rng = torch.Generator().manual_seed(self.seed * 1009 + stream)
        # Estimators see every chain at once; forwards take a training step's rows at most (loss.micro_batch_size,
        # else prompts_per_step x G) and, with autograd, its token budget: no more memory than a step of the run.
        micro = self.checked["loss"].micro_batch_size or self.checked["run"].prompts_per_step * rollout.group_size
        return CountingHandle(model, tokenizer, backend, rng, rollout.temperature, micro,
                              rollout_fn=sampler, chat_template=rollout.chat_template,
                              fused_head=self.checked["loss"].fused_head, micro_batch_tokens=tokens)

    def run(self, progress: Callable[[int, int], None] | None = None) -> BenchResult:
        """Sample, value, score; ``progress(done, total)`` after each chunk of continuations. The
        run config's ``threads`` (0: torch's default) holds for the bench only, as for a run."""
        before, threads = torch.get_num_threads(), self.checked["run"].threads
        if threads:
            torch.set_num_threads(threads)
        try:
            return self._run(progress)
        finally:
            torch.set_num_threads(before)

    def _run(self, progress: Callable[[int, int], None] | None) -> BenchResult:
        s, rollout = self.settings, self.checked["rollout"]
        t0 = time.perf_counter()
        reset_peak_memory()
        model, tokenizer, model_path = load_policy(self.checked["model"], self.seed)
        self.model = model
        parts = build_parts(self.checked, model, tokenizer, task=self.task)
        sampler = RolloutSampler(rollout, parts["backend"], parts["verifier"])
        backend = parts["backend"]
        self.tokens, sized = auto_token_budget(self.cfg, self.checked, model.config, tokenizer, self.problems, self.problems)
        if sized:
            self.say(f"[credit-bench] loss.micro_batch_tokens=auto: {self.tokens} tokens ({sized['how']})")
        ctx = self.handle(model, tokenizer, backend, sampler, 0, self.tokens)
        trajs = PlainRolloutStrategy(rollout=rollout).collect(self.problems, ctx, sampler, self.seed)
        prompt_of = np.array([t.group_id for t in trajs])
        delim = tokenizer.encode(rollout.delimiter, add_special_tokens=False)
        spans = [completion_spans(t.completion, delim, tokenizer.eos_token_id) for t in trajs]
        self.say(f"[credit-bench] {len(trajs)} chains of {len(self.problems)} prompts; valuing every "
                 f"thought boundary with K = {s.k} continuations")
        truth, counts = compute_truth(trajs, prompt_of, spans, sampler, s.k, self.seed + 1, progress)
        truth_cost = {"seconds": time.perf_counter() - t0, "generated_tokens": float(sampler.take_generated_tokens()), **peak_memory()}
        noise_stats = noise(truth, counts["value_halves"])
        self.refuse_if_noisy(noise_stats)

        failed = np.array([t.reward < rollout.success_reward for t in trajs])
        weights = prompt_weights(prompt_of, len(self.problems), s.bootstrap, self.seed)
        first_wrong = [self.first_wrong(t, sp, tokenizer) if f else None for t, sp, f in zip(trajs, spans, failed)]
        estimators = [self.score_estimator(name, trajs, truth, failed, weights, backend, tokenizer, sampler)
                      for name in self.estimators]
        ranked = self.rank(estimators)
        selectors = [self.score_selector(name, trajs, spans, truth, failed, first_wrong, weights, backend, tokenizer, sampler)
                     for name in self.selectors]
        selectors.sort(key=lambda x: -x.scores["exact"].value if "exact" in x.scores else 1.0)  # ranked by exact
        ref = [i for i in range(len(trajs)) if failed[i] and len(truth[i].advantages)]  # the reference: always thought 0
        first = selector_scores([truth[i].advantages for i in ref], [0] * len(ref), [first_wrong[i] for i in ref],
                                weights[:, ref]) if ref and selectors else None
        for part in parts.values():
            getattr(part, "close", lambda: None)()
        settings = {"model": str(model_path), "task": str(self.cfg.task.name), "split": s.split,
                    "prompts": len(self.problems), "group_size": rollout.group_size, "k": s.k,
                    "seed": self.seed, "sign_threshold": s.sign_threshold, "bootstrap": s.bootstrap,
                    "thoughts": rollout.thoughts, "temperature": rollout.temperature}
        return BenchResult(
            settings=settings,
            counts={"chains": len(trajs), "failed_chains": int(failed.sum()),
                    "thoughts": int(sum(len(c.advantages) for c in truth)),
                    "states": counts["states"], "continuations": counts["continuations"]},
            noise=noise_stats, instrument=self.instrument(truth, failed, first_wrong, weights),
            rank_by=s.rank_by, estimators=ranked[0], separations=ranked[1],
            selectors=selectors, truth_cost=truth_cost, first_thought=first,
        )

    def refuse_if_noisy(self, stats: dict[str, float]) -> None:
        r, k, target = stats["advantage_reliability"], self.settings.k, self.settings.min_reliability
        if np.isfinite(r) and r >= target:
            return
        need = k_needed(k, r, target)
        fix = f"raise --k to at least {need}" if need else "the truth shows no step effects at all: more prompts, or a task the model sometimes fails"
        raise BenchError(
            f"the Monte-Carlo truth is too noisy to score against: with K = {k} continuations the step "
            f"advantages' reliability is {r:.2f} (mean standard error {stats['advantage_se']:.3f}), below "
            f"--min-reliability {target}; {fix} (noise variance falls as 1/K)."
        )

    def first_wrong(self, traj: Trajectory, spans: Spans, tokenizer: Any) -> int | None:
        """The task oracle's first wrong thought of a failed chain (None without an oracle)."""
        if traj.problem.oracle is None or not spans:
            return None
        k = traj.problem.oracle(span_texts(tokenizer, traj.completion.response_ids, spans))
        return None if k is None else min(k, len(spans) - 1)

    def instrument(self, truth: list[ChainTruth], failed: np.ndarray, first_wrong: list[int | None],
                   weights: np.ndarray) -> dict[str, Interval] | None:
        """Share of failed chains whose most-negative MC step is the oracle's first wrong step."""
        hits = np.array([np.nan if (not f or o is None or not len(c.advantages)) else float(most_negative(c.advantages) == o)
                         for c, f, o in zip(truth, failed, first_wrong)])
        if np.isnan(hits).all():
            return None
        draws = np.array([weighted_mean(hits, w) for w in weights])
        return {"most_negative_is_first_wrong": interval(draws[0], draws[1:])}

    def score_estimator(self, name: str, trajs: list[Trajectory], truth: list[ChainTruth], failed: np.ndarray,
                        weights: np.ndarray, backend: Any, tokenizer: Any,
                        sampler: RolloutSampler) -> tuple[EstimatorScores, dict[str, np.ndarray]]:
        """Scores with intervals, and the bootstrap draws of each (for paired differences)."""
        checked = self.estimators[name]
        try:
            (est_cls, est_cfg), (seg_cls, seg_cfg) = checked["advantage"], checked["segmenter"]
            estimator, segmenter = est_cls(est_cfg), seg_cls(seg_cfg, tokenizer=tokenizer)
            sampler.take_generated_tokens()
            ctx = self.handle(self.model, tokenizer, backend, sampler, 1, self.tokens)
            device = next(self.model.parameters()).device  # as in training: the batch on the policy's device
            batch = collate(trajs, tokenizer.pad_token_id, self.checked["rollout"].truncation, device)
            batch = with_segments(batch, segmenter.segment(batch))
            reset_peak_memory()
            t0 = time.perf_counter()
            adv = estimator.estimate(batch, ctx).values.float().cpu()
            loss_mask = batch.loss_mask.cpu()
            seconds = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - one estimator's failure is reported, not fatal
            return EstimatorScores(name, error=f"{type(exc).__name__}: {exc}"), {}
        cost = {"seconds": seconds, "generated_tokens": float(sampler.take_generated_tokens() + ctx.generated_tokens),
                "forward_tokens": float(ctx.forward_tokens), **peak_memory()}
        scores: dict[str, Interval] = {}
        draws: dict[str, np.ndarray] = {}
        true_a = [c.advantages for c in truth]
        points: list[tuple[float, float]] = []
        for reduction in REDUCTIONS:
            credit = [per_thought(adv[b], loss_mask[b], c.spans)[reduction == "mean"] for b, c in enumerate(truth)]
            if reduction == "mean":
                points = [(float(a), float(e)) for t, cr in zip(true_a, credit) for a, e in zip(t, cr)]
            got, d = intervals(CreditScorer(true_a, credit, failed, self.settings.sign_threshold), weights)
            scores.update({f"{k}/{reduction}": v for k, v in got.items()})
            draws.update({f"{k}/{reduction}": v for k, v in d.items()})
        return EstimatorScores(name, scores, cost, tuple(points)), draws

    def rank(self, scored: list[tuple[EstimatorScores, dict[str, np.ndarray]]]) -> tuple[list[EstimatorScores], list[Separation]]:
        """Best first by the ranking score (``error``: lowest first), failed ones last; and the
        paired-bootstrap difference between each adjacent pair."""
        key = self.settings.rank_by
        sign = -1.0 if key.startswith("error/") else 1.0
        draws = {e.name: d for e, d in scored}
        ok = sorted((e for e, _ in scored if e.error is None), key=lambda e: -sign * e.scores[key].value)
        seps = []
        for better, worse in pairwise(ok):
            diff = sign * (draws[better.name][key] - draws[worse.name][key])
            value = sign * (better.scores[key].value - worse.scores[key].value)
            seps.append(Separation(better.name, worse.name, interval(value, diff)))
        return ok + [e for e, _ in scored if e.error is not None], seps

    def score_selector(self, name: str, trajs: list[Trajectory], spans: list[Spans], truth: list[ChainTruth],
                       failed: np.ndarray, first_wrong: list[int | None], weights: np.ndarray,
                       backend: Any, tokenizer: Any, sampler: RolloutSampler) -> SelectorScores:
        rows = [i for i in range(len(trajs)) if failed[i] and len(truth[i].advantages)]
        try:
            sel_cls, sel_cfg = self.selectors[name]["reset_selector"]
            selector = sel_cls(sel_cfg)
            sampler.take_generated_tokens()
            ctx = self.handle(self.model, tokenizer, backend, sampler, 2, self.tokens)
            reset_peak_memory()
            t0 = time.perf_counter()
            points = selector.select_many([trajs[i] for i in rows], [spans[i] for i in rows], ctx)
            seconds = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            return SelectorScores(name, error=f"{type(exc).__name__}: {exc}")
        # As the reset buffer does: no answer resets at the first thought; indices are clamped.
        picks = [0 if p.segment is None else min(max(p.segment, 0), len(spans[i]) - 1) for p, i in zip(points, rows)]
        scores = selector_scores([truth[i].advantages for i in rows], picks, [first_wrong[i] for i in rows], weights[:, rows])
        statuses = [str(p.info["status"]) for p in points if p.info and "status" in p.info]
        shares = {s: statuses.count(s) / len(rows) for s in sorted(set(statuses))}
        cost = {"seconds": seconds, "generated_tokens": float(sampler.take_generated_tokens() + ctx.generated_tokens),
                "forward_tokens": float(ctx.forward_tokens), **peak_memory()}
        return SelectorScores(name, scores, cost, chains=len(rows), statuses=shares)
