"""Aggregate expressions of a keyed state step: ``sum(amount)``, ``count(*)``, ``min(x)``,
``max(x)``, ``avg(x)``, ``count_distinct(x)``, ``approx_count_distinct(x)`` and
``approx_percentile(x, q)``, ``top(x, n)`` and ``first(x)``/``last(x)`` (by event time).

They are all mergeable (the value after an epoch is merge(old, epoch partial)), which is what
lets the state live in snapshots and be updated one epoch at a time: ``avg`` is kept as a sum
and a count, ``count_distinct`` as the set of values seen (exact, so it needs a window that
closes or a bounded key space: see docs/spec.md); the approximate ones as a serialized
DataSketches sketch of bounded size (execution/engine/sketches.py), ``top`` as its n largest
values (execution/engine/top_values.py), ``first``/``last`` as the (event time, partition,
offset, value) of the earliest or latest record (execution/engine/first_last.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

FunctionName = Literal[
    "sum",
    "count",
    "min",
    "max",
    "avg",
    "count_distinct",
    "approx_count_distinct",
    "approx_percentile",
    "top",
    "first",
    "last",
]
# The aggregates kept as one running value that merges by itself (sum, count, min, max).
SIMPLE_FUNCTIONS = ("sum", "count", "min", "max")
_EXPR = re.compile(
    r"^\s*(sum|count|min|max|avg|count_distinct|approx_count_distinct|approx_percentile|top|first|last)\s*"
    r"\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*(?:,\s*([^)\s]+)\s*)?\)\s*$",
    re.I,
)


@dataclass(frozen=True)
class AggregateFunction:
    """One parsed aggregate of a spec's ``values``, checked once at load time rather than per epoch."""

    name: FunctionName
    column: str | None  # None for count(*)
    param: float | None = None  # approx_percentile's q, top's n
    order: str | None = None  # first's and last's event-time column (None: the window's, see AggregateSpec)

    @property
    def simple(self) -> bool:
        """One running value that merges by itself (not avg's sum and count, not a distinct set)."""
        return self.name in SIMPLE_FUNCTIONS

    def __str__(self) -> str:
        extra = f", {self.order}" if self.order is not None else "" if self.param is None else f", {self.param}"
        return f"{self.name}({self.column or '*'}{extra})"


def parse_aggregate(expr: str) -> AggregateFunction:
    """Parse ``sum(col)`` and the like; ValueError names the forms that are accepted."""
    match = _EXPR.match(expr)
    if not match:
        raise ValueError(
            f"cannot parse aggregate {expr!r}; use sum(col), count(*), count(col), min(col), max(col), "
            "avg(col), count_distinct(col), approx_count_distinct(col), approx_percentile(col, q), top(col, n), "
            "first(col), last(col), first(col, ts) or last(col, ts)"
        )
    name, column, param = match.group(1).lower(), match.group(2), match.group(3)
    if name == "approx_percentile":
        return AggregateFunction(
            "approx_percentile", column if column != "*" else _no_star(name), _quantile(expr, param)
        )
    if name == "top":
        return AggregateFunction("top", column if column != "*" else _no_star(name), _top_n(expr, param))
    if name in ("first", "last"):
        if param is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", param):
            raise ValueError(f"{expr!r}: {name}(col, ts) takes the event-time column as ts")
        return AggregateFunction(name, column if column != "*" else _no_star(name), order=param)  # type: ignore[arg-type]
    if param is not None:
        raise ValueError(f"{name} takes one column, not {expr!r}")
    if column == "*":
        if name != "count":
            raise ValueError(f"{name}(*) is not defined; only count(*) takes *")
        return AggregateFunction("count", None)
    return AggregateFunction(name, column)  # type: ignore[arg-type]


def _no_star(name: str) -> str:
    raise ValueError(f"{name}(*) is not defined; only count(*) takes *")


def _top_n(expr: str, param: str | None) -> float:
    """top's n: a whole number from 1 to top_values.MAX_N (the values a key keeps)."""
    if param is None or not param.isdigit() or not 1 <= int(param) <= 1_000:
        raise ValueError(f"{expr!r}: top(col, n) needs a whole n from 1 to 1000, e.g. top(amount, 3)")
    return float(param)


def _quantile(expr: str, param: str | None) -> float:
    """approx_percentile's q: one number in (0, 1]."""
    try:
        q = float(param) if param is not None else math.nan
    except ValueError:
        q = math.nan
    if not 0 < q <= 1:
        raise ValueError(f"{expr!r}: approx_percentile(col, q) needs one q in (0, 1], e.g. 0.95")
    return q


def state_functions(functions: dict[str, AggregateFunction]) -> dict[str, AggregateFunction]:
    """The running values the keyed state keeps for ``functions``: each one as it is, but
    ``avg(x)`` as ``<name>__sum`` = sum(x) and ``<name>__count`` = count(x) (mergeable, unlike
    an average); ``count_distinct(x)`` keeps the set of values, counted when the row is written."""
    out: dict[str, AggregateFunction] = {}
    for name, fn in functions.items():
        if fn.name == "avg":
            out[f"{name}__sum"] = AggregateFunction("sum", fn.column)
            out[f"{name}__count"] = AggregateFunction("count", fn.column)
        else:
            out[name] = fn
    if len(out) != sum(2 if f.name == "avg" else 1 for f in functions.values()):
        raise ValueError(f"output names clash with the sum and count an avg keeps: {sorted(functions)}")
    return out
