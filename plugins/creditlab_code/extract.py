"""Code extraction from a model's answer (pure Python, no dependencies)."""

from __future__ import annotations

import re

#: Fence-opening info strings that mark Python code.
PYTHON_TAGS = ("python", "python3", "py")
_FENCE = re.compile(r"^[ \t]*```[ \t]*([^\s`]*)[^\n`]*$")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block of ``text`` as ``(language tag, code)``, in order.

    A fence is a line starting with three backticks (after optional indentation); the word
    after the backticks of an opening fence is its language tag (lower-cased, may be empty).
    A block left open at the end of the text (a truncated answer) runs to the end.
    """
    blocks: list[tuple[str, str]] = []
    tag: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if match and tag is None:
            tag, lines = match.group(1).lower(), []
        elif line.strip() == "```" and tag is not None:
            blocks.append((tag, "\n".join(lines)))
            tag = None
        elif tag is not None:
            lines.append(line)
    if tag is not None:
        blocks.append((tag, "\n".join(lines)))
    return blocks


def extract_code(text: str, require_fence: bool = False) -> str | None:
    """The code to run: the last fenced block tagged Python (``python``/``py``/``python3``),
    else the last fenced block of any tag, else (unless ``require_fence``) the whole text.

    Returns:
        The code, or ``None`` when no code is found (an empty block or answer, or no fence with
        ``require_fence``).
    """
    blocks = fenced_blocks(text)
    python = [code for tag, code in blocks if tag in PYTHON_TAGS]
    if python:
        code = python[-1]
    elif blocks:
        code = blocks[-1][1]
    elif require_fence:
        return None
    else:
        code = text
    return code if code.strip() else None
