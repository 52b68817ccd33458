"""TaskDataModule: the problems of each RL step, a pure function of (seed, step), and the
held-out problems evaluation scores.

Held out means held out: a test row whose prompt is also a training row's is left out of
evaluation (``eval.allow_train_rows=true`` keeps it), and a run whose every test row is a training
row (a task reading one data file for both splits) stops at start-up, before the model loads,
naming the fixes: ``eval.holdout=<rows>`` (evaluate on rows held out of the train split), a
separate test split, or ``eval.allow_train_rows=true``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, Dataset

from creditlab.errors import InputError
from creditlab.interfaces import Task
from creditlab.step.evaluation import EvalConfig
from creditlab.step.policy import encode_prompt
from creditlab.types import Problem, RolloutConfig


class _Steps(Dataset):
    """Yields step indices; the module turns a step into its problems (resume-safe)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _check_problems(problems: Sequence[Problem], task: Task, split: str) -> list[Problem]:
    problems = list(problems)
    name = type(task).__name__
    if not problems:
        raise InputError(f"task {name} returned no problems for split '{split}'")
    for i, p in enumerate(problems):
        if not isinstance(p, Problem):
            raise InputError(f"task {name}, split '{split}', item {i}: expected Problem, got {type(p).__name__}")
        if not isinstance(p.prompt, str) or not p.prompt:
            raise InputError(f"task {name}, split '{split}', problem {p.id!r}: prompt must be a non-empty string")
    return problems


#: Seed of the fixed shuffle that picks the ``eval.holdout`` rows: the same rows for every run seed,
#: so runs of different seeds are evaluated on the same problems.
HOLDOUT_SEED = "creditlab-eval-holdout"


