"""The ``code_tests`` verifier: run each answer's code against its problem's unit tests.

Reward = fraction of tests passed (``reward: fraction``) or 1 only when every test passes
(``all_or_nothing``). Each completion runs in its own sandboxed process
(:class:`creditlab_code.sandbox.Sandbox`), ``workers`` at a time; a run that hangs is killed at
``timeout_s``, so :meth:`CodeTestsVerifier.score` always returns.

``info[i]``: ``parsed`` (the extracted code, or ``None``), ``outcome`` (one of
:data:`OUTCOMES`), ``passed``/``total`` tests, ``tests`` (per-test outcome and error), ``error``
(the first failure's reason), ``ended`` (how the process ended), ``seconds``, ``isolation``,
``denied`` (operations the audit hook refused), ``output`` (the first 500 characters of stdout
and stderr) and ``output_dropped`` (bytes cut by the output cap).
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from creditlab import Completion, ConfigError, Max, Mean, Problem, Rewards, Sum, Verifier

from creditlab_code.extract import extract_code
from creditlab_code.sandbox import MODES, Limits, Sandbox, SandboxError, SandboxResult

#: Completion outcomes, in reporting order. The failure reasons are checked in this order too:
#: the first that occurs in any test names the completion's outcome.
OUTCOMES = ("correct", "partial", "wrong", "no_code", "syntax_error", "timeout", "memory",
            "denied", "killed", "crashed", "error")
_REASONS = ("timeout", "memory", "denied", "killed", "crashed", "error")
REWARD_MODES = ("fraction", "all_or_nothing")
MAX_PARSED_CHARS = 4000


def summarize(result: SandboxResult) -> tuple[str, int, str | None]:
    """``(outcome, tests passed, first error)`` of one sandbox run."""
    tests = result.tests
    passed = sum(t["outcome"] == "passed" for t in tests)
    first_error = next((t.get("error") for t in tests if t["outcome"] != "passed"), None)
    if result.solution == "syntax_error":
        return "syntax_error", 0, result.error
    if tests and passed == len(tests):
        return "correct", passed, None
    seen = {t["outcome"] for t in tests} | {result.solution, result.reason}
    for reason in _REASONS:
        if reason in seen:
            return reason, passed, first_error or result.error
    return ("partial" if passed else "wrong"), passed, first_error


class CodeTestsVerifier(Verifier):
    """Unit-test rewards for Python answers, run in sandboxed processes.

    Problems need ``metadata["tests"]`` (statements such as ``assert f(1) == 2``) and may give
    ``metadata["entry_point"]`` (the function the code must define): the ``code`` task provides
    both. The code is the answer's last fenced Python block (else its last fenced block, else,
    unless ``require_fence``, the whole text); an answer without code scores 0 with outcome
    ``no_code``. See ``docs/code-tasks.md`` for every limit and how it is enforced.
    """

    @dataclass
    class Config:
        """Options of the ``code_tests`` verifier.

        Attributes:
            reward: ``fraction`` (tests passed / tests) or ``all_or_nothing``.
            workers: Sandboxes running at once.
            timeout_s: Wall-time limit per completion (start-up, solution and all its tests).
            test_timeout_s: Soft time limit per test (in-process alarm).
            cpu_s: CPU-time limit per completion (``RLIMIT_CPU``).
            memory_mb: Address-space limit (``RLIMIT_AS``) in MiB.
            file_size_mb: Largest file the code may write (``RLIMIT_FSIZE``) in MiB.
            disk_mb: Size of the work folder (its own tmpfs) in namespace mode, in MiB.
            output_kb: stdout/stderr kept per stream (the rest is dropped and counted).
            max_processes: ``RLIMIT_NPROC`` for the sandbox uid (1 = no new process or thread).
            isolation: ``auto`` (namespaces when available, else none), ``namespaces`` or
                ``none``.
            sandbox_user: Unprivileged user the code runs as when creditlab runs as root
                (quote numbers: ``"65534"``); ``null`` keeps root (not recommended).
            audit_hook: Deny file writes outside the sandbox, sockets, processes and ctypes with
                a Python audit hook (defence in depth; off only to test the kernel layers).
            require_fence: An answer without a fenced code block counts as ``no_code``.
            python: Interpreter for the sandbox; ``null``: the one running creditlab.
        """

        reward: str = "fraction"
        workers: int = 2
        timeout_s: float = 10.0
        test_timeout_s: float = 2.0
        cpu_s: float = 5.0
        memory_mb: int = 512
        file_size_mb: int = 8
        disk_mb: int = 64
        output_kb: int = 64
        max_processes: int = 1
        isolation: str = "auto"
        sandbox_user: str | None = "nobody"
        audit_hook: bool = True
        require_fence: bool = False
        python: str | None = None

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        if cfg.reward not in REWARD_MODES:
            raise ConfigError(f"verifier.reward must be one of {', '.join(REWARD_MODES)}; got "
                              f"{cfg.reward!r}")
        if cfg.isolation not in MODES:
            raise ConfigError(f"verifier.isolation must be one of {', '.join(MODES)}; got "
                              f"{cfg.isolation!r}")
        for key in ("workers", "timeout_s", "test_timeout_s", "cpu_s", "memory_mb",
                    "file_size_mb", "disk_mb", "output_kb", "max_processes"):
            if not getattr(cfg, key) > 0:
                raise ConfigError(f"verifier.{key} must be > 0; got {getattr(cfg, key)!r}")
        if cfg.memory_mb < 64:
            raise ConfigError(f"verifier.memory_mb must be >= 64 (the interpreter alone needs "
                              f"~20 MiB of address space); got {cfg.memory_mb}")
        limits = Limits(timeout_s=cfg.timeout_s, test_timeout_s=cfg.test_timeout_s,
                        cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb, file_size_mb=cfg.file_size_mb,
                        disk_mb=cfg.disk_mb, output_kb=cfg.output_kb, processes=cfg.max_processes)
        self.sandbox = Sandbox(limits, isolation=cfg.isolation, user=cfg.sandbox_user,
                               python=cfg.python, audit_hook=cfg.audit_hook)
        try:
            self.plan = self.sandbox.plan  # probe now: an unusable sandbox fails before training
        except SandboxError as exc:
            raise ConfigError(f"verifier code_tests: {exc}. Set verifier.isolation=none, or "
                              f"run in a container that allows it.") from exc
        self._executor = ThreadPoolExecutor(cfg.workers, thread_name_prefix="code-sandbox")
        self._finalizer = weakref.finalize(self, self._executor.shutdown, wait=False)
        self._counts: Counter[str] = Counter()
        self._sums: Counter[str] = Counter()
        self._max_seconds = 0.0

    def _score_one(self, problem: Problem, completion: Completion) -> tuple[float, dict[str, Any]]:
        tests = list(problem.metadata["tests"])
        text = completion.text if isinstance(completion.text, str) else ""
        code = extract_code(text, self.config.require_fence)
        if code is None:
            return 0.0, {"parsed": None, "outcome": "no_code", "passed": 0, "total": len(tests),
                         "error": "no code found in the answer"}
        result = self.sandbox.run(code, tests, problem.metadata["entry_point"])
        outcome, passed, error = summarize(result)
        if self.config.reward == "fraction":
            reward = passed / len(tests)
        else:
            reward = float(passed == len(tests))
        info = {"parsed": code[:MAX_PARSED_CHARS], "outcome": outcome, "passed": passed,
                "total": len(tests), "tests": result.tests, "error": error,
                "ended": result.ended, "seconds": round(result.seconds, 4),
                "isolation": list(result.isolation), "denied": result.denials,
                "output_dropped": result.output_dropped, "output": result.output[:500],
                "skipped_lines": result.skipped_lines}
        return reward, info

    def score(self, problems: Sequence[Problem], completions: Sequence[Completion]) -> Rewards:
        """One reward per (problem, completion) pair; runs ``workers`` sandboxes at a time.

        Raises:
            ValueError: If the sequences differ in length or a problem has no tests.
        """
        if len(problems) != len(completions):
            raise ValueError(f"CodeTestsVerifier.score got {len(problems)} problems and "
                             f"{len(completions)} completions; they must pair up one to one")
        for problem in problems:
            if not problem.metadata.get("tests") or not problem.metadata.get("entry_point"):
                raise ValueError(f"problem {problem.id!r} needs metadata['tests'] and "
                                 f"metadata['entry_point'] (the function the tests call); the "
                                 f"code_tests verifier needs both (use task=code)")
        futures = [self._executor.submit(self._score_one, p, c)
                   for p, c in zip(problems, completions)]
        values, infos = [], []
        for future in futures:
            reward, info = future.result()
            values.append(reward)
            infos.append(info)
            self._counts[info["outcome"]] += 1
            self._sums["tests_passed"] += info["passed"]
            self._sums["tests_total"] += info["total"]
            self._sums["denied_ops"] += len(info.get("denied") or ())
            if "seconds" in info:
                self._sums["sandbox_s"] += info["seconds"]
                self._sums["sandbox_runs"] += 1
                self._max_seconds = max(self._max_seconds, info["seconds"])
        return Rewards(values=tuple(values), info=tuple(infos))

    def metrics(self) -> dict[str, float]:
        """Since the last call: ``scored``, ``<outcome>_count``/``_rate`` for every outcome,
        ``tests_passed_rate``, ``denied_ops``, ``sandbox_s_mean``/``_max``, ``namespaces``."""
        total = sum(self._counts.values())
        out: dict[str, float] = {"scored": Sum(total)}
        for outcome in OUTCOMES:
            out[f"{outcome}_count"] = Sum(self._counts[outcome])
            out[f"{outcome}_rate"] = Mean(self._counts[outcome] / total if total else 0.0)
        tests = self._sums["tests_total"]
        out["tests_passed_rate"] = Mean(self._sums["tests_passed"] / tests if tests else 0.0)
        out["denied_ops"] = Sum(self._sums["denied_ops"])
        runs = self._sums["sandbox_runs"]
        out["sandbox_s_mean"] = Mean(self._sums["sandbox_s"] / runs if runs else 0.0)
        out["sandbox_s_max"] = Max(self._max_seconds)
        out["namespaces"] = Max(self.plan["name"] == "namespaces")  # a flag: 1 when namespaces isolate
        self._counts.clear()
        self._sums.clear()
        self._max_seconds = 0.0
        return out

    def close(self) -> None:
        """Stop the worker threads (running sandboxes finish or time out first)."""
        self._finalizer()
