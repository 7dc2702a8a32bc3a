"""Per-user session totals, the keyed process function both sides of ``bench process`` run.

A session is a user's run of events less than ``GAP_MS`` of event time apart; it is written once,
when it closes: by the user's next event ``GAP_MS`` or more later, or by the event-time timer at
its last event plus ``GAP_MS`` once the watermark passes it (``session_timer``). ``sessions``
is the same logic over pandas, for Spark's ``applyInPandasWithState``.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

GAP_MS = 30_000
OUTPUT = "user string, start_ms bigint, end_ms bigint, total bigint, n bigint"


def _row(user: str, session: list[int]) -> dict:
    return {"user": user, "start_ms": session[0], "end_ms": session[1], "total": session[2], "n": session[3]}


def add_events(user: str, session: list[int] | None, stamps: list[int], amounts: list[int]) -> tuple[list[int], list]:
    """The open ``session`` ([start, end, total, n]) after events at ``stamps`` (ms, in order),
    and the sessions they closed as output rows."""
    out = []
    for ms, amount in zip(stamps, amounts):
        if session is not None and ms >= session[1] + GAP_MS:
            out.append(_row(user, session))
            session = None
        if session is None:
            session = [ms, ms, amount, 1]
        else:
            session = [session[0], max(ms, session[1]), session[2] + amount, session[3] + 1]
    assert session is not None, "at least one event"
    return session, out


def session_rows(key: tuple, rows: pa.Table, state) -> list[dict]:
    """A user's rows of an epoch (in offset order, which is event-time order here) added to its session."""
    value = state.value("s")
    if value.exists():
        state.timers.delete_event_time(value.get()[1] + GAP_MS)
    stamps = pc.cast(rows.column("ts"), pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
    session, out = add_events(key[0], value.get(), stamps, rows.column("amount").to_pylist())
    value.set(session)
    state.timers.register_event_time(session[1] + GAP_MS)
    return out


def session_timer(key: tuple, timer, state) -> list[dict]:
    """The watermark passed the session's last event plus the gap: it is closed."""
    row = _row(key[0], state.value("s").get())
    state.clear()
    return [row]


def sessions(key, frames, state):
    """``applyInPandasWithState``'s function: the same sessions, with an event-time timeout."""
    import pandas as pd  # type: ignore[import-untyped]

    (user,) = key
    if state.hasTimedOut:
        row = _row(user, list(state.get))
        state.remove()
        yield pd.DataFrame([row])
        return
    rows = pd.concat(list(frames)).sort_values("ts", kind="stable")
    epoch = pd.Timestamp("1970-01-01", tz="UTC")
    stamps = ((pd.to_datetime(rows["ts"], utc=True) - epoch) // pd.Timedelta(milliseconds=1)).tolist()
    session, out = add_events(user, list(state.get) if state.exists else None, stamps, rows["amount"].tolist())
    state.update(tuple(session))
    state.setTimeoutTimestamp(session[1] + GAP_MS)
    yield pd.DataFrame(out, columns=["user", "start_ms", "end_ms", "total", "n"])
