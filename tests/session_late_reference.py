"""Session windows' late letters computed in plain Python, independently of the library: which
records ``on_late: dead_letter`` must write and the reason text, from the sessions of
tests/windows_reference.py (docs/spec.md, "Session windows' late records")."""

from __future__ import annotations

import datetime as dt

from tests.windows_reference import _ms, session_answer


def _iso(ms: int) -> str:
    text = dt.datetime.fromtimestamp(ms // 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def session_letters(
    topic: str, flow: str, events: list[dict], gap_ms: int, delay_ms: int, per_epoch: int
) -> dict[tuple, str]:
    """(topic, 0, offset) -> reason of every record of ``events`` (one partition, ``per_epoch``
    an epoch) that the reference sessions drop as late. Each is judged in its epoch against the
    watermark the epoch started with; the session it would have formed is its page's dropped
    records of that epoch chained less than a gap apart, from the first to the last plus the gap."""
    epochs = [events[i : i + per_epoch] for i in range(0, len(events), per_epoch)]
    dropped: list[dict] = []
    session_answer(epochs, gap_ms, delay_ms, bounded=True, late_rows=dropped)
    offset_of = {id(e): i for i, e in enumerate(events)}
    groups: dict[tuple[int, str], list[int]] = {}
    for row in dropped:
        offset = offset_of[id(row)]
        groups.setdefault((offset // per_epoch, row["page"]), []).append(offset)
    out: dict[tuple, str] = {}
    for (epoch, _page), offsets in groups.items():
        watermark = max(_ms(e["ts"]) for e in events[: epoch * per_epoch]) - delay_ms
        chains: list[list[int]] = []
        for o in sorted(offsets, key=lambda o: (_ms(events[o]["ts"]), o)):
            if chains and _ms(events[o]["ts"]) - _ms(events[chains[-1][-1]]["ts"]) < gap_ms:
                chains[-1].append(o)
            else:
                chains.append([o])
        for chain in chains:
            first, last = _ms(events[chain[0]]["ts"]), _ms(events[chain[-1]]["ts"])
            for o in chain:
                out[(topic, 0, o)] = (
                    f"late for flow {flow}: event time {_iso(_ms(events[o]['ts']))} is behind the watermark "
                    f"{_iso(watermark)}; its session [{_iso(first)}, {_iso(last + gap_ms)}) joins no open "
                    "session and already closed"
                )
    return out
