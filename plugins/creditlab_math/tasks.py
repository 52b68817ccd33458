"""GSM8K- and MATH-style tasks read through ``datasets`` from local files or the hub.

Where the data comes from (``load(split)``):

- ``path`` with a ``{split}`` placeholder: that file, e.g. ``data/{split}.jsonl``;
- ``train_file`` / ``test_file``: that file (relative to ``path`` when ``path`` is a directory);
- ``path`` a directory: ``<split>.jsonl``, ``<split>.json``, ``<split>.parquet`` or
  ``<split>-*.parquet`` in it;
- ``path`` a file: that file, for every split;
- ``path: null``: ``datasets.load_dataset(hub_name, hub_config, split=split)`` (needs network
  or a populated hub cache).

``.jsonl``/``.json`` (optionally ``.gz``) go through the ``json`` builder, ``.parquet`` through
``parquet``. Every row is validated; errors name the file, the 1-based row and the fix.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import ConfigError, InputError, Problem, Task

from creditlab_math.extract import after_last_hashes, last_boxed
from creditlab_math.numina import HUB_DATASET

GSM8K_TEMPLATE = (
    "Solve the math word problem below. Think step by step, then write the final answer as a "
    "number on the last line, in the form '#### <number>'.\n\nProblem: {question}\n\nSolution:"
)
MATH_TEMPLATE = (
    "Solve the math problem below. Think step by step, then write the final answer in "
    "\\boxed{}.\n\nProblem: {problem}\n\nSolution:"
)
#: Thought-by-thought prompt of the SRPO paper presets (our wording of the format the SRPO code
#: asks for: one reasoning step per thought ending with the delimiter, final answer boxed).
NUMINA_TEMPLATE = (
    "Solve the problem below one step at a time. Each step is a single observation, calculation "
    "or deduction that moves toward the answer, and every step ends with </thought>. When a step "
    "reaches the final answer, write the answer as \\boxed{answer} in that step and end it with "
    "</thought>.\n\nProblem: {problem}\n"
)
PREPARE_NUMINA = "python -m creditlab_math.prepare numina-olympiads --out {path}"
_EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class TaskDataError(InputError):
    """A data file or row that does not fit the task. The message says what would be right."""


def _builder(path: str) -> str:
    name = path[:-3] if path.endswith(".gz") else path
    ext = os.path.splitext(name)[1].lower()
    if ext not in _EXTENSIONS:
        raise TaskDataError(
            f"cannot read {path}: unsupported extension '{ext}'. Use .jsonl, .json (optionally "
            f".gz) or .parquet."
        )
    return _EXTENSIONS[ext]


def _read_json_stdlib(path: str) -> list[dict[str, Any]]:
    """Rows of a JSON Lines / JSON array file read with the standard library.

    Used when the ``datasets`` json builder fails, to name the offending line, or to read files
    it rejects although every row is a JSON object (e.g. a field whose type changes between rows
    with older ``datasets``; the row validation then reports that field clearly).

    Raises:
        TaskDataError: Naming the line and what is wrong.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskDataError(f"cannot read {path}: {exc}") from exc
    if not text.strip():
        raise TaskDataError(f"no rows in {path}")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        rows = whole
    elif isinstance(whole, dict) and "\n" not in text.strip():
        rows = [whole]
    else:
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise TaskDataError(
                    f"invalid JSON on line {number} of {path}: {exc.msg} (column {exc.colno}). "
                    f"Each line of a .jsonl file must be one JSON object."
                ) from exc
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise TaskDataError(
                f"row {number} of {path} is a JSON {type(row).__name__}, not an object with "
                f"named fields."
            )
    if not rows:
        raise TaskDataError(f"no rows in {path}")
    return rows


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a local .jsonl/.json/.parquet file, through ``datasets``.

    Raises:
        FileNotFoundError: If ``path`` does not exist.
        TaskDataError: If the file is empty, not valid JSON, or cannot be read.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    builder = _builder(path)
    if os.path.getsize(path) == 0:
        raise TaskDataError(f"no rows in {path}")
    import logging

    from datasets import load_dataset
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    quiet, bar = logging.getLogger("datasets"), is_progress_bar_enabled()
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its error log of a bad row (and its bar) would precede ours
    disable_progress_bar()
    try:
        dataset = load_dataset(builder, data_files=path, split="train")
    except Exception as exc:  # datasets' own messages do not name the row
        if builder == "json":
            return _read_json_stdlib(path)  # names the bad line, or reads what datasets rejects
        raise TaskDataError(
            f"cannot read {path} with datasets ('{builder}'): {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        quiet.setLevel(level)
        if bar:
            enable_progress_bar()
    if len(dataset) == 0:
        raise TaskDataError(f"no rows in {path}")
    return dataset.to_list()


def _split_file(config: Any, split: str) -> str:
    """The local file holding ``split`` (see the module docstring)."""
    path = config.path
    explicit = {"train": config.train_file, "test": config.test_file}.get(split)
    if "{split}" in path:
        return path.replace("{split}", split)
    if explicit:
        return os.path.join(path, explicit) if os.path.isdir(path) else explicit
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"task.path {path} does not exist. Set task.path to a .jsonl/.json/.parquet "
                f"file, a directory holding <split>.jsonl, or a path with a '{{split}}' "
                f"placeholder (or task.path: null to use the hub)."
            )
        return path
    candidates = [os.path.join(path, f"{split}{ext}") for ext in (".jsonl", ".json", ".parquet")]
    candidates += [c + ".gz" for c in candidates[:2]]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    shards = sorted(glob.glob(os.path.join(path, f"{split}-*.parquet")))
    if len(shards) == 1:
        return shards[0]
    if shards:
        raise TaskDataError(f"several '{split}' shards in {path}; merge them into one file")
    found = ", ".join(sorted(os.listdir(path))) or "(empty directory)"
    raise FileNotFoundError(
        f"no file for split '{split}' in {path}: expected {split}.jsonl, {split}.json, "
        f"{split}.parquet or {split}-*.parquet (found: {found}). Set task.{split}_file or put "
        f"a '{{split}}' placeholder in task.path."
    )


