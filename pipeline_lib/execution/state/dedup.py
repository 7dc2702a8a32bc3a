"""The built-in process function behind ``- dedup: {key, within}``: a key's first row passes, and
the key is remembered (``seen``) until ``within`` passes on the epoch clock without it coming back
(the process state's ttl; a repeat refreshes it)."""

from __future__ import annotations

import pyarrow as pa

from pipeline_lib.execution.state.process_handle import StateHandle


def keep_first(key: tuple, rows: pa.Table, state: StateHandle) -> pa.Table:
    """``rows``' first row unless ``key`` was seen; either way the key is marked seen now."""
    seen = state.value("seen")
    first = None if seen.exists() else rows.slice(0, 1)  # guard: dedup-passes-seen-key
    seen.set(state.now_ms)
    return first if first is not None else rows.slice(0, 0)
