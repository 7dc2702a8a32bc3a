"""``top(col, n)``: a key's n largest values, largest first, as a list. Mergeable: the n largest
of two partials' lists are the n largest of all their values, so a partial is each batch's own
top n and the state keeps n values per key, however many records it saw. Order as Spark's
``sort_array(..., false)``: NaN above every number; nulls are skipped (as ``collect_list`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_N = 1_000  # the largest n accepted: the state keeps n values per key


def _order(value: object) -> tuple[bool, object]:
    return (value != value, value)  # NaN (the only value unequal to itself) above every number


def top_of(values: Iterable[object], n: int) -> list:
    """The ``n`` largest non-null ``values``, largest first."""
    return sorted((v for v in values if v is not None), key=_order, reverse=True)[:n]


def top_merge(lists: Sequence[list | None], n: int) -> list:
    """The ``n`` largest of the values of partial lists (each already its own top n)."""
    return top_of((v for values in lists for v in values or ()), n)
