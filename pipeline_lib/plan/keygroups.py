"""Key groups: the unit in which keyed state is stored and moved between subtasks.

A key belongs to key group ``hash(key) mod max_parallelism`` with a hash that is stable across
processes and Python versions. Subtask ``i`` of ``p`` owns one contiguous range of key groups
(Flink's scheme), so restoring with another parallelism only reassigns ranges; records are never
rehashed and snapshots stay valid.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import zlib
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np

KeyGroups = TypeVar("KeyGroups", int, "np.ndarray[Any, Any]")  # one key group, or an array of them


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        # guard: keygroup-float-as-int
        return value  # keep 1.0 distinct from 1: Spark keeps the column type, so must we
    if hasattr(value, "isoformat"):
        return value.isoformat()  # guard: keygroup-datetime-str
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, decimal.Decimal):
        return str(value)  # a column has one scale, so one text per value  # guard: keygroup-decimal-raw
    return value


def canonical_value(value: Any) -> Any:
    """The JSON-ready form a key value is hashed in (dates as ISO text, bytes as hex, decimals as
    text): how a key given as text on the command line is compared with a stored one."""
    return _canonical(value)


def key_group_of(key: tuple[Any, ...], max_parallelism: int) -> int:
    """The key group of ``key``: CRC-32 of a canonical JSON form, the same in every process and version."""
    # guard: keygroup-ascii-json, keygroup-spaced-json
    encoded = json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=False)
    return zlib.crc32(encoded.encode("utf-8")) % max_parallelism  # guard: keygroup-md5


_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')  # what json.dumps escapes in a str with ensure_ascii=False
_ONE_STRING_OPEN = zlib.crc32(b'["')  # the CRC-32 of the text before a one-string key's UTF-8 bytes


_DATES = (dt.datetime, dt.date, dt.time)


def _compact_json(key: tuple[Any, ...]) -> str | None:
    """The text ``key_group_of`` hashes, built without ``json.dumps`` for a key of strings JSON
    writes as they are, ints and dates or times (a window's key: key, window_start, window_end);
    None for any other key."""
    parts = []
    for value in key:
        kind = value.__class__
        if kind is str and not _JSON_ESCAPED.search(value):
            parts.append(f'"{value}"')
        elif kind is int:
            parts.append(int.__repr__(value))  # what json.dumps writes (never a bool: its class is bool)
        elif kind in _DATES:
            # guard: keygroup-fast-date-text
            parts.append(f'"{value.isoformat()}"')  # _canonical's text, which JSON writes as is
        else:
            return None
    return "[" + ",".join(parts) + "]"


def _key_group(key: tuple[Any, ...], max_parallelism: int) -> int:
    text = _compact_json(key)
    return key_group_of(key, max_parallelism) if text is None else zlib.crc32(text.encode()) % max_parallelism


def key_groups_of(keys: Iterable[tuple[Any, ...]], count: int, max_parallelism: int) -> np.ndarray:
    """``key_group_of`` of each of ``count`` keys, as int32. A key of one string JSON writes as
    is (no quote, backslash or control character: nearly every key) is hashed from its UTF-8
    bytes between ``["`` and ``"]`` without building the JSON text, about ten times faster per
    key (the keys an epoch adds to its state); a key of such strings, ints, dates and times from
    its JSON text built by hand, several times faster than ``json.dumps``. Both held equal to
    ``key_group_of`` by the tests."""
    crc, escaped, opened = zlib.crc32, _JSON_ESCAPED.search, _ONE_STRING_OPEN
    return np.fromiter(
        (
            crc(b'"]', crc(k[0].encode(), opened)) % max_parallelism
            if len(k) == 1 and k[0].__class__ is str and not escaped(k[0])
            else _key_group(k, max_parallelism)
            for k in keys
        ),
        dtype=np.int32,
        count=count,
    )


def key_group_range(subtask: int, parallelism: int, max_parallelism: int) -> range:
    """Key groups owned by ``subtask`` (0-based) when running with ``parallelism`` subtasks."""
    if not 0 <= subtask < parallelism <= max_parallelism:
        raise ValueError(f"subtask {subtask} of {parallelism} with max_parallelism {max_parallelism}")
    start = (subtask * max_parallelism + parallelism - 1) // parallelism  # guard: keygroup-range-start
    end = ((subtask + 1) * max_parallelism + parallelism - 1) // parallelism
    return range(start, end)


def subtask_of(key_group: KeyGroups, parallelism: int, max_parallelism: int) -> KeyGroups:
    """The subtask that owns ``key_group`` at ``parallelism`` (the inverse of ``key_group_range``);
    element-wise for an array of key groups."""
    return key_group * parallelism // max_parallelism  # guard: subtask-of-modulo