def _string_field(row: Mapping[str, Any], key: str, config_key: str, what: str, where: str) -> str:
    value = row.get(key)
    if value is None:
        present = ", ".join(sorted(k for k, v in row.items() if v is not None)) or "(none)"
        raise TaskDataError(
            f"{where}: missing field '{key}' (the row has: {present}). Set task.{config_key} to "
            f"the field that holds {what}."
        )
    if not isinstance(value, str):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise TaskDataError(
            f"{where}: field '{key}' ({what}) must be a string, got {type(value).__name__} "
            f"{shown}."
        )
    if not value.strip():
        raise TaskDataError(f"{where}: field '{key}' ({what}) is empty.")
    return value


class _FileTask(Task):
    """Shared loading, validation and ids; subclasses turn one row into a problem.

    Every problem keeps its bare statement (the row's question/problem field, without
    ``prompt_template``) in ``metadata["problem"]``, e.g. for a localization prompt that shows the
    problem on its own (``reset_selector.problem_field=problem``, as the SRPO code does).
    """

    _placeholder = "{question}"
    _prompt_key = "question_field"
    _prompt_what = "the question"
    _task_name = ""

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        if self._placeholder not in self.config.prompt_template:
            raise ConfigError(
                f"task.prompt_template must contain '{self._placeholder}' (where the problem "
                f"text goes); got {self.config.prompt_template!r}"
            )
        if self.config.limit < 0:
            raise ConfigError(f"task.limit must be >= 0 (0 = all rows), got {self.config.limit}")

    def _rows(self, split: str) -> tuple[list[dict[str, Any]], str]:
        if self.config.path is None:
            from datasets import load_dataset

            try:
                data = load_dataset(self.config.hub_name, self.config.hub_config, split=split)
            except Exception as exc:
                raise TaskDataError(
                    f"could not load '{self.config.hub_name}' (config {self.config.hub_config!r}, "
                    f"split '{split}') from the hub: {type(exc).__name__}: {exc}. Without network "
                    f"access set task.path to a local file."
                ) from exc
            source = f"{self.config.hub_name}[{split}]"
            if self.config.limit:
                data = data.select(range(min(self.config.limit, len(data))))
            rows = data.to_list()
            if not rows:
                raise TaskDataError(f"no rows in {source}")
            return rows, source
        path = _split_file(self.config, split)
        if not os.path.isfile(path):
            split_file = getattr(self.config, f"{split}_file", None)
            raise FileNotFoundError(
                f"data file for split '{split}' not found: {path} (task.path="
                f"{self.config.path!r}, task.{split}_file={split_file!r}). Point task.path or "
                f"task.{split}_file at an existing .jsonl/.json/.parquet file."
            )
        rows = read_rows(path)
        return (rows[: self.config.limit] if self.config.limit else rows), path

    def load(self, split: str) -> Sequence[Problem]:
        """Problems of ``split``, in file order (the first ``limit`` rows when ``limit > 0``).

        Raises:
            FileNotFoundError: If the split's file does not exist.
            TaskDataError: If the file is empty or unreadable, or a row is invalid.
        """
        rows, source = self._rows(split)
        problems, seen = [], {}
        for index, row in enumerate(rows):
            where = f"{source}, row {index + 1}"
            if self.config.id_field:
                raw_id = row.get(self.config.id_field)
                if raw_id is None:
                    present = ", ".join(sorted(k for k, v in row.items() if v is not None))
                    raise TaskDataError(
                        f"{where}: missing id field '{self.config.id_field}' (the row has: "
                        f"{present}). Set task.id_field to an existing field, or to null to use "
                        f"row numbers."
                    )
                pid = str(raw_id)
            else:
                pid = f"{self._task_name}-{split}-{index}"
            if pid in seen:
                raise TaskDataError(
                    f"{where}: id '{pid}' repeats row {seen[pid] + 1}; ids must be unique "
                    f"(set task.id_field to a unique field, or to null to use row numbers)."
                )
            seen[pid] = index
            prompt_text = _string_field(
                row, getattr(self.config, self._prompt_key), self._prompt_key,
                self._prompt_what, where,
            )
            answer, metadata = self._answer(row, where)
            prompt = self.config.prompt_template.replace(self._placeholder, prompt_text)
            metadata = {"index": index, "source": source, **metadata, "problem": prompt_text}
            problems.append(Problem(id=pid, prompt=prompt, answer=answer, metadata=metadata))
        return problems

    def _answer(self, row: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError


class GSM8KTask(_FileTask):
    """GSM8K-format word problems: a question and a worked answer ending in ``#### <number>``.

    ``Problem.answer`` is the text after the last ``####`` with commas, ``$`` and spaces removed;
    ``metadata["solution"]`` keeps the full worked answer, ``metadata["problem"]`` the bare
    question. No step oracle. The default prompt
    asks for the final answer after ``####`` (the ``gsm8k`` verifier also reads ``\\boxed{}``
    and, by default, the last number).
    """

    _placeholder = "{question}"
    _prompt_key = "question_field"
    _prompt_what = "the question"
    _task_name = "gsm8k"

    @dataclass
    class Config:
        """Options of the ``gsm8k`` task.

        Attributes:
            path: Local file or directory (see the module docstring); ``None`` reads the hub.
            train_file: File of the train split (relative to ``path`` when it is a directory).
            test_file: File of the test split.
            hub_name: Hub dataset used when ``path`` is None.
            hub_config: Hub dataset config.
            question_field: Row field holding the question.
            answer_field: Row field holding the worked answer (ending in ``#### <number>``).
            prompt_template: Prompt text; ``{question}`` is replaced by the question.
            limit: Keep only the first ``limit`` rows (0 = all).
            id_field: Row field holding a unique id; ``None`` uses ``gsm8k-<split>-<row>``.
        """

        path: str | None = None
        train_file: str | None = None
        test_file: str | None = None
        hub_name: str = "openai/gsm8k"
        hub_config: str | None = "main"
        question_field: str = "question"
        answer_field: str = "answer"
        prompt_template: str = GSM8K_TEMPLATE
        limit: int = 0
        id_field: str | None = None

    def _answer(self, row: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        key = self.config.answer_field
        solution = _string_field(row, key, "answer_field", "the worked answer", where)
        final = after_last_hashes(solution)
        if final is None:
            raise TaskDataError(
                f"{where}: the answer field '{key}' has no '####' marker; GSM8K answers end "
                f"with '#### <number>' (got ...{solution[-60:]!r}). For MATH-style data use the "
                f"'math' task."
            )
        final = final.replace(",", "").replace("$", "").replace(" ", "")
        if not final:
            raise TaskDataError(f"{where}: nothing after '####' in the answer field '{key}'.")
        return final, {"solution": solution}


class MathTask(_FileTask):
    """MATH-style problems with LaTeX answers (fractions, radicals, intervals...).

    ``Problem.answer`` is the ``answer_field`` text, or with ``answer_from_solution`` the content
    of the last ``\\boxed{}`` of that field (a full worked solution). Other scalar fields of the
    row (e.g. ``level``, ``type``) go to ``metadata``, and the bare problem statement (the
    ``problem_field`` text, without the template) to ``metadata["problem"]``. No step oracle.
    """

    _placeholder = "{problem}"
    _prompt_key = "problem_field"
    _prompt_what = "the problem statement"
    _task_name = "math"

    @dataclass
    class Config:
        """Options of the ``math`` task.

        Attributes:
            path: Local file or directory (see the module docstring); ``None`` reads the hub.
            train_file: File of the train split (relative to ``path`` when it is a directory).
            test_file: File of the test split.
            hub_name: Hub dataset used when ``path`` is None.
            hub_config: Hub dataset config.
            problem_field: Row field holding the problem statement.
            answer_field: Row field holding the final answer (or the solution, see below).
            answer_from_solution: The answer is the last ``\\boxed{}`` of ``answer_field``
                (set ``answer_field: solution`` for the original MATH files).
            prompt_template: Prompt text; ``{problem}`` is replaced by the problem.
            limit: Keep only the first ``limit`` rows (0 = all).
            id_field: Row field holding a unique id; ``None`` uses ``math-<split>-<row>``.
        """

        path: str | None = None
        train_file: str | None = None
        test_file: str | None = None
        hub_name: str = "HuggingFaceH4/MATH-500"
        hub_config: str | None = None
        problem_field: str = "problem"
        answer_field: str = "answer"
        answer_from_solution: bool = False
        prompt_template: str = MATH_TEMPLATE
        limit: int = 0
        id_field: str | None = None

    def _answer(self, row: Mapping[str, Any], where: str) -> tuple[str, dict[str, Any]]:
        key = self.config.answer_field
        text = _string_field(row, key, "answer_field", "the answer", where)
        metadata = {
            k: v for k, v in row.items()
            if isinstance(v, (str, int, float, bool))
            and k not in (key, self.config.problem_field, "index", "source")
        }
        if not self.config.answer_from_solution:
            return text.strip(), metadata
        boxed = last_boxed(text)
        if not boxed:
            raise TaskDataError(
                f"{where}: answer_from_solution is set but the field '{key}' has no complete "
                f"\\boxed{{...}} (got ...{text[-60:]!r}). Point task.answer_field at a solution "
                f"that boxes its answer, or unset task.answer_from_solution."
            )
        return boxed, {**metadata, "solution": text}


class NuminaOlympiadsTask(MathTask):
    """The SRPO paper's NuminaMath olympiad problems (arXiv 2605.25507): 400 train / 100 test
    rows of ``AI-MO/NuminaMath-CoT`` with ``source == "olympiads"`` and a verifiable boxed answer,
    prepared once into local JSONL files by ``python -m creditlab_math.prepare
    numina-olympiads`` (:mod:`creditlab_math.numina`; docs/data.md). Rows hold ``id``,
    ``problem``, ``answer`` (the gold answer, no ``\\boxed``) and ``solution``; pair with
    ``verifier=math_verify``. ``metadata["problem"]`` holds the bare problem (the SRPO presets'
    localization prompt shows it, as the official code). The default prompt asks for thought-by-thought solutions ending each
    step with ``</thought>`` (change it with ``rollout.delimiter``). No step oracle.
    """

    _task_name = "numina"

    @dataclass
    class Config:
        """Options of the ``numina_olympiads`` task.

        Attributes:
            path: Folder (or file, or ``{split}`` pattern) written by the preparation command;
                relative paths are relative to the working directory.
            train_file: File of the train split (relative to ``path`` when it is a directory).
            test_file: File of the test split.
            problem_field: Row field holding the problem statement.
            answer_field: Row field holding the gold answer.
            answer_from_solution: Take the answer from the last ``\\boxed{}`` of
                ``answer_field`` instead (e.g. ``answer_field: solution``).
            prompt_template: Prompt text; ``{problem}`` is replaced by the problem.
            limit: Keep only the first ``limit`` rows of each split (0 = all).
            id_field: Row field holding a unique id; ``None`` uses ``numina-<split>-<row>``.
        """

        path: str | None = "data/numina_olympiads"
        train_file: str | None = None
        test_file: str | None = None
        problem_field: str = "problem"
        answer_field: str = "answer"
        answer_from_solution: bool = False
        prompt_template: str = NUMINA_TEMPLATE
        limit: int = 0
        id_field: str | None = "id"

    def _rows(self, split: str) -> tuple[list[dict[str, Any]], str]:
        path = self.config.path
        if path is None or not (os.path.exists(path) or "{split}" in path):
            target = path or "data/numina_olympiads"
            raise FileNotFoundError(
                f"task.path={path!r}: no prepared NuminaMath olympiad split there. Prepare it "
                f"once with `{PREPARE_NUMINA.format(path=target)}` (reads {HUB_DATASET} from the "
                f"hub; add --from <local copy> without network), or point task.path at the "
                f"folder it wrote (docs/data.md)."
            )
        return super()._rows(split)
