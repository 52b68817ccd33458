"""Python coding tasks: write a function, checked by unit tests (``task=code``).

One row per problem (JSON Lines, JSON or parquet; field names configurable)::

    {"id": "add_numbers",
     "prompt": "Return the sum of a and b.",            # what the function must do
     "signature": "def add_numbers(a: int, b: int) -> int",
     "entry_point": "add_numbers",                      # the function the tests call
     "tests": ["assert add_numbers(1, 2) == 3", ...],   # statements run one by one in the
                                                        # judge; they may call only entry_point
     "solution": "def add_numbers(a, b):\\n    return a + b\\n"}   # optional reference

Where the rows come from (``load(split)``), first that applies:

- ``path`` set: a local file or folder, exactly as for the ``gsm8k``/``math`` tasks (a
  ``{split}`` placeholder, ``train_file``/``test_file``, ``<split>.jsonl|.json|.parquet`` in a
  folder, or one file for every split);
- ``hub_name`` set: ``datasets.load_dataset(hub_name, hub_config, split=split)`` (network);
- neither: the set shipped with this package (``creditlab_code/data/<split>.jsonl``: 36 train and
  12 test problems on strings, lists and arithmetic, each with 3-6 tests and a reference
  solution).

Every row is validated; an error names the source, the 1-based row, the field and the fix.
"""

from __future__ import annotations

import keyword
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import ConfigError, Problem, Task
from creditlab_math.tasks import TaskDataError, _split_file, read_rows

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PROMPT_TEMPLATE = (
    "Write a Python function.\n\n{signature}\n{prompt}\n\n"
    "Answer with the complete function in one ```python code block."
)
PLACEHOLDERS = ("{prompt}", "{signature}", "{entry_point}")
MAX_TESTS = 100


def _text(row: Mapping[str, Any], key: str, config_key: str, what: str, where: str) -> str:
    value = row.get(key)
    if value is None:
        present = ", ".join(sorted(k for k, v in row.items() if v is not None)) or "(none)"
        raise TaskDataError(
            f"{where}: missing field '{key}' ({what}); the row has: {present}. Add the field or "
            f"set task.{config_key} to the field that holds {what}."
        )
    if not isinstance(value, str) or not value.strip():
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise TaskDataError(
            f"{where}: field '{key}' ({what}) must be a non-empty string, got "
            f"{type(value).__name__} {shown}."
        )
    return value


