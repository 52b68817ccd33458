"""Task ``word_problems``: real arithmetic word problems of one to three steps, shipped, with a step
oracle (``data/README.md`` says where they come from, their licences and what was removed).

Splits (``load(split)``):

- ``train``: GSM8K's train problems with 1-3 gold steps (4,612 after deduplication);
- ``test``: the held-out set named by ``test_set``: ``gsm8k_test`` (GSM8K's test problems, the same
  filter) or ``svamp`` (SVAMP, another source and other phrasings; never trained on);
- ``gsm8k_test`` and ``svamp`` by name, whatever ``test_set`` is.

``path`` replaces the shipped folder (a folder with ``<split>.jsonl`` files, or one file for every
split, e.g. ``creditlab eval --data FILE``). Rows are GSM8K's format: ``question`` and ``answer``
(a worked solution ending in ``#### <number>``); the shipped rows add their gold ``steps``. A row
whose answer is not a number is an error naming it; every other row is scored.

Each problem carries the step oracle of :mod:`creditlab_wordproblems.steps` (its first wrong
thought, by the gold steps; thoughts are lines: use ``segmenter=newline``) when its gold steps are
known: the shipped rows, and GSM8K-format answers with calculator annotations.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from creditlab import ConfigError, Problem
from creditlab_math.tasks import GSM8K_TEMPLATE, GSM8KTask, TaskDataError, read_rows

from creditlab_wordproblems.arithmetic import to_number
from creditlab_wordproblems.steps import GoldStep, first_wrong_step, solution_steps

#: The shipped data (built by ``python -m creditlab_wordproblems.build``).
DATA = Path(__file__).parent / "data"
#: Held-out sets shipped beside ``train``.
HELD_OUT = ("gsm8k_test", "svamp")


class WordProblemsTask(GSM8KTask):
    """Real one- to three-step word problems (GSM8K train; held out: GSM8K test and SVAMP)."""

    _task_name = "word_problems"

    @dataclass
    class Config:
        """Options of the ``word_problems`` task.

        Attributes:
            path: ``None``: the shipped data; else a folder of ``<split>.jsonl`` files or one
                file used for every split.
            test_set: The held-out set the ``test`` split reads: ``gsm8k_test`` or ``svamp``.
            max_ops: Keep problems with at most this many gold steps (1-3; rows without known
                steps are kept).
            question_field: Row field holding the question.
            answer_field: Row field holding the answer (``#### <number>`` at its end).
            prompt_template: Prompt text; ``{question}`` is replaced by the question.
            limit: Keep only the first ``limit`` problems of each split (0 = all).
            id_field: Row field holding a unique id; ``None`` uses ``word_problems-<split>-<row>``.
        """

        path: str | None = None
        test_set: str = "gsm8k_test"
        max_ops: int = 3
        question_field: str = "question"
        answer_field: str = "answer"
        prompt_template: str = GSM8K_TEMPLATE
        limit: int = 0
        id_field: str | None = "id"

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        if self.config.test_set not in HELD_OUT:
            raise ConfigError(f"task.test_set must be one of {', '.join(HELD_OUT)}, got {self.config.test_set!r}")
        if isinstance(self.config.max_ops, bool) or self.config.max_ops not in (1, 2, 3):
            raise ConfigError(f"task.max_ops must be 1, 2 or 3 (gold steps per problem), got {self.config.max_ops!r}")

    def _file(self, split: str) -> str:
        name = self.config.test_set if split == "test" else split
        if name not in ("train", *HELD_OUT):
            raise TaskDataError(f"unknown split {split!r}: choose train, test, {', '.join(HELD_OUT)}")
        root = self.config.path if self.config.path is not None else str(DATA)
        return root if os.path.isfile(root) else os.path.join(root, f"{name}.jsonl")

    def _rows(self, split: str) -> tuple[list[dict[str, Any]], str]:
        path = self._file(split)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"word_problems: no file for split '{split}': {path} (task.path={self.config.path!r}). "
                f"Point task.path at a folder with train.jsonl, gsm8k_test.jsonl and svamp.jsonl, "
                f"or at one .jsonl file of question/answer rows.")
        rows = [r for r in read_rows(path) if len(r.get("steps") or ()) == 0 or r.get("ops", 0) <= self.config.max_ops]
        return (rows[: self.config.limit] if self.config.limit else rows), path

    def _answer(self, row: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        final, metadata = super()._answer(row, where)
        if to_number(final) is None:
            raise TaskDataError(
                f"{where}: the answer after '####' must be a number (e.g. '#### 72' or '#### 1,250.5'), "
                f"got {final!r}; fix the row or drop it.")
        if row.get("steps"):
            if not all(isinstance(s, (list, tuple)) and len(s) == 2 for s in row["steps"]):
                raise TaskDataError(f"{where}: 'steps' must be a list of [expression, value] pairs, "
                                    f"got {str(row['steps'])[:80]}; fix the row or leave 'steps' out")
            steps = tuple(GoldStep(str(expr), _exact(str(value), where)) for expr, value in row["steps"])
        else:
            try:
                steps = solution_steps(metadata["solution"])
            except ValueError:
                steps = ()
        return final, {**metadata, "steps": [[s.expr, str(s.value)] for s in steps],
                       "ops": row.get("ops", len(steps))}

    def load(self, split: str) -> Sequence[Problem]:
        """Problems of ``split``, each with its step oracle when its gold steps are known."""
        problems = []
        for p in super().load(split):
            steps = tuple(GoldStep(e, _exact(v, p.id)) for e, v in p.metadata["steps"])
            oracle = functools.partial(first_wrong_step, p.metadata["problem"], steps,
                                       to_number(p.answer)) if steps else None
            problems.append(dataclasses.replace(p, oracle=oracle))
        return problems


def _exact(value: str, where: str) -> Fraction:
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise TaskDataError(f"{where}: gold step value {value!r} is not a number") from exc
