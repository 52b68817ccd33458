"""Fault injection for the verifiers' worker processes (tests, deployment checks).

Pass :func:`inject_faults` as ``worker_initializer`` (``MathVerifyVerifier``, ``GSM8KVerifier``
and ``ArithVerifier`` take it, with ``worker_initargs``): in every worker it wraps the check
function (by default :func:`creditlab_math.mathverify_worker.check_completion`) so that
completions containing a marker hang, crash the worker, or raise. This exercises the timeout,
crash and error paths with the real pool, without any debug option in the public config. It
lives in the package (not in a test file) so that spawned workers can always import it.
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any


def inject_faults(
    hang_marker: str | None = "<<HANG>>",
    crash_marker: str | None = "<<CRASH>>",
    raise_marker: str | None = "<<RAISE>>",
    hang_s: float = 3600.0,
    target: str = "creditlab_math.mathverify_worker:check_completion",
) -> None:
    """Worker initializer: make marked completions hang, kill the worker, or raise.

    Args:
        hang_marker: Completions containing it sleep ``hang_s`` seconds before being checked.
        crash_marker: Completions containing it end the worker process (``os._exit(3)``).
        raise_marker: Completions containing it raise ``RuntimeError("injected failure")``.
        hang_s: How long a hang lasts.
        target: The check to wrap, ``"module:function"``; its second argument is the text.
    """
    module_name, _, name = target.partition(":")
    module = importlib.import_module(module_name)
    original = getattr(module, name)

    def faulty(gold: str, text: str, *rest: Any) -> dict[str, Any]:
        if hang_marker and hang_marker in text:
            time.sleep(hang_s)
        if crash_marker and crash_marker in text:
            os._exit(3)
        if raise_marker and raise_marker in text:
            raise RuntimeError("injected failure")
        return original(gold, text, *rest)

    setattr(module, name, faulty)
