"""Key groups: the unit in which keyed state is stored and moved between subtasks.

A key belongs to key group ``hash(key) mod max_parallelism`` with a hash that is stable across
processes and Python versions. Subtask ``i`` of ``p`` owns one contiguous range of key groups
(Flink's scheme), so restoring with another parallelism only reassigns ranges; records are never
rehashed and snapshots stay valid.
"""

from __future__ import annotations

import decimal
import json
import zlib
from typing import Any, TypeVar

import numpy as np

KeyGroups = TypeVar("KeyGroups", int, "np.ndarray[Any, Any]")  # one key group, or an array of them


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return value  # keep 1.0 distinct from 1: Spark keeps the column type, so must we
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, decimal.Decimal):
        return str(value)  # a column has one scale, so one text per value
    return value


def canonical_value(value: Any) -> Any:
    """The JSON-ready form a key value is hashed in (dates as ISO text, bytes as hex, decimals as
    text): how a key given as text on the command line is compared with a stored one."""
    return _canonical(value)


def key_group_of(key: tuple[Any, ...], max_parallelism: int) -> int:
    """The key group of ``key``: CRC-32 of a canonical JSON form, the same in every process and version."""
    encoded = json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=False)
    return zlib.crc32(encoded.encode("utf-8")) % max_parallelism


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """Key groups owned by ``subtask`` (0-based) when running with ``parallelism`` subtasks."""
    if not 0 <= subtask < parallelism <= max_parallelism:
        raise ValueError(f"subtask {subtask} of {parallelism} with max_parallelism {max_parallelism}")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def subtask_of(key_group: KeyGroups, parallelism: int, max_parallelism: int) -> KeyGroups:
    """The subtask that owns ``key_group`` at ``parallelism`` (the inverse of ``key_group_range``);
    element-wise for an array of key groups."""
    return key_group * parallelism // max_parallelism
