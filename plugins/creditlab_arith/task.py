"""The embedded default task: multi-step arithmetic with a step oracle.

Format (one operation per thought, the final answer folded into the last operation's thought)::

    prompt:   "Start 7, +5, *3, -4. "
    solution: "7+5=12</thought>12*3=36</thought>36-4=\\boxed{32}</thought>"
    answer:   "32"

Every running value stays in ``[0, max_value]``: an operation is only drawn if its result does,
so the arithmetic is exact (no modulo). The step oracle checks each thought against the gold
step for its position and reports the first wrong one (see :func:`first_wrong_thought`).
``render=words`` tells the same problems as word problems (:mod:`creditlab_arith.words`).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from creditlab import Problem, Task

from creditlab_arith import words
from creditlab_arith.answer import last_boxed, parse_int

#: The supported operators (applied left to right, one per step).
OPS = "+-*"

BOXED = "\\boxed{"
# One step: "[<k>:]<lhs><op><operand>=<result>", the result possibly wrapped in \boxed{...}.
_STEP_RE = re.compile(
    r"^(?:(\d+)\s*:\s*)?(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*=\s*(?:\\boxed\{\s*(-?\d+)\s*\}|(-?\d+))$"
)
# An equation anywhere in a sentence (``render=words``): "<lhs> <op> <operand> = <result>", with
# "×" or "x" allowed for "*".
_PROSE_STEP_RE = re.compile(r"(-?\d+)\s*([+\-*×x])\s*(-?\d+)\s*=\s*(?:\\boxed\{\s*(-?\d+)\s*\}|(-?\d+))")
#: Text renderings of the problems (``task.render``).
RENDERS = ("symbolic", "words")
#: Interchangeable words a thought may open with (``task.free_words``): distinct first letters, so
#: each is one free choice among eight (ln 8 = 2.08 nats) at its first character; none changes a result.
FREE_WORDS = ("so", "then", "now", "ok", "and", "hence", "well", "right")
_FREE_RE = re.compile(r"^(?:(?:" + "|".join(FREE_WORDS) + r") )*")


def apply_op(value: int, op: str, operand: int) -> int:
    """``value <op> operand`` for ``op`` in ``+-*/`` (``/``: the trap step's integer division,
    drawn only where it is exact; floor division otherwise)."""
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    if op == "/":
        return value // operand
    raise ValueError(f"unknown operator {op!r}; expected one of '+-*/'")


def split_thoughts(text: str, delimiter: str = "</thought>") -> list[str]:
    """Split a response into thoughts (delimiters removed).

    Every piece ending with ``delimiter`` is a thought; a non-blank tail without the delimiter
    (e.g. a thought cut by the token budget or an EOS) counts as a thought too.

    Args:
        text: The decoded response.
        delimiter: The thought delimiter.

    Returns:
        The thoughts in order, without their delimiters.
    """
    pieces = text.split(delimiter)
    tail = pieces.pop()
    if tail.strip():
        pieces.append(tail)
    return pieces


def _clean(thought: str, delimiter: str) -> str:
    thought = thought.strip()
    if delimiter and thought.endswith(delimiter):
        thought = thought[: -len(delimiter)].strip()
    return thought


def parse_step(
    thought: str, prose: bool = False, free: bool = False
) -> tuple[int | None, int, str, int, int] | None:
    """``(label, lhs, op, operand, result)`` of a thought ``"[<k>:]<lhs><op><operand>=<result>"``
    (result plain or boxed; ``label`` None when unlabelled), or ``None`` if it is not one.

    With ``free`` (``task.free_words`` > 0) the equation may follow words of :data:`FREE_WORDS`
    (each with one space), after the label: ``"2:so ok 12*3=36"``.

    With ``prose`` (the ``words`` rendering) the thought is a sentence and its *last* equation
    ``"<lhs> <op> <operand> = <result>"`` is the step (``×``/``x`` read as ``*``; no label).
    """
    if prose:
        m = None
        for m in _PROSE_STEP_RE.finditer(thought):  # the last equation is the step
            pass
        if m is None:
            return None
        got = m.group(4) if m.group(4) is not None else m.group(5)
        op = "*" if m.group(2) in "×x" else m.group(2)
        return None, int(m.group(1)), op, int(m.group(3)), int(got)
    if free:
        label = re.match(r"^\d+\s*:\s*", thought)
        cut = label.end() if label else 0
        thought = thought[:cut] + thought[cut:][_FREE_RE.match(thought[cut:]).end():]
    m = _STEP_RE.match(thought)
    if m is None:
        return None
    got = m.group(5) if m.group(5) is not None else m.group(6)
    label = int(m.group(1)) if m.group(1) is not None else None
    return label, int(m.group(2)), m.group(3), int(m.group(4)), int(got)


def step_is_correct(
    thought: str, lhs: int, op: str, operand: int, result: int, label: int | None = None,
    prose: bool = False, free: bool = False,
) -> bool:
    """Whether ``thought`` states ``lhs op operand = result`` (result plain or boxed).

    A leading step label ``"<k>:"`` is optional; when present it must equal ``label`` (a
    thought labelled with no ``label`` expected is malformed). ``prose``, ``free``: see :func:`parse_step`.
    """
    step = parse_step(thought, prose, free)
    if step is None or (step[0] is not None and step[0] != label):
        return False
    return step[1:] == (lhs, op, operand, result)


def first_wrong_thought(
    thoughts: Sequence[str],
    *,
    start: int,
    steps: Sequence[tuple[str, int, int]],
    delimiter: str = "</thought>",
    prose: bool = False,
    free: bool = False,
) -> int | None:
    """The step oracle: 0-based index of the first wrong thought, or ``None`` if all are right.

    Thought ``i < n`` (``n`` operations) must state the gold operation of step ``i`` applied to
    the gold running value with the gold result (``"12*3=36"``; the result may be boxed).
    A missing or malformed thought is wrong. After the ``n`` operation thoughts, the final
    answer is the last ``\\boxed{}`` of the whole chain (what the verifier reads). If it is the
    gold answer, the chain is correct (``None``); if a thought after the operations boxes a wrong
    value, the first such thought is wrong; otherwise the answer is missing and position ``n``
    (the first position after the operations) is wrong. Thoughts may carry their trailing
    delimiter or not.

    Args:
        thoughts: The trajectory's thoughts in order.
        start: The starting value.
        steps: Gold ``(op, operand, result)`` per step.
        delimiter: Removed from the end of a thought before checking.
        prose: Thoughts are sentences (``render=words``): each one's last equation is its step.
        free: Thoughts may open with words of :data:`FREE_WORDS` (``task.free_words``).

    Returns:
        The index of the first wrong thought, or ``None``.
    """
    clean = [_clean(t, delimiter) for t in thoughts]
    value = start
    for i, (op, operand, result) in enumerate(steps):
        if i >= len(clean) or not step_is_correct(clean[i], value, op, operand, result, i + 1, prose, free):
            return i
        value = result
    answers = [(i, last_boxed(t)) for i, t in enumerate(clean)]
    boxed = [(i, parse_int(a)) for i, a in answers if a is not None]
    if boxed and boxed[-1][1] == value:
        return None
    # The verifier would read a wrong or no answer: blame the first thought after the operations
    # that boxes a wrong value, else position n (the answer is missing there).
    for i, got in boxed:
        if i >= len(steps) and got != value:
            return i
    return len(steps)


class ArithTask(Task):
    """Generated multi-step arithmetic problems with a step oracle (the default task)."""

    @dataclass
    class Config:
        """Options of :class:`ArithTask`.

        Attributes:
            num_train: Number of training problems.
            num_test: Number of test problems (disjoint from train by prompt).
            min_steps: Fewest operations per problem.
            max_steps: Most operations per problem.
            max_operand: Operands and the start value are drawn from ``[1, max_operand]``.
            max_value: Every running value stays in ``[0, max_value]``.
            ops: Allowed operators, a subset of ``"+-*"``.
            seed: Generation seed; ``load`` is a pure function of the config.
            delimiter: Ends every thought.
            numbered: Label the operations ``"k:"`` in the prompt and in the thoughts (the
                step lookup is then a copy of what follows ``"k:"``, which a tiny model learns
                much faster than counting steps).
            render: ``symbolic`` (``"Start 7, +5, *3, -4. "``) or ``words``: the same problems
                as word problems with sentence thoughts (:mod:`creditlab_arith.words`), for
                real language models.
            free_words: Outcome-irrelevant free choices (issue 29's positive control): every gold
                thought opens with this many words drawn uniformly from :data:`FREE_WORDS` (per
                problem, from the seed), so a warm start taught on them stays unsure of tokens
                that never decide the outcome; the step oracle accepts any of them. Symbolic only.
            trap: Share of problems with one rare step (issue 29's second lever): an exact integer
                division ``"/b"`` (``b`` in ``[2, max_operand]``, drawn among the divisors of the
                nonzero running value) at a random position in the second half of the chain. A warm start
                taught on a small share fails it systematically; ``trap=1`` puts one in every
                problem. 0 leaves the problems exactly as without it. Symbolic only.
            trap_at: The trap's step (1-based, at most ``min_steps``; e.g. ``max_steps`` for the
                last step of fixed-length chains); 0 draws it in the second half of each chain.
            traps: Trap steps in a problem that has traps (issue 38's regime where credit alone
                must matter: several independent uncertain steps, so that a later slip blames an
                earlier right-but-unsure one). 1 (the default) is the single trap above; from 2 on
                they sit at distinct steps drawn uniformly over the whole chain (``trap_at`` must
                then be 0). At most ``min_steps``.
        """

        num_train: int = 2000
        num_test: int = 500
        min_steps: int = 2
        max_steps: int = 5
        max_operand: int = 12
        max_value: int = 199
        ops: str = "+-*"
        seed: int = 0
        delimiter: str = "</thought>"
        numbered: bool = False
        render: str = "symbolic"
        free_words: int = 0
        trap: float = 0.0
        trap_at: int = 0
        traps: int = 1

    def __init__(self, config: Any | None = None) -> None:
        super().__init__(config)
        c = self.config
        if not c.ops or set(c.ops) - set(OPS):
            raise ValueError(f"task.ops must be a non-empty subset of '+-*', got {c.ops!r}")
        if not 1 <= c.min_steps <= c.max_steps:
            raise ValueError("task needs 1 <= min_steps <= max_steps")
        if c.max_operand < 1 or c.max_value < c.max_operand:
            raise ValueError("task needs 1 <= max_operand <= max_value")
        if not c.delimiter:
            raise ValueError("task.delimiter must be non-empty")
        if c.render not in RENDERS:
            raise ValueError(f"task.render must be one of {RENDERS}, got {c.render!r}")
        if c.free_words < 0 or (c.free_words and c.render != "symbolic"):
            raise ValueError(f"task.free_words must be >= 0 and used with task.render=symbolic, got {c.free_words}")
        if not 0 <= c.trap <= 1 or (c.trap and c.render != "symbolic"):
            raise ValueError(f"task.trap is a share in [0, 1] used with task.render=symbolic, got {c.trap}")
        if not 0 <= c.trap_at <= c.min_steps:
            raise ValueError(f"task.trap_at is the trap's step, 1 to min_steps ({c.min_steps}), or 0 to draw it "
                             f"in the second half of the chain; got {c.trap_at}")
        if not 1 <= c.traps <= c.min_steps or (c.traps > 1 and c.trap_at):
            raise ValueError(f"task.traps is the number of trap steps, 1 to min_steps ({c.min_steps}), and above 1 "
                             f"needs task.trap_at=0 (the steps are drawn); got traps={c.traps}, trap_at={c.trap_at}")
        if c.render == "words" and c.numbered:
            raise ValueError("task.numbered labels symbolic steps; use it with task.render=symbolic")
        self._cache: dict[str, list[Problem]] = {}

    # -- generation ----------------------------------------------------------------------------
    def _draw(self, rng: random.Random) -> tuple[int, list[tuple[str, int, int]]] | None:
        """A start value and gold steps, or ``None`` at a dead end (no operation fits)."""
        c = self.config
        value = rng.randint(1, c.max_operand)
        start, steps = value, []
        n = rng.randint(c.min_steps, c.max_steps)
        # The trap's draws come only with trap > 0, so trap = 0 leaves the stream (and problems) as before.
        traps: set[int] = set()
        if c.trap and rng.random() < c.trap:
            if c.traps > 1:
                traps = set(rng.sample(range(n), c.traps))
            else:
                traps = {c.trap_at - 1 if c.trap_at else rng.randint(n // 2, n - 1)}
        for i in range(n):
            options = [
                (op, b)
                for op in c.ops
                for b in range(1, c.max_operand + 1)
                if 0 <= apply_op(value, op, b) <= c.max_value
            ] if i not in traps else [("/", b) for b in range(2, c.max_operand + 1) if value and value % b == 0]
            if not options:  # e.g. ops="+" at max_value, or a trap at 0 or a prime
                return None
            op, b = rng.choice(options)
            value = apply_op(value, op, b)
            steps.append((op, b, value))
        return start, steps

    def _symbolic(self, start: int, steps: Sequence[tuple[str, int, int]], pid: str = "") -> tuple[str, list[str]]:
        """The symbolic prompt and gold thoughts (without delimiters); ``free_words`` words drawn
        for problem ``pid`` open each thought."""
        tag = (lambda k: f"{k}:") if self.config.numbered else (lambda k: "")
        rng = random.Random(f"creditlab-arith-free-{self.config.seed}-{pid}")
        free = lambda: "".join(rng.choice(FREE_WORDS) + " " for _ in range(self.config.free_words))  # noqa: E731
        prompt = f"Start {start}, " + ", ".join(
            f"{tag(k + 1)}{op}{b}" for k, (op, b, _) in enumerate(steps)
        ) + ". "
        thoughts, value = [], start
        for i, (op, b, result) in enumerate(steps):
            shown = f"{BOXED}{result}}}" if i == len(steps) - 1 else str(result)
            thoughts.append(f"{tag(i + 1)}{free()}{value}{op}{b}={shown}")
            value = result
        return prompt, thoughts

    def make_problem(self, pid: str, start: int, steps: Sequence[tuple[str, int, int]]) -> Problem:
        """Build the :class:`Problem` for a start value and gold steps."""
        delim = self.config.delimiter
        prose = self.config.render == "words"
        prompt, thoughts = words.render(start, steps) if prose else self._symbolic(start, steps, pid)
        value = steps[-1][2]
        solution = "".join(t + delim for t in thoughts)
        steps_t = tuple((op, int(b), int(r)) for op, b, r in steps)
        return Problem(
            id=pid,
            prompt=prompt,
            answer=str(value),
            metadata={
                "start": start,
                "steps": [list(s) for s in steps_t],
                "values": [start] + [r for _, _, r in steps_t],
                "thoughts": thoughts,
                "solution": solution,
            },
            oracle=functools.partial(
                first_wrong_thought, start=start, steps=steps_t, delimiter=delim, prose=prose,
                free=self.config.free_words > 0,
            ),
        )

    def _generate(self) -> dict[str, list[Problem]]:
        c = self.config
        rng = random.Random(f"creditlab-arith-{c.seed}")
        seen: set[str] = set()
        out: dict[str, list[Problem]] = {"test": [], "train": []}
        budget = 50 * (c.num_train + c.num_test) + 1000
        # Test first, so the test split does not depend on num_train.
        for split, n in (("test", c.num_test), ("train", c.num_train)):
            while len(out[split]) < n:
                budget -= 1
                if budget < 0:
                    raise ValueError(
                        f"cannot draw {c.num_train}+{c.num_test} distinct problems with this "
                        f"config; lower num_train/num_test or widen max_steps/max_operand"
                    )
                drawn = self._draw(rng)
                if drawn is None:
                    continue
                problem = self.make_problem(f"arith-{split}-{len(out[split]):05d}", *drawn)
                if problem.prompt in seen:
                    continue
                seen.add(problem.prompt)
                out[split].append(problem)
        return out

    def load(self, split: str) -> list[Problem]:
        """Problems of ``split`` (``"train"`` or ``"test"``), deterministic in the config."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; ArithTask has 'train' and 'test'")
        if not self._cache:
            self._cache = self._generate()
        return list(self._cache[split])
