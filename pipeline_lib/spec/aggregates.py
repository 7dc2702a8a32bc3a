"""Aggregate expressions of a keyed state step: ``sum(amount)``, ``count(*)``, ``min(x)``, ``max(x)``.

They are all mergeable (the value after an epoch is merge(old, epoch partial)), which is what
lets the state live in snapshots and be updated one epoch at a time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

FunctionName = Literal["sum", "count", "min", "max"]
_EXPR = re.compile(r"^\s*(sum|count|min|max)\s*\(\s*(\*|[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.I)


@dataclass(frozen=True)
class AggregateFunction:
    """One parsed aggregate of a spec's ``values``, checked once at load time rather than per epoch."""

    name: FunctionName
    column: str | None  # None for count(*)

    def __str__(self) -> str:
        return f"{self.name}({self.column or '*'})"


def parse_aggregate(expr: str) -> AggregateFunction:
    """Parse ``sum(col)`` and the like; ValueError names the forms that are accepted."""
    match = _EXPR.match(expr)
    if not match:
        raise ValueError(f"cannot parse aggregate {expr!r}; use sum(col), count(*), count(col), min(col) or max(col)")
    name, column = match.group(1).lower(), match.group(2)
    if column == "*":
        if name != "count":
            raise ValueError(f"{name}(*) is not defined; only count(*) takes *")
        return AggregateFunction("count", None)
    return AggregateFunction(name, column)  # type: ignore[arg-type]
