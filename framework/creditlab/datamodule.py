"""TaskDataModule: the problems of each RL step, a pure function of (seed, step)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from creditlab.errors import InputError
from creditlab.interfaces import Task
from creditlab.policy import encode_prompt
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
    """Shuffles the train split once per epoch (seeded) and serves ``prompts_per_step`` per step.

    Args:
        task: The task.
        prompts_per_step: Problems per RL step.
        steps: Number of RL steps (the length of the step loader).
        seed: Shuffling seed.
    """

    def __init__(self, task: Task, prompts_per_step: int, steps: int, seed: int) -> None:
        super().__init__()
        self.task = task
        self.prompts_per_step = prompts_per_step
        self.steps = steps
        self.seed = seed
        self._train: list[Problem] | None = None
        self._test: list[Problem] | None = None

    @property
    def train_problems(self) -> list[Problem]:
        if self._train is None:
            self._train = _check_problems(self.task.load("train"), self.task, "train")
        return self._train

    @property
    def test_problems(self) -> list[Problem]:
        if self._test is None:
            self._test = _check_problems(self.task.load("test"), self.task, "test")
        return self._test

    def check_rows(self, tokenizer: Any, model: Any, rollout: RolloutConfig) -> None:
        """Load both splits and check every row (:func:`check_lengths`) against the model's
        context (``max_position_embeddings``) and one generation call's budget
        (``max_new_tokens``; with thoughts, one thought's ``max_thought_tokens``)."""
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        budget = "rollout.max_thought_tokens" if rollout.thoughts else "rollout.max_new_tokens"
        new_tokens = rollout.max_thought_tokens if rollout.thoughts else rollout.max_new_tokens
        name = type(self.task).__name__
        for split, rows in (("train", self.train_problems), ("test", self.test_problems)):
            check_lengths(rows, lambda text: encode_prompt(tokenizer, text), new_tokens, context,
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
