"""SRPO self-localization: the prompt that asks the policy for the first wrong thought of a failed
chain, and the parser of its answer (arXiv 2605.25507; METHODS.md §2).

What follows the official code (github.com/Ankur-Samanta/SRPO, MIT,
``training/thought_ics_agent_loop.py``: ``_localize_error`` and ``_parse_error_step``) and what
is ours:

* Prompt [code, paraphrased in our own words]: the problem, the failed chain as lines
  ``Step i: <thought>`` (1-based, every thought numbered even when blank so step ``i`` is thought
  ``i``; every occurrence of the delimiter removed, text stripped), the statement that the final
  answer is wrong, the request for the step where the derailing decision was *made*, the
  justification criterion, no re-solving, one integer and a last line ``\\boxed{N}``. Like the
  official default prompt (autonomy level 2) it neither shows the reference answer nor offers
  ``\\boxed{0}``.
* Parser [code]: only the *last* ``\\boxed{`` counts (brace-balanced). Its content, if an integer:
  ``0`` means "no error" (N=1, the whole chain is regenerated); ``1..n`` is taken. Anything else
  in it (out of range, negative, not an integer, unbalanced braces) falls through to the last
  ``Step k`` phrase, taken only if ``1 <= k <= n``; otherwise N=1. So an out-of-range value is a
  parse failure resolved to N=1, never clamped to ``n`` (the official code behaves so; METHODS.md's
  final "clamp to [1, n]" is then only a safety net). Earlier boxed values or earlier ``Step``
  phrases are never consulted when the last one is unusable.
* Ours: the ``Step k`` pattern is case-insensitive and must start a word (the official pattern
  ``[Ss]tep\\s+(\\d+)`` also matches inside e.g. "footstep 2"); a boxed integer is
  ``[+-]?digits`` (the official ``int()`` also accepts e.g. ``1_0``); ``n < 1`` returns
  ``(1, "no_thoughts")`` without parsing (the official code never asks about an empty chain and
  resets it to the empty prefix, N=1); any exception returns ``(1, "fallback")`` (the official
  agent loop also resets to step 1 when localization raises).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Parse statuses, in the order they are tried.
STATUSES: tuple[str, ...] = ("boxed", "no_error", "step_phrase", "fallback", "no_thoughts")

_BOXED = "\\boxed{"
_INT_RE = re.compile(r"[+-]?\d+")
_STEP_RE = re.compile(r"\bstep\s+(\d+)", re.IGNORECASE)


def localization_prompt(
    problem: str, thoughts: Sequence[str], *, delimiter: str = "</thought>"
) -> str:
    """The localization request for one failed chain.

    Args:
        problem: The problem text.
        thoughts: The chain's n thoughts in order (with or without their delimiter).
        delimiter: Removed from every thought before display (``""`` keeps the text as is).

    Returns:
        Plain text (the caller applies the chat template, e.g. through ``PolicyHandle.encode``).
    """
    steps = []
    for i, thought in enumerate(thoughts, 1):
        text = thought.replace(delimiter, "") if delimiter else thought
        steps.append(f"Step {i}: {text.strip()}")
    n = len(steps)
    chain = "\n".join(steps)
    return (
        "Below is a problem and a step-by-step attempt at it. The attempt ends with a wrong "
        "final answer, so at least one of its steps is wrong.\n\n"
        f"Problem: {problem.strip()}\n\n"
        f"Attempt:\n{chain}\n\n"
        "Find the step where the attempt went off track: the step in which the mistaken "
        "decision was made, which may come well before the step where the mistake becomes "
        "visible. Treat a step as wrong if what it claims cannot be justified from the problem "
        "and the steps before it. Do not solve the problem yourself; only point to that step.\n\n"
        f"Give exactly one step number, an integer from 1 to {n}. The last line of your reply "
        "must be \\boxed{N}, with N that step number, and nothing after it.\n"
    )


def compact_prompt(problem: str, thoughts: Sequence[str], *, delimiter: str = "</thought>") -> str:
    """A short localization request for small models trained to follow it [ours].

    The same content as :func:`localization_prompt` without the English instructions (which a
    tiny character-level model cannot read, and which would make its warm start several times
    longer): ``Check: <problem>``, the lines ``Step i: <thought>``, then ``First wrong step:``;
    the expected answer is `` \boxed{N}``. The tiny ``arith`` model is warm-started on it.
    """
    steps = [
        f"Step {i}: {(t.replace(delimiter, '') if delimiter else t).strip()}"
        for i, t in enumerate(thoughts, 1)
    ]
    return f"Check: {problem.strip()}\n" + "\n".join(steps) + "\nFirst wrong step:"


#: Localization prompt templates by name (``reset_selector.template`` / ``model.localization_template``).
TEMPLATES = {"paper": localization_prompt, "compact": compact_prompt}


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (brace-balanced), or None if absent or unclosed."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    i = start + len(_BOXED)
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def _parse(text: str, n: int) -> tuple[int, str]:
    boxed = _last_boxed(text)
    if boxed is not None and _INT_RE.fullmatch(boxed):
        k = int(boxed)
        if k == 0:
            return 1, "no_error"
        if 1 <= k <= n:
            return k, "boxed"
    phrases = _STEP_RE.findall(text)
    if phrases:
        k = int(phrases[-1])
        if 1 <= k <= n:
            return k, "step_phrase"
    return 1, "fallback"


def parse_localization(text: str, n: int) -> tuple[int, str]:
    """The reset point N named by a localization answer.

    Args:
        text: The policy's answer to :func:`localization_prompt`.
        n: Number of thoughts of the chain.

    Returns:
        ``(N, status)``: N is 1-indexed in ``[1, max(n, 1)]``; status is ``"boxed"`` (last
        ``\\boxed{k}``, ``1 <= k <= n``), ``"no_error"`` (``\\boxed{0}``, N=1), ``"step_phrase"``
        (last "Step k" phrase), ``"fallback"`` (nothing usable, N=1: a parse failure) or
        ``"no_thoughts"`` (``n < 1``, N=1). See the module docstring for the exact rules.
    """
    if n < 1:
        return 1, "no_thoughts"
    try:
        k, status = _parse(text, n)
        return max(1, min(k, n)), status
    except Exception:  # noqa: BLE001 - any failure resets to the first thought (METHODS.md §2)
        return 1, "fallback"
