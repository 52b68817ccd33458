"""``creditlab eval``: held-out accuracy of a model without training (docs/real-problems.md).

The model is a preset (``model=...``, its warm start included), or a run's newest checkpoint
(``run_dir=DIR``: the run's own config, then its weights). The problems are a task's split, or a
file of the user's (``--data FILE``: GSM8K-format JSONL, read by the ``word_problems`` task). The
data is read and checked before the model loads, so a file of the wrong shape costs one line and
no minutes.

Greedy accuracy has a Wilson 95% interval over problems; sampled accuracy (``samples`` answers
per problem at the rollout temperature) a 95% t-interval of the per-problem mean over problems.
Every problem's answers, their outcomes and the step oracle's first wrong step of a wrong greedy
answer (when the task has an oracle) go to ``records.jsonl``; the numbers to ``summary.json``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from omegaconf import OmegaConf
from scipy import stats

from creditlab.analysis.stats import SamplingNoise, sampling_noise, t_quantile
from creditlab.errors import InputError
from creditlab.run.compose import CONF_DIR, compose
from creditlab.run.config import build_parts, validate
from creditlab.run.environment import cpu
from creditlab.run.models import load_policy
from creditlab.run.runner import resume_checkpoint
from creditlab.step.generation import span_texts
from creditlab.step.policy import encode_prompt
from creditlab.step.rollout import collate, sample
from creditlab.types import GenerationRequest, Problem, Trajectory


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate.

    Attributes:
        split: The task's split (``test`` by default).
        data: A GSM8K-format JSONL file instead of the task's data.
        problems: The first this many problems (0: all).
        samples: Sampled answers per problem (0: greedy only).
        temperature: Sampling temperature (``None``: the rollout's).
        batch_size: Requests per generate call.
    """

    split: str = "test"
    data: str | None = None
    problems: int = 0
    samples: int = 4
    temperature: float | None = None
    batch_size: int = 64

    def check(self) -> None:
        """Raise ``InputError`` naming the bad option."""
        if self.problems < 0:
            raise InputError(f"--problems must be >= 0 (0: all), got {self.problems}")
        if self.samples < 0:
            raise InputError(f"--samples must be >= 0 (0: greedy only), got {self.samples}")
        if self.temperature is not None and not self.temperature > 0:
            raise InputError(f"--temperature must be > 0 (greedy is always scored), got {self.temperature}")
        if self.batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.data is not None and not Path(self.data).is_file():
            raise InputError(f"--data {self.data}: no such file; give a JSONL file of question/answer rows "
                             f"(answers end with '#### <number>', as GSM8K's)")


class Answer(NamedTuple):
    """One answer to a problem: its text, whether the verifier accepted it, the completion."""

    text: str
    correct: bool
    completion: Any


@dataclass(frozen=True)
class Accuracy:
    """A mean over problems with its 95% interval."""

    mean: float
    low: float | None
    high: float | None
    problems: int
    samples: int

    def line(self, what: str) -> str:
        per = f" x {self.samples} samples" if self.samples > 1 else ""
        span = "no interval" if self.low is None else f"[{self.low:.3f}, {self.high:.3f}]"
        return f"{what} accuracy: {self.mean:.3f} {span} (95% interval, {self.problems} problems{per})"


def wilson(correct: int, n: int) -> Accuracy:
    """Greedy accuracy: ``correct`` of ``n`` with the Wilson score interval."""
    ci = stats.binomtest(correct, n).proportion_ci(0.95, method="wilson")
    return Accuracy(correct / n, float(ci.low), float(ci.high), n, 1)


def t_interval(per_problem: Sequence[float], samples: int) -> Accuracy:
    """Sampled accuracy: the mean of per-problem accuracies with a 95% t-interval over problems
    (clipped to [0, 1]; ``None`` bounds for a single problem)."""
    n = len(per_problem)
    mean = sum(per_problem) / n
    if n < 2:
        return Accuracy(mean, None, None, n, samples)
    sd = math.sqrt(sum((x - mean) ** 2 for x in per_problem) / (n - 1))
    half = t_quantile(n - 1) * sd / math.sqrt(n)
    return Accuracy(mean, max(0.0, mean - half), min(1.0, mean + half), n, samples)


