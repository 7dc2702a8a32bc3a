"""Process functions used by the tests (``tests.process_example:running_totals`` and others)."""

from __future__ import annotations

import pyarrow as pa


def running_totals(key: tuple, rows: pa.Table, state) -> list[dict]:
    """Per user: a running total and count (value states), the last three amounts (a list state)
    and how many amounts were even and odd (a map state); one output row per epoch and user."""
    total, count = state.value("total", 0), state.value("n", 0)
    recent, parity = state.list("recent"), state.map("parity")
    for amount in rows.column("amount").to_pylist():
        total.set(total.get() + amount)
        count.set(count.get() + 1)
        recent.set([*recent.get(), amount][-3:])
        side = "even" if amount % 2 == 0 else "odd"
        parity.put(side, parity.get(side, 0) + 1)
    return [
        {
            "user": key[0],
            "total": total.get(),
            "n": count.get(),
            "recent": ",".join(map(str, recent.get())),
            "evens": parity.get("even", 0),
        }
    ]


RUNNING_TOTALS_OUTPUT = "user string, total bigint, n bigint, recent string, evens bigint"


def failing(key: tuple, rows: pa.Table, state) -> None:
    """Fails for one user, to show the key and the epoch in the error."""
    if key[0] == "user-000007":
        raise ValueError("no refunds for this user")


def unstorable(key: tuple, rows: pa.Table, state) -> None:
    """Keeps a value JSON cannot hold."""
    state.value("when").set({1, 2})
