"""A comparison declared before its runs (DESIGN.md section 9): the ``preregistration`` block.

A sweep sets it (a ``# @package _global_`` sweep file, or an override), so every run's resolved
``config.yaml`` records it; ``creditlab compare`` reads it back and tests exactly what it declares
(:mod:`creditlab.analysis.confirmatory`), labelling every other number exploratory::

    preregistration:
      name: decomposition_trap            # free text
      metric: eval/sample_accuracy        # the primary metric (an evaluation metric)
      budgets: [steps, tokens/generated]  # one or more of BUDGETS
      by: method                          # the grouping key(s) (compare's --by)
      baseline: grpo
      contrasts:                          # each tested against the baseline (or its own)
        - {group: oracle_credit, expect: greater}   # greater | less | none (no difference)
        - {group: oracle_credit, baseline: sham_credit, expect: greater}  # its own comparator
        - {group: srpo_oracle, expect: none, margin: 0.01, budgets: [steps, tokens/generated]}
      alpha: 0.05
      correction: holm                    # holm (over the family: contrasts x budgets) | none
      seeds: [0, 1, 2, 3, 4, 5, 6, 7]     # the seeds tested (optional; else at least min_seeds)
      min_seeds: 8

A ``none`` prediction is tested for equivalence within its ``margin`` (two one-sided tests): a
new declaration (``creditlab train``) must give one; a block recorded without one still parses, and
its ``none`` can then never be confirmed.

:func:`parse` checks a block before anything loads (``creditlab train`` calls it through
:func:`creditlab.run.config.validate`): an unknown key, a budget that is not an axis, an expectation
that is not one of three, ends with one line naming the valid choices.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from creditlab.errors import ConfigError, closest

#: Budget axes: ``steps`` compares the runs' last evaluations (equal RL steps); the others are
#: cumulative counters, compared at exactly equal budgets (:mod:`creditlab.analysis.budgets`).
BUDGETS = ("steps", "tokens/generated", "tokens/trained", "time/train_s")
EXPECTATIONS = ("greater", "less", "none")
KEYS = ("name", "metric", "budgets", "by", "baseline", "contrasts", "alpha", "correction", "seeds", "min_seeds")
REQUIRED = ("metric", "budgets", "baseline", "contrasts")
CONTRAST_KEYS = ("group", "expect", "margin", "baseline", "budgets")
CORRECTIONS = ("holm", "none")
#: Seeds a claim needs: with n paired seeds the exact sign-flip test cannot go below 2/2^n,
#: 0.0078 at 8 (0.0625 at 5), room for a Holm correction over a few contrasts at alpha 0.05.
CLAIM_SEEDS = 8


@dataclass(frozen=True)
class Contrast:
    """One declared contrast: ``group`` against ``baseline`` (None: the block's), with the stated
    prediction ``expect`` (``greater``, ``less``, or ``none``: no difference larger than ``margin``,
    in the metric's units), on its own ``budgets`` axes (empty: the block's)."""

    group: str
    expect: str
    budgets: tuple[str, ...] = ()
    margin: float | None = None
    baseline: str | None = None


@dataclass(frozen=True)
class Preregistration:
    """A validated ``preregistration`` block (see the module doc for the keys)."""

    metric: str
    budgets: tuple[str, ...]
    baseline: str
    contrasts: tuple[Contrast, ...]
    by: tuple[str, ...] = ("method",)
    alpha: float = 0.05
    min_seeds: int = CLAIM_SEEDS
    name: str = ""
    correction: str = "holm"
    seeds: tuple[int, ...] = ()

    def budgets_of(self, contrast: Contrast) -> tuple[str, ...]:
        """The axes ``contrast`` is tested on: its own, else the block's."""
        return contrast.budgets or self.budgets

    def baseline_of(self, contrast: Contrast) -> str:
        """The group ``contrast`` is tested against: its own, else the block's."""
        return contrast.baseline or self.baseline

    def as_dict(self) -> dict[str, Any]:
        """The block in its YAML form (``compare.json``, and what two declarations are compared by;
        optional keys only where set, so that a block recorded before they existed reads the same)."""
        contrasts = [{"group": c.group, "expect": c.expect, **({"margin": c.margin} if c.margin is not None else {}),
                      **({"baseline": c.baseline} if c.baseline else {}),
                      **({"budgets": list(c.budgets)} if c.budgets else {})} for c in self.contrasts]
        return {"name": self.name, "metric": self.metric, "budgets": list(self.budgets), "by": list(self.by),
                "baseline": self.baseline, "contrasts": contrasts, "alpha": self.alpha, "min_seeds": self.min_seeds,
                **({"correction": self.correction} if self.correction != "holm" else {}),
                **({"seeds": list(self.seeds)} if self.seeds else {})}


def _fail(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def _unknown(where: str, key: Any, valid: tuple[str, ...]) -> ConfigError:
    hint = closest(str(key), list(valid))
    return _fail(where, f"unknown key '{key}'." + (f" Did you mean '{hint}'?" if hint else "")
                 + f" Valid keys: {', '.join(valid)}.")


def _name(value: Any, where: str) -> str:
    """A group name: a non-empty string (a number, as Hydra may read ``1``, becomes its text)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or str(value).strip() == "":
        raise _fail(where, f"must be a group name (a non-empty string), got {value!r}.")
    return str(value)


def _strings(value: Any, where: str, what: str) -> tuple[str, ...]:
    """A string (comma-separated) or a non-empty list of strings."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) and v for v in items):
        raise _fail(where, f"must be {what} or a list of them, got {value!r}.")
    return tuple(items)


def _budgets(value: Any, where: str) -> tuple[str, ...]:
    budgets = _strings(value, where, "a budget axis")
    for b in budgets:
        if b not in BUDGETS:
            hint = closest(b, list(BUDGETS))
            raise _fail(where, f"'{b}' is not a budget axis." + (f" Did you mean '{hint}'?" if hint else "")
                        + f" Budget axes: {', '.join(BUDGETS)}.")
    if len(set(budgets)) < len(budgets):
        raise _fail(where, f"lists an axis twice: {', '.join(budgets)}.")
    return budgets


def _margin(item: dict[str, Any], expect: str, where: str, require: bool) -> float | None:
    """A ``none`` contrast's equivalence margin: a positive number (required when ``require``)."""
    margin = item.get("margin")
    if margin is None:
        if expect == "none" and require:
            raise _fail(where, "a 'none' prediction needs a margin, the largest difference (in the metric's units) "
                        "that still counts as no difference, e.g. {group: sham, expect: none, margin: 0.01}: "
                        "without one, 'no difference' could never fail.")
        return None
    if expect != "none":
        raise _fail(f"{where}.margin", f"only a 'none' prediction takes a margin (this one is '{expect}').")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not margin > 0:
        raise _fail(f"{where}.margin", f"must be a positive number (in the metric's units), got {margin!r}.")
    return float(margin)


def _contrast(item: Any, where: str, require_margin: bool) -> Contrast:
    if not isinstance(item, dict):
        raise _fail(where, f"must be a mapping {{group: <name>, expect: greater|less|none[, margin: <m>]"
                    f"[, baseline: <name>][, budgets: [...]]}}, got {item!r}.")
    for key in item:
        if key not in CONTRAST_KEYS:
            raise _unknown(where, key, CONTRAST_KEYS)
    if "group" not in item:
        raise _fail(where, "needs a group: {group: <name>, expect: greater|less|none}.")
    expect = item.get("expect")
    if expect not in EXPECTATIONS:
        hint = closest(str(expect), list(EXPECTATIONS))
        raise _fail(f"{where}.expect", f"{expect!r} is not a prediction." + (f" Did you mean '{hint}'?" if hint else "")
                    + f" Choose one of: {', '.join(EXPECTATIONS)} (none = no difference expected).")
    budgets = _budgets(item["budgets"], f"{where}.budgets") if item.get("budgets") is not None else ()
    baseline = _name(item["baseline"], f"{where}.baseline") if item.get("baseline") is not None else None
    return Contrast(_name(item["group"], f"{where}.group"), expect, budgets,
                    _margin(item, expect, where, require_margin), baseline)


def _seeds(value: Any, where: str) -> tuple[int, ...]:
    """The declared seeds: distinct integers, at least two."""
    if value is None:
        return ()
    ok = isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok or len(value) < 2 or len(set(value)) < len(value):
        raise _fail(where, f"must be a list of at least two distinct integer seeds, got {value!r}.")
    return tuple(value)


def parse(block: Any, where: str = "preregistration", require_margin: bool = False) -> Preregistration | None:
    """Validate a ``preregistration`` block (a plain mapping, or None: no declaration).
    ``require_margin``: a ``none`` prediction without a margin is an error (a new declaration; a
    recorded one may predate margins).

    Raises:
        ConfigError: One line naming the key, what is wrong and the valid choices.
    """
    if block is None:
        return None
    if not isinstance(block, dict):
        raise _fail(where, f"must be a mapping with keys {', '.join(KEYS)} (or null), got {block!r}.")
    for key in block:
        if key not in KEYS:
            raise _unknown(where, key, KEYS)
    missing = [k for k in REQUIRED if block.get(k) is None]
    if missing:
        raise _fail(where, f"missing {', '.join(missing)} (required: {', '.join(REQUIRED)}).")
    metric = block["metric"]
    if not isinstance(metric, str) or not metric.startswith("eval/"):
        raise _fail(f"{where}.metric", f"must be an evaluation metric such as eval/pass@1 or eval/sample_accuracy, "
                    f"got {metric!r}.")
    budgets = _budgets(block["budgets"], f"{where}.budgets")
    contrasts = block["contrasts"]
    if not isinstance(contrasts, (list, tuple)) or not contrasts:
        raise _fail(f"{where}.contrasts", f"must be a non-empty list of {{group: <name>, expect: greater|less|none}}, "
                    f"got {contrasts!r}.")
    parsed = tuple(_contrast(c, f"{where}.contrasts[{i}]", require_margin) for i, c in enumerate(contrasts))
    baseline = _name(block["baseline"], f"{where}.baseline")
    pairs = [(c.group, c.baseline or baseline) for c in parsed]
    same = next((g for g, b in pairs if g == b), None)
    twice = next((p for p in pairs if pairs.count(p) > 1), None)
    if same is not None or twice is not None:
        raise _fail(f"{where}.contrasts", f"group '{same}' is its own baseline" if same is not None else
                    f"group '{twice[0]}' is listed twice against '{twice[1]}'"
                    ": each contrast tests one group against another once.")
    alpha = block.get("alpha", 0.05)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise _fail(f"{where}.alpha", f"must be a number in (0, 1), got {alpha!r}.")
    min_seeds = block.get("min_seeds", CLAIM_SEEDS)
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
        raise _fail(f"{where}.min_seeds", f"must be an integer >= 2, got {min_seeds!r}.")
    name = block.get("name") or ""
    by = _strings(block.get("by", "method"), f"{where}.by", "a config key")
    correction = block.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise _fail(f"{where}.correction", f"must be one of {', '.join(CORRECTIONS)}, got {correction!r}.")
    seeds = _seeds(block.get("seeds"), f"{where}.seeds")
    return Preregistration(metric, budgets, baseline, parsed, by, float(alpha), min_seeds, str(name), correction, seeds)


def load(path: str | Path) -> Preregistration:
    """The declaration in a YAML file: a top-level ``preregistration:`` block, or the block itself.

    Raises:
        ConfigError: The file cannot be read, holds no block, or the block is invalid.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--prereg {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    if isinstance(data, dict) and "preregistration" in data:
        data = data["preregistration"]
    out = parse(data, f"--prereg {path}")
    if out is None:
        raise ConfigError(f"--prereg {path}: the file declares nothing (preregistration: null)")
    return out
