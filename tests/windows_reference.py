"""Event-time windows computed in plain Python, independently of the library: the answer the
windowed tests compare a run's files sink with. The semantics (docs/spec.md, "Event time"):
records are judged epoch by epoch against the watermark the epoch started with (the largest
event time of earlier epochs minus the delay); a record all of whose windows have ended at or
before it is late (dropped, counted); a window is written once, after the first epoch whose
watermark reaches its end, or when a bounded source ends."""

from __future__ import annotations

import datetime as dt
import random

MINUTE = 60_000


def iso(ms: int) -> str:
    """``ms`` since the Unix epoch as the ISO-8601 text with a zone that JSON input carries."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def click_events(n: int, seed: int, start_ms: int = 1_772_323_200_000, late_every: int = 17) -> list[dict]:
    """Clicks whose event time moves forward about 1.5 s a record, a little out of order; every
    ``late_every``-th one is very late (10 minutes behind)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ms = start_ms + i * 1_500 + rng.randint(-20_000, 5_000)
        if i and i % late_every == 0:
            ms -= 10 * MINUTE
        out.append(
            {"page": f"p{rng.randint(0, 4)}", "user": f"u{rng.randint(0, 9)}", "ms": rng.randint(1, 999), "ts": iso(ms)}
        )
    return out


def _ms(text: str) -> int:
    return round(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def windowed_answer(
    epochs: list[list[dict]], size_ms: int, slide_ms: int, delay_ms: int, bounded: bool
) -> tuple[dict[tuple, dict], int]:
    """(every written window by (page, window_start ms, window_end ms) -> {n, users, mean_ms};
    the records dropped as late) for ``epochs`` of clicks read in that order."""
    top: int | None = None
    open_: dict[tuple, list[dict]] = {}
    written: dict[tuple, dict] = {}
    late = 0
    for i, records in enumerate(epochs):
        watermark = -(2**63) if top is None else top - delay_ms
        for r in records:
            ms = _ms(r["ts"])
            last = ms - ms % slide_ms
            starts = [last - k * slide_ms for k in range(size_ms // slide_ms)]
            if last + size_ms <= watermark:
                late += 1
            for start in starts:
                if start + size_ms > watermark:
                    open_.setdefault((r["page"], start, start + size_ms), []).append(r)
            top = ms if top is None else max(top, ms)
        after = top - delay_ms if top is not None else -(2**63)
        if bounded and i == len(epochs) - 1:
            after = 2**63 - 1
        for key in [k for k in open_ if k[2] <= after]:
            rows = open_.pop(key)
            assert key not in written, f"window {key} written twice"
            written[key] = {
                "n": len(rows),
                "users": len({r["user"] for r in rows}),
                "mean_ms": sum(r["ms"] for r in rows) / len(rows),
            }
    return written, late


def session_answer(
    epochs: list[list[dict]], gap_ms: int, delay_ms: int, bounded: bool, late_rows: list[dict] | None = None
) -> tuple[dict[tuple, dict], int]:
    """Session windows, as ``windowed_answer``: a session is a page's records less than
    ``gap_ms`` apart, from its first record to its last plus the gap. Each epoch, the records
    whose own session [ts, ts + gap) ended at or before the watermark are late unless a chain of
    records less than a gap apart links them to a record that is not late or to an open session:
    the connected groups (open sessions and the epoch's records) without either are dropped
    (and added to ``late_rows`` when given)."""
    top: int | None = None
    open_: dict[str, list[tuple[int, int, list[dict]]]] = {}
    written: dict[tuple, dict] = {}
    late = 0
    for i, records in enumerate(epochs):
        watermark = -(2**63) if top is None else top - delay_ms
        by_page: dict[str, list] = {}
        for r in records:
            ms = _ms(r["ts"])
            by_page.setdefault(r["page"], []).append((ms, ms + gap_ms, [r], ms + gap_ms > watermark))
            top = ms if top is None else max(top, ms)
        for page, items in by_page.items():
            pieces = [(s, e, rows, True) for s, e, rows in open_.pop(page, [])] + items
            pieces.sort(key=lambda p: (p[0], p[1]))
            groups: list[list] = []
            for piece in pieces:
                if groups and piece[0] < groups[-1][1]:
                    last = groups[-1]
                    groups[-1] = [last[0], max(last[1], piece[1]), last[2] + piece[2], last[3] or piece[3]]
                else:
                    groups.append(list(piece))
            kept = []
            for start, end, rows, alive in groups:
                if alive:
                    kept.append((start, end, rows))
                else:
                    late += len(rows)
                    if late_rows is not None:
                        late_rows.extend(rows)
            open_[page] = kept
        after = top - delay_ms if top is not None else -(2**63)
        if bounded and i == len(epochs) - 1:
            after = 2**63 - 1
        for page in list(open_):
            still = []
            for start, end, rows in open_[page]:
                if end <= after:
                    written[(page, start, end)] = {
                        "n": len(rows),
                        "users": len({r["user"] for r in rows}),
                        "mean_ms": sum(r["ms"] for r in rows) / len(rows),
                    }
                else:
                    still.append((start, end, rows))
            open_[page] = still
    return written, late