def noise_line(summary: dict[str, Any]) -> str:
    """The sampled accuracy's standard error split into its two sources, and what twice the samples
    or twice the problems would make of it, from an evaluation's summary (its ``noise``:
    :class:`~creditlab.analysis.stats.SamplingNoise`, and ``sampled``)."""
    noise = SamplingNoise(**summary["noise"])
    problems, samples = summary["sampled"]["problems"], summary["sampled"]["samples"]
    se = noise.se(problems, samples)
    by_problems, by_samples = math.sqrt(noise.between / problems), math.sqrt(noise.within / (problems * samples))
    return (f"noise: standard error {se:.4f} (problems {by_problems:.4f}, sampling {by_samples:.4f}, in "
            f"quadrature); with {2 * samples} samples {noise.se(problems, 2 * samples):.4f}, with {2 * problems} "
            f"problems {noise.se(2 * problems, samples):.4f}")


def data_overrides(request: EvalRequest) -> list[str]:
    """``--data FILE``: the file read by the ``word_problems`` task (GSM8K's format), row numbers as
    ids, the ``gsm8k`` verifier, thoughts cut at line ends (the step oracle's reading)."""
    if request.data is None:
        return []
    return ["task=word_problems", f"task.path={Path(request.data).resolve()}", "task.id_field=null",
            "verifier=gsm8k", "segmenter=newline"]


def run_config(overrides: Sequence[str], request: EvalRequest) -> tuple[Any, dict[str, Any], Path | None]:
    """``(composed config, validated sections, checkpoint or None)``: the overrides composed as for
    ``creditlab train``; with ``run_dir=DIR``, that run's saved config with the overrides' plain
    keys (``rollout.max_new_tokens=...``) and its newest intact checkpoint."""
    run_dir = next((o.split("=", 1)[1] for o in overrides if o.startswith("run_dir=")), None)
    user = [o for o in overrides if not o.startswith("run_dir=")]
    data = data_overrides(request)
    if run_dir is None:
        cfg = compose([*user, *data])
        return cfg, validate(cfg), None
    saved = Path(run_dir) / "config.yaml"
    if not saved.is_file():
        raise InputError(f"run_dir={run_dir}: no config.yaml there; give the folder of a creditlab run")
    groups = {d.name for d in CONF_DIR.iterdir() if d.is_dir()}
    if chosen := [o for o in user if o.split("=", 1)[0].lstrip("+~") in groups]:
        raise InputError(f"{chosen[0]}: with run_dir= the run's own parts are evaluated; override plain keys only "
                         f"(e.g. rollout.max_new_tokens=256), or evaluate another file with --data")
    checkpoint, _ = resume_checkpoint("auto", Path(run_dir))
    if checkpoint is None:
        raise InputError(f"run_dir={run_dir}: no readable checkpoint in {run_dir}/checkpoints")
    cfg = OmegaConf.merge(OmegaConf.load(saved), OmegaConf.from_dotlist([o.lstrip("+") for o in user]))
    if data:  # the file's task and verifier replace the run's
        fresh = compose(data)
        cfg.task, cfg.verifier = fresh.task, fresh.verifier
    return cfg, validate(cfg), checkpoint


