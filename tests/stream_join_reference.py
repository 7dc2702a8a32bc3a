"""A plain-Python interval join, the reference the stream join's tests judge it against: every
(left, stream) pair of equal key whose event times satisfy ``l - before <= r <= l + within``, and
with ``how: left`` every left row that has none, with nulls. Rows are dicts; the result is a sorted
list of tuples (key, left values, stream values or None), independent of epochs and order."""

from __future__ import annotations

from collections.abc import Iterable


def interval_join(
    lefts: Iterable[dict],
    streams: Iterable[dict],
    key: str,
    time: str,
    within_ms: int,
    before_ms: int = 0,
    how: str = "inner",
    values: tuple[str, ...] = (),
) -> list[tuple]:
    """The joined rows as ``(key, left values, stream values)`` tuples, sorted (see the module)."""
    by_key: dict = {}
    for r in streams:
        by_key.setdefault(r[key], []).append(r)
    out = []
    for left in lefts:
        if left[key] is None:
            matches = []
        else:
            matches = [
                r for r in by_key.get(left[key], []) if left[time] - before_ms <= r[time] <= left[time] + within_ms
            ]
        mine = tuple(left[v] for v in values)
        out += [(left[key], mine, tuple(r[v] for v in values)) for r in matches]
        if not matches and how == "left":
            out.append((left[key], mine, None))
    return sorted(out, key=repr)
