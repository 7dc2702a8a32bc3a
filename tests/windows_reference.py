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
