"""Which of a session window's records are late, decided where its sessions merge: the decision
``on_late: dead_letter`` needs for session windows (the read tasks cannot make it alone).

A read task knows the watermark the epoch starts with, but not the state's open sessions: a
record whose own session ``[ts, ts + gap)`` ends at or before that watermark may still join an
open session, or a live one of the epoch, through a chain of records less than a gap apart
(session_merge). So the read task only picks the *candidates* (engine.session_candidates,
carried with the partials): every record of a late partial is one, since a partial session
holding any other record ends after the watermark and is live. Where the sessions merge (the
driver or an owner task), after the live partials went into the state, a candidate is late
exactly when its own session overlaps none of its key's sessions there (``late_candidates``): a
live partial lies inside a merged session, and the merge loop stops only when no late partial
overlaps one. That is a function of the epoch's planned input and the snapshot it builds on,
whatever the split into tasks and batches, so a replay, a ``repair`` and a rescaled restore
decide the same; the count must equal the partials' (``checked_count``). The dead-letter rows
name each record (topic, partition, offset) and the closed session it would have formed
(``session_letters``), in the tumbling case's format.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.event_windows import WINDOW_END, WINDOW_START, event_ms
from pipeline_lib.execution.engine.late_letters import iso_ms
from pipeline_lib.execution.engine.session_candidates import CANDIDATE_MS


def _keys(table: pa.Table, columns: tuple[str, ...]) -> list[tuple]:
    return list(zip(*[table.column(c).to_pylist() for c in columns])) if table.num_rows else []


def late_candidates(candidates: pa.Table, keys: tuple[str, ...], sessions: pa.Table | None, gap_ms: int) -> np.ndarray:
    """Which ``candidates`` (``session_candidates`` of every read task) are late: their own
    session overlaps no session of their key in ``sessions`` (the state's, after the epoch's
    live partials merged into it and before any closed: key columns, ``window_start``,
    ``window_end``; None: it holds none)."""
    if candidates.num_rows == 0:
        return np.zeros(0, dtype=bool)
    wanted = set(_keys(candidates, keys))
    spans: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    if sessions is not None and sessions.num_rows:
        starts, ends = event_ms(sessions.column(WINDOW_START)), event_ms(sessions.column(WINDOW_END))
        for i, key in enumerate(_keys(sessions, keys)):
            if key in wanted:
                spans[key].append((int(starts[i]), int(ends[i])))
    ms = candidates.column(CANDIDATE_MS).to_numpy(zero_copy_only=False).astype(np.int64)
    late = np.ones(candidates.num_rows, dtype=bool)
    for i, key in enumerate(_keys(candidates, keys)):
        own_start, own_end = int(ms[i]), int(ms[i]) + gap_ms
        late[i] = not any(s < own_end and own_start < e for s, e in spans.get(key, ()))  # guard: session-late-overlap
    return late


def checked_count(flow: str, late_letters: int, late_records: int) -> None:
    """Refuse an epoch whose late candidates are not exactly the records its partials dropped as
    late: a letter missing or one too many would break the dead letters' exactly-once."""
    if late_letters != late_records:  # guard: session-late-count-checked
        raise PipelineError(
            f"flow {flow}: {late_letters} session record(s) judged late for the dead letters, but the merge "
            f"dropped {late_records} as late; the epoch is not committed (a bug: please report it)"
        )


def session_letters(
    flow: str, candidates: pa.Table, late: np.ndarray, keys: tuple[str, ...], gap_ms: int, watermark_ms: int
) -> pa.Table:
    """The dead-letter rows of the ``late`` ``candidates``, in late_letters.LateRoute's format:
    topic, partition, offset, why (the closed session the record would have formed, of its key's
    late records less than a gap apart), and no raw value."""
    rows = candidates.filter(pa.array(late))
    ms = rows.column(CANDIDATE_MS).to_numpy(zero_copy_only=False).astype(np.int64)
    bounds = _closed_sessions(_keys(rows, keys), ms, gap_ms)
    reasons = [
        f"late for flow {flow}: event time {iso_ms(int(m))} is behind the watermark {iso_ms(watermark_ms)}; "
        f"its session [{iso_ms(s)}, {iso_ms(e)}) joins no open session and already closed"
        for m, (s, e) in zip(ms.tolist(), bounds, strict=True)
    ]
    n = rows.num_rows
    return pa.table(
        [
            pc.cast(rows.column("_topic"), pa.string()),
            pc.cast(rows.column("_partition"), pa.int32()),
            pc.cast(rows.column("_offset"), pa.int64()),
            pa.array(reasons, pa.string()),
            pa.nulls(n, pa.string()),
            pa.nulls(n, pa.int64()),
        ],
        names=["topic", "partition", "offset", "error", "raw_base64", "raw_bytes"],
    )


def _closed_sessions(keys: list[tuple], ms: np.ndarray, gap_ms: int) -> list[tuple[int, int]]:
    """Each record's session among ``keys``' records of ``ms``: less than a gap apart, from the
    first record to the last plus the gap (what the late partials formed, however split)."""
    bounds: list[tuple[int, int]] = [(0, 0)] * len(ms)
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, key in enumerate(keys):
        by_key[key].append(i)
    for rows in by_key.values():
        order = sorted(rows, key=lambda r: (ms[r], r))
        group = [order[0]]
        for nxt in [*order[1:], None]:
            if nxt is not None and ms[nxt] - ms[group[-1]] < gap_ms:
                group.append(nxt)
                continue
            first, last = int(ms[group[0]]), int(ms[group[-1]])
            for r in group:
                bounds[r] = (first, last + gap_ms)
            if nxt is not None:
                group = [nxt]
    return bounds