def _tests(row: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = row.get(key)
    example = "e.g. [\"assert f(1) == 2\", \"assert f(0) == 0\"]"
    if value is None:
        raise TaskDataError(f"{where}: missing field '{key}' (the unit tests): a list of Python "
                            f"statements, {example}. Or set task.tests_field.")
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise TaskDataError(f"{where}: field '{key}' must be a non-empty list of Python "
                            f"statements, {example}; got {type(value).__name__}.")
    if len(value) > MAX_TESTS:
        raise TaskDataError(f"{where}: field '{key}' has {len(value)} tests; at most "
                            f"{MAX_TESTS} are allowed.")
    for number, test in enumerate(value, start=1):
        if not isinstance(test, str) or not test.strip():
            raise TaskDataError(f"{where}: test {number} of field '{key}' must be a non-empty "
                                f"string of Python code, got {test!r}.")
        try:
            compile(test, f"<test {number}>", "exec")
        except SyntaxError as exc:
            raise TaskDataError(f"{where}: test {number} of field '{key}' is not valid Python "
                                f"({exc.msg}, line {exc.lineno}): {test!r}.") from exc
    return tuple(value)


class CodeTask(Task):
    """Function-writing problems checked by unit tests (see the module docstring).

    ``Problem.prompt`` is ``prompt_template`` filled with the row's description, signature and
    entry point; ``Problem.answer`` is the reference solution (``""`` when the data has none);
    ``metadata`` holds ``tests``, ``entry_point``, ``signature``, ``description``, ``index`` and
    ``source``. The ``code_tests`` verifier reads ``tests`` and ``entry_point``.
    """

    @dataclass
    class Config:
        """Options of the ``code`` task.

        Attributes:
            path: Local file or folder of problems; ``None`` uses ``hub_name`` or the shipped set.
            train_file: File of the train split (relative to ``path`` when it is a folder).
            test_file: File of the test split.
            hub_name: A ``datasets`` hub name, used when ``path`` is None (needs network).
            hub_config: Its config name.
            id_field: Row field holding a unique id; ``None`` uses ``code-<split>-<row>``.
            prompt_field: Row field describing what the function must do.
            signature_field: Row field holding the ``def`` line; ``None`` when the data has none
                (the template then gets ``def <entry_point>(...)``).
            entry_point_field: Row field naming the function the tests call.
            tests_field: Row field holding the list of test statements.
            solution_field: Row field holding a reference solution; ``None`` or absent: none.
            prompt_template: Prompt text with ``{prompt}``, ``{signature}``, ``{entry_point}``.
            limit: Keep only the first ``limit`` rows (0 = all).
        """

        path: str | None = None
        train_file: str | None = None
        test_file: str | None = None
        hub_name: str | None = None
        hub_config: str | None = None
        id_field: str | None = "id"
        prompt_field: str = "prompt"
        signature_field: str | None = "signature"
        entry_point_field: str = "entry_point"
        tests_field: str = "tests"
        solution_field: str | None = "solution"
        prompt_template: str = PROMPT_TEMPLATE
        limit: int = 0

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        if not any(p in self.config.prompt_template for p in ("{prompt}", "{signature}")):
            raise ConfigError(
                f"task.prompt_template must contain '{{prompt}}' or '{{signature}}' (where the "
                f"problem goes); got {self.config.prompt_template!r}"
            )
        if self.config.limit < 0:
            raise ConfigError(f"task.limit must be >= 0 (0 = all rows), got {self.config.limit}")

    def _rows(self, split: str) -> tuple[list[dict[str, Any]], str]:
        cfg = self.config
        if cfg.path is None and cfg.hub_name:
            from datasets import load_dataset

            try:
                data = load_dataset(cfg.hub_name, cfg.hub_config, split=split)
            except Exception as exc:  # datasets raises many types; reported in one line
                raise TaskDataError(
                    f"could not load '{cfg.hub_name}' (config {cfg.hub_config!r}, split "
                    f"'{split}') from the hub: {type(exc).__name__}: {exc}. Without network "
                    f"access set task.path to a local file, or unset task.hub_name to use the "
                    f"shipped problems."
                ) from exc
            source = f"{cfg.hub_name}[{split}]"
            rows = data.select(range(min(cfg.limit, len(data)))).to_list() if cfg.limit else data.to_list()
        else:
            if cfg.path is None:
                path = os.path.join(DATA_DIR, f"{split}.jsonl")
                if not os.path.isfile(path):
                    raise FileNotFoundError(
                        f"the code task ships splits 'train' and 'test'; there is no '{split}' "
                        f"({path}). Set task.path to your own data for other splits."
                    )
            else:
                path = _split_file(cfg, split)
            rows, source = read_rows(path), path
            rows = rows[: cfg.limit] if cfg.limit else rows
        if not rows:
            raise TaskDataError(f"no rows in {source}")
        return rows, source

    def load(self, split: str) -> Sequence[Problem]:
        """Problems of ``split`` in file order (the first ``limit`` rows when ``limit > 0``).

        Raises:
            FileNotFoundError: If the split's file does not exist.
            TaskDataError: If the data is empty or unreadable, or a row is invalid.
        """
        rows, source = self._rows(split)
        cfg, problems, seen = self.config, [], {}
        for index, row in enumerate(rows):
            where = f"{source}, row {index + 1}"
            if cfg.id_field:
                if row.get(cfg.id_field) is None:
                    raise TaskDataError(
                        f"{where}: missing id field '{cfg.id_field}'. Add it, or set "
                        f"task.id_field to null to number the rows."
                    )
                pid = str(row[cfg.id_field])
            else:
                pid = f"code-{split}-{index}"
            if pid in seen:
                raise TaskDataError(f"{where}: id '{pid}' repeats row {seen[pid] + 1}; ids must "
                                    f"be unique (or set task.id_field to null).")
            seen[pid] = index
            description = _text(row, cfg.prompt_field, "prompt_field", "the description", where)
            entry = _text(row, cfg.entry_point_field, "entry_point_field", "the function name",
                          where).strip()
            if not entry.isidentifier() or keyword.iskeyword(entry):
                raise TaskDataError(f"{where}: field '{cfg.entry_point_field}' must be a Python "
                                    f"function name such as 'add_numbers', got {entry!r}.")
            if cfg.signature_field:
                signature = _text(row, cfg.signature_field, "signature_field", "the def line",
                                  where).strip()
                if not signature.startswith(f"def {entry}("):
                    raise TaskDataError(
                        f"{where}: field '{cfg.signature_field}' must start with 'def {entry}(' "
                        f"(the entry point), got {signature!r}."
                    )
            else:
                signature = f"def {entry}(...)"
            tests = _tests(row, cfg.tests_field, where)
            solution = row.get(cfg.solution_field) if cfg.solution_field else None
            if solution is not None and not isinstance(solution, str):
                raise TaskDataError(f"{where}: field '{cfg.solution_field}' (the reference "
                                    f"solution) must be a string, got {type(solution).__name__}.")
            prompt = (cfg.prompt_template.replace("{prompt}", description.strip())
                      .replace("{signature}", signature).replace("{entry_point}", entry))
            metadata = {"tests": tests, "entry_point": entry, "signature": signature,
                        "description": description, "index": index, "source": source}
            problems.append(Problem(id=pid, prompt=prompt, answer=solution or "",
                                    metadata=metadata))
        return problems