def split_holdout(problems: Sequence[Problem], n: int, where: str) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: ``n`` rows of ``problems`` picked by a fixed shuffle
    (:data:`HOLDOUT_SEED`) are held out; both lists keep the original order.

    Raises:
        InputError: When ``n`` would leave no training row.
    """
    if n >= len(problems):
        raise InputError(
            f"eval.holdout={n} would hold out every row of {where} ({len(problems)} rows) and leave "
            f"none to train on; use eval.holdout < {len(problems)}."
        )
    order = list(range(len(problems)))
    random.Random(HOLDOUT_SEED).shuffle(order)
    held = set(order[:n])
    return ([p for i, p in enumerate(problems) if i not in held],
            [p for i, p in enumerate(problems) if i in held])


@rank_zero_only
def _warn(message: str) -> None:
    print(f"[creditlab] warning: {message}", file=sys.stderr)


def check_lengths(
    problems: Sequence[Problem], encode: Callable[[str], Sequence[int]], new_tokens: int,
    context: int | None, where: str, budget: str = "rollout.max_new_tokens",
) -> None:
    """Raise when a row's prompt plus ``new_tokens`` needs more positions than ``context``.

    Every row is encoded as the policy encodes it, so that a single over-long row stops the run
    at start-up, named, instead of the step that draws it.

    Raises:
        InputError: Naming the first such row (index and id), its length, the budget and how many
            other rows are too long.
    """
    if context is None:
        return
    long = [(i, p, n) for i, p in enumerate(problems) if (n := len(encode(p.prompt))) + new_tokens > context]
    if not long:
        return
    i, p, n = long[0]
    more = f" ({len(long) - 1} more rows too long, e.g. ids {', '.join(repr(q.id) for _, q, _ in long[1:4])})" if len(long) > 1 else ""
    raise InputError(
        f"{where}, row {i} (id {p.id!r}): its prompt of {n} tokens + {budget}={new_tokens} needs "
        f"{n + new_tokens} positions, more than the model's context of {context}{more}. Shorten or "
        f"drop the row (task.limit), lower {budget}, or use a model with a longer context."
    )


class TaskDataModule(L.LightningDataModule):
    """Shuffles the train split once per epoch (seeded) and serves ``prompts_per_step`` per step;
    holds the problems evaluation scores (see the module docstring).

    Args:
        task: The task.
        prompts_per_step: Problems per RL step.
        steps: Number of RL steps (the length of the step loader).
        seed: Shuffling seed.
        eval_cfg: The run's evaluation settings (``holdout``, ``allow_train_rows``, ``problems``,
            ``every``); default :class:`~creditlab.step.evaluation.EvalConfig`.
    """

    def __init__(
        self, task: Task, prompts_per_step: int, steps: int, seed: int, eval_cfg: EvalConfig | None = None
    ) -> None:
        super().__init__()
        self.task = task
        self.prompts_per_step = prompts_per_step
        self.steps = steps
        self.seed = seed
        self.eval_cfg = eval_cfg if eval_cfg is not None else EvalConfig()
        self._train: list[Problem] | None = None
        self._test: list[Problem] | None = None

    @property
    def train_problems(self) -> list[Problem]:
        """The rows trained on (without the ``eval.holdout`` rows)."""
        self._load()
        return self._train

    @property
    def test_problems(self) -> list[Problem]:
        """The held-out rows evaluation scores (the first ``eval.problems`` of them)."""
        self._load()
        return self._test

    def setup(self, stage: str | None = None) -> None:
        """Load both splits and settle the held-out rows now (the runner calls it before the model
        loads, so a run that would evaluate on training rows stops early)."""
        self._load()

    def _load(self) -> None:
        """Load both splits once, settle the held-out rows and say what evaluation will score.

        Raises:
            InputError: A split is empty or malformed, ``eval.holdout`` leaves nothing to train
                on, or evaluation is on and every test row is a training row.
        """
        if self._train is not None:
            return
        cfg, name = self.eval_cfg, type(self.task).__name__
        train = _check_problems(self.task.load("train"), self.task, "train")
        if cfg.holdout:
            train, test = split_holdout(train, cfg.holdout, f"task {name}, split 'train'")
        else:
            test = _check_problems(self.task.load("test"), self.task, "test")
            if not cfg.allow_train_rows:
                test = self._held_out(train, test, name)
        self._train, self._test = train, test
        if cfg.every > 0 and cfg.problems > len(test):
            _warn(f"eval.problems={cfg.problems} but task {name} has {len(test)} held-out test rows: "
                  f"evaluation scores {len(test)} problems (eval/problems).")

    def _held_out(self, train: list[Problem], test: list[Problem], name: str) -> list[Problem]:
        """The test rows whose prompt is no training row's prompt."""
        seen = {p.prompt for p in train}
        kept = [p for p in test if p.prompt not in seen]
        if len(kept) == len(test):
            return kept
        if not kept and self.eval_cfg.every > 0:
            raise InputError(
                f"task {name}: all {len(test)} test rows are training rows (the same prompts; one data "
                f"file for both splits?), so evaluation would score training rows.\nHold rows out "
                f"with eval.holdout=<rows>, give the task a separate test split (e.g. task.test_file), "
                f"or set eval.allow_train_rows=true (eval.every=0: no evaluation)."
            )
        if kept:
            _warn(f"{len(test) - len(kept)} of the {len(test)} test rows of task {name} are also training "
                  f"rows (the same prompt) and are left out of evaluation (eval.allow_train_rows=true keeps them).")
        return kept

    def check_rows(self, tokenizer: Any, model: Any, rollout: RolloutConfig) -> None:
        """Load both splits and check every row (:func:`check_lengths`) against the model's
        context (``max_position_embeddings``) and one generation call's budget
        (``max_new_tokens``; with thoughts, one thought's ``max_thought_tokens``)."""
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        budget = "rollout.max_thought_tokens" if rollout.thoughts else "rollout.max_new_tokens"
        new_tokens = rollout.max_thought_tokens if rollout.thoughts else rollout.max_new_tokens
        name = type(self.task).__name__
        for split, rows in (("train", self.train_problems), ("test", self.test_problems)):
            check_lengths(rows, lambda text: encode_prompt(tokenizer, text, rollout.chat_template), new_tokens, context,
                          f"task {name}, split '{split}'", budget)

    def problems_for_step(self, step: int) -> list[Problem]:
        """The ``prompts_per_step`` problems of RL step ``step`` (epochs reshuffle)."""
        data, k = self.train_problems, self.prompts_per_step
        out = []
        for j in range(step * k, (step + 1) * k):
            epoch, pos = divmod(j, len(data))
            perm = self._permutation(epoch, len(data))
            out.append(data[int(perm[pos])])
        return out

    def _permutation(self, epoch: int, n: int) -> torch.Tensor:
        cache = getattr(self, "_perm_cache", None)
        if cache is None or cache[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed * 7_777 + epoch)
            cache = (epoch, torch.randperm(n, generator=gen))
            self._perm_cache = cache
        return cache[1]

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Steps(self.steps), batch_size=None, shuffle=False)