def load_checkpoint(model: Any, checkpoint: Path) -> None:
    """The policy's weights from a run's Lightning checkpoint (``policy.`` keys; frozen ones,
    left out of a LoRA run's checkpoint, stay as loaded)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)["state_dict"]
    weights = {k[len("policy."):]: v for k, v in state.items() if k.startswith("policy.")}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or (missing and len(missing) == len(model.state_dict())):
        raise InputError(f"{checkpoint}: the checkpoint does not match the model (unexpected "
                         f"{sorted(unexpected)[:3]}); evaluate it with the run's own model settings")


def evaluate_model(overrides: Sequence[str], request: EvalRequest, out: Path,
                   say: Callable[[str], None] = print) -> dict[str, Any]:
    """Load, answer, score, write ``records.jsonl`` and ``summary.json`` to ``out``; the summary."""
    request.check()
    cfg, checked, checkpoint = run_config(overrides, request)
    task_cls, task_cfg = checked["task"]
    problems = list(task_cls(task_cfg).load(request.split))  # the data, checked before the model loads
    if request.problems:
        problems = problems[: request.problems]
    if not problems:
        raise InputError(f"split '{request.split}' holds no problems")
    seed, rollout = checked["run"].seed, checked["rollout"]
    began = time.perf_counter()
    model, tokenizer, path = load_policy(checked["model"], seed)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint)
    parts = build_parts(checked, model, tokenizer, task=None)
    backend, verifier = parts["backend"], parts["verifier"]
    temperature = request.temperature if request.temperature is not None else rollout.temperature
    say(f"[eval] {len(problems)} problems of {cfg.task.name}:{request.split}, model {path}"
        + (f" + {checkpoint}" if checkpoint else "") + f"; greedy, then {request.samples} samples at T={temperature}")
    greedy = _answer(backend, verifier, tokenizer, problems, 1, rollout, 0.0, seed, request.batch_size)
    sampled = (_answer(backend, verifier, tokenizer, problems, request.samples, rollout, temperature, seed + 1,
                       request.batch_size) if request.samples else None)
    wrong = [i for i, p in enumerate(problems) if p.oracle is not None and not greedy[i][0].correct]
    first_wrong = dict(zip(wrong, first_wrong_steps([(problems[i], greedy[i][0].completion) for i in wrong],
                                                   tokenizer, parts["segmenter"])))
    records = []
    for i, p in enumerate(problems):
        answer = greedy[i][0]
        row = {"id": p.id, "problem": p.metadata.get("problem", p.prompt), "answer": p.answer,
               "greedy": {"text": answer.text, "correct": answer.correct}}
        if i in first_wrong:
            row["greedy"]["first_wrong_step"] = first_wrong[i]
        if sampled is not None:
            row["samples"] = [{"text": a.text, "correct": a.correct} for a in sampled[i]]
        records.append(row)
    greedy_acc = wilson(sum(r["greedy"]["correct"] for r in records), len(records))
    summary: dict[str, Any] = {
        "model": str(path), "checkpoint": str(checkpoint) if checkpoint else None, "task": cfg.task.name,
        "split": request.split, "data": request.data, "seed": seed, "temperature": temperature,
        "greedy": asdict(greedy_acc), "seconds": round(time.perf_counter() - began, 1),
        "cpu": cpu(), "overrides": list(overrides),
    }
    if sampled is not None:
        per = [sum(s["correct"] for s in r["samples"]) / request.samples for r in records]
        summary["sampled"] = asdict(t_interval(per, request.samples))
        noise = sampling_noise([sum(s["correct"] for s in r["samples"]) for r in records], request.samples)
        if noise is not None:
            summary["noise"] = asdict(noise)
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def first_wrong_steps(answers: list[tuple[Problem, Any]], tokenizer: Any, segmenter: Any) -> list[int | None]:
    """The step oracle's first wrong thought of each ``(problem, completion)``, the thoughts cut
    by the run's segmenter (``newline`` for word problems)."""
    if not answers:
        return []
    batch = collate([Trajectory(p, c, 0.0, i) for i, (p, c) in enumerate(answers)], tokenizer.pad_token_id)
    spans = segmenter.segment(batch).spans
    return [p.oracle(span_texts(tokenizer, c.response_ids, spans[row])) for row, (p, c) in enumerate(answers)]


def _answer(backend: Any, verifier: Any, tokenizer: Any, problems: list[Problem], repeats: int, rollout: Any,
            temperature: float, seed: int, batch_size: int) -> list[list[Answer]]:
    """Per problem, ``repeats`` answers."""
    owners = [p for p in problems for _ in range(repeats)]
    requests = [GenerationRequest(encode_prompt(tokenizer, p.prompt, rollout.chat_template)) for p in owners]
    sampling = replace(rollout.sampling(seed), temperature=temperature, top_p=1.0, top_k=0)
    flat: list[Answer] = []
    for s in range(0, len(requests), batch_size):
        completions = sample(backend, requests[s: s + batch_size], rollout, sampling)
        rewards = verifier.score(owners[s: s + batch_size], completions).values
        flat += [Answer(c.text, r > 0.5, c) for c, r in zip(completions, rewards)]
    return [flat[i * repeats: (i + 1) * repeats] for i in range(len(problems))]


