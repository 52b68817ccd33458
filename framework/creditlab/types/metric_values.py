"""Metric values that say how they combine over data-parallel ranks."""

from __future__ import annotations

from typing import ClassVar


class Metric(float):
    """A metric value (a ``float``) that says how it combines over data-parallel ranks.

    Parts return these from ``metrics()`` (and estimators in :attr:`Advantages.metrics`); a plain
    ``float`` counts as a :class:`Mean`. The reduction is a property of the value's type, never
    of the key's spelling. Arithmetic on them gives plain floats: wrap the final value.
    """

    reduce: ClassVar[str] = "mean"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({float(self)!r})"


class Sum(Metric):
    """A count or a total: summed over ranks (e.g. groups, tokens, calls)."""

    reduce = "sum"


class Mean(Metric):
    """A rate or a mean: averaged over ranks, weighted by each rank's rows."""

    reduce = "mean"


class Max(Metric):
    """A maximum over ranks."""

    reduce = "max"


class Min(Metric):
    """A minimum over ranks."""

    reduce = "min"


def reduction(value: float) -> str:
    """How ``value`` combines over ranks: its :class:`Metric` type's ``reduce``, ``"mean"`` for a
    plain float."""
    return value.reduce if isinstance(value, Metric) else "mean"
