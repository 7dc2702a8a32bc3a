"""Per-user session totals with an event-time timer (``tests.session_example:session_rows`` and
``:session_timer``), and the plain-Python answer they must give.

A session is a user's run of events with less than ``GAP_MS`` of event time between one and the
next. The function adds a user's rows to the open session and keeps one event-time timer at the
session's last event plus ``GAP_MS``; a row that comes ``GAP_MS`` or more after the last one
closes the session itself, and the timer closes it once the watermark passes. Either way each
session is written once, when it closes, with its start, end, total and count.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

GAP_MS = 3 * 60_000
SESSION_OUTPUT = "user string, start_ms bigint, end_ms bigint, total bigint, n bigint"


def _ms(value) -> int:
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
        return round(aware.timestamp() * 1000)
    return int(value)


def _closed(key: tuple, state) -> dict:
    row = {
        "user": key[0],
        "start_ms": state.value("start").get(),
        "end_ms": state.value("last").get(),
        "total": state.value("total", 0).get(),
        "n": state.value("n", 0).get(),
    }
    state.clear()
    return row


def session_rows(key: tuple, rows: pa.Table, state) -> list[dict]:
    """A user's rows of an epoch (in event-time order) added to sessions; closed ones returned."""
    out = []
    for ts, amount in zip(rows.column("ts").to_pylist(), rows.column("amount").to_pylist()):
        ms = _ms(ts)
        last = state.value("last")
        if last.exists() and ms >= last.get() + GAP_MS:
            out.append(_closed(key, state))  # clears the session and its timer
        if last.exists():
            state.timers.delete_event_time(last.get() + GAP_MS)
        else:
            state.value("start").set(ms)
        last.set(max(ms, last.get() or ms))
        state.value("total", 0).set(state.value("total", 0).get() + amount)
        state.value("n", 0).set(state.value("n", 0).get() + 1)
        state.timers.register_event_time(last.get() + GAP_MS)
    return out


def session_timer(key: tuple, timer, state) -> list[dict]:
    """The watermark passed the open session's end plus the gap: it is closed."""
    return [_closed(key, state)]


def expected_sessions(events: list[dict]) -> list[dict]:
    """Every user's sessions from plain Python (events in each user's event-time order)."""
    open_: dict[str, dict] = {}
    out = []
    for e in events:
        ms = _ms(dt.datetime.fromisoformat(e["ts"].replace("Z", "+00:00")))
        s = open_.get(e["user"])
        if s is not None and ms >= s["end_ms"] + GAP_MS:
            out.append(s)
            s = None
        if s is None:
            s = open_[e["user"]] = {"user": e["user"], "start_ms": ms, "end_ms": ms, "total": 0, "n": 0}
        s["end_ms"] = max(s["end_ms"], ms)
        s["total"] += e["amount"]
        s["n"] += 1
    return sorted([*out, *open_.values()], key=lambda s: (s["user"], s["start_ms"]))


def processing_ticks(key: tuple, rows: pa.Table, state) -> list[dict]:
    """Counts a user's rows and sets a processing-time timer a minute after the epoch clock."""
    state.value("n", 0).set(state.value("n", 0).get() + rows.num_rows)
    state.timers.register_processing_time(state.now_ms + 60_000)
    return []


def processing_tick(key: tuple, timer, state) -> list[dict]:
    """Writes the count when the epoch clock passed the timer."""
    return [{"user": key[0], "n": state.value("n", 0).get(), "at": timer.ms}]
