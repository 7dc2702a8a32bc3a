"""The built-in process function behind ``- dedup: {key, within}``: a key's first row passes, and
the key is remembered (``seen``) until ``within`` passes on the epoch clock without it coming back
(the process state's ttl; a repeat refreshes it).

``keep_first`` is what the spec names and what a key's handle runs; ``ProcessState`` runs the same
for every key of an epoch at once (``first_of_each_key``, ``seen_state``), since a call per key
through its handle costs about 120 µs (docs/your-own-state.md#dedup): tests/unit/test_dedup_fast.py holds
the two equal."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline_lib.execution.state.process_handle import StateHandle


def keep_first(key: tuple, rows: pa.Table, state: StateHandle) -> pa.Table:
    """``rows``' first row unless ``key`` was seen; either way the key is marked seen now."""
    seen = state.value("seen")
    first = None if seen.exists() else rows.slice(0, 1)  # guard: dedup-passes-seen-key
    seen.set(state.now_ms)
    return first if first is not None else rows.slice(0, 0)


def first_of_each_key(rows: pa.Table, key_columns: list[str]) -> tuple[list[tuple], np.ndarray]:
    """Each key of ``rows`` in order of first appearance, and the position of its first row."""
    firsts: dict[tuple, int] = {}
    for position, key in enumerate(zip(*(rows.column(k).to_pylist() for k in key_columns))):
        firsts.setdefault(key, position)
    return list(firsts), np.fromiter(firsts.values(), dtype=np.int64, count=len(firsts))


def seen_state(clock_ms: int) -> str:
    """A key's stored state after ``keep_first`` ran for it at epoch clock ``clock_ms``."""
    handle = StateHandle((), 0, clock_ms, None)
    handle.value("seen").set(clock_ms)
    stored = handle.dumps(clock_ms)
    assert stored is not None
    return stored
