"""The state handle a keyed process function gets: one key's value, list and map states.

Like Flink's ``ValueState``/``ListState``/``MapState`` and Spark's ``transformWithState``: the
function names each state it uses (``state.value("total")``) and reads and writes it; what it
holds when the function returns is the key's state in the next snapshot. Values must be JSON
values (numbers, strings, booleans, None, lists, dicts with string keys): the state is stored
as JSON text, never pickled, so a snapshot can be read without running user code and a
changed class cannot make it unreadable. A map's keys may be any JSON scalar.

``now_ms`` is the epoch clock (the largest Kafka record timestamp among the epoch's rows), the same in a
replay of the epoch; ``ttl`` and processing-time timers measure against it. ``timers`` are the
key's event-time and processing-time timers (process_timers), kept in the same JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pipeline_lib.execution.state.process_timers import Timers

_MISSING = object()


class ValueState:
    """One value (``get`` gives ``default`` until ``set``)."""

    def __init__(self, store: dict[str, Any], name: str, default: Any):
        self._store, self._name, self._default = store, name, default

    def get(self) -> Any:
        """The value, or the default when none was set."""
        return self._store.get(self._name, self._default)

    def exists(self) -> bool:
        """Whether a value was set."""
        return self._name in self._store

    def set(self, value: Any) -> None:
        """Set the value."""
        self._store[self._name] = value

    def clear(self) -> None:
        """Drop the value."""
        self._store.pop(self._name, None)


class ListState:
    """A list of values, appended to or replaced."""

    def __init__(self, store: dict[str, list[Any]], name: str):
        self._store, self._name = store, name

    def get(self) -> list[Any]:
        """A copy of the list."""
        return list(self._store.get(self._name, []))

    def append(self, value: Any) -> None:
        """Add one value at the end."""
        self._store.setdefault(self._name, []).append(value)

    def extend(self, values: list[Any]) -> None:
        """Add values at the end."""
        self._store.setdefault(self._name, []).extend(values)

    def set(self, values: list[Any]) -> None:
        """Replace the list."""
        self._store[self._name] = list(values)

    def clear(self) -> None:
        """Empty the list."""
        self._store.pop(self._name, None)

    def __len__(self) -> int:
        return len(self._store.get(self._name, []))


class MapState:
    """A map of values by key (any JSON scalar as key)."""

    def __init__(self, store: dict[str, dict[Any, Any]], name: str):
        self._store, self._name = store, name

    def _map(self) -> dict[Any, Any]:
        return self._store.setdefault(self._name, {})

    def get(self, key: Any, default: Any = None) -> Any:
        """The value at ``key``, or ``default``."""
        return self._store.get(self._name, {}).get(key, default)

    def put(self, key: Any, value: Any) -> None:
        """Set the value at ``key``."""
        self._map()[key] = value

    def remove(self, key: Any) -> None:
        """Drop ``key`` if present."""
        self._store.get(self._name, {}).pop(key, None)

    def contains(self, key: Any) -> bool:
        """Whether ``key`` is present."""
        return key in self._store.get(self._name, {})

    def items(self) -> Iterator[tuple[Any, Any]]:
        """The (key, value) pairs (a copy)."""
        return iter(list(self._store.get(self._name, {}).items()))

    def keys(self) -> list[Any]:
        """The keys (a copy)."""
        return list(self._store.get(self._name, {}))

    def clear(self) -> None:
        """Empty the map."""
        self._store.pop(self._name, None)


class StateHandle:
    """One key's states for one call of the process function (see the module docstring)."""

    def __init__(
        self,
        key: tuple,
        epoch: int,
        now_ms: int,
        stored: str | None,
        timer_error: str | None = "timers need on_timer in the process spec",
        event_timer_error: str | None = None,
        watermark_ms: int | None = None,
    ):
        self.key, self.epoch, self.now_ms, self.watermark_ms = key, epoch, now_ms, watermark_ms
        data = json.loads(stored) if stored else {}
        self.timers = Timers(data.get("te", []), data.get("tp", []), timer_error, event_timer_error)
        self._values: dict[str, Any] = data.get("v", {})
        self._lists: dict[str, list[Any]] = data.get("l", {})
        self._maps: dict[str, dict[Any, Any]] = {n: {k: v for k, v in pairs} for n, pairs in data.get("m", {}).items()}
        self._updated = data.get("u")

    def value(self, name: str, default: Any = None) -> ValueState:
        """The value state ``name``."""
        return ValueState(self._values, name, default)

    def list(self, name: str) -> ListState:
        """The list state ``name``."""
        return ListState(self._lists, name)

    def map(self, name: str) -> MapState:
        """The map state ``name``."""
        return MapState(self._maps, name)

    def clear(self) -> None:
        """Drop every state and timer of this key (it leaves the snapshot)."""
        self.timers.clear()
        self._values.clear()
        self._lists.clear()
        self._maps.clear()

    def is_empty(self) -> bool:
        """Whether the key holds no state (then it is not stored)."""
        return not (self._values or any(self._lists.values()) or any(self._maps.values()) or self.timers)

    def dumps(self, updated_ms: int) -> str | None:
        """The key's state as stored (canonical JSON; None when empty); TypeError or ValueError
        for a value JSON cannot hold."""
        if self.is_empty():
            return None
        data: dict[str, Any] = {"u": updated_ms}
        if self._values:
            data["v"] = self._values
        lists = {n: v for n, v in self._lists.items() if v}
        if lists:
            data["l"] = lists
        maps = {n: sorted(m.items(), key=lambda kv: json.dumps(kv[0])) for n, m in self._maps.items() if m}
        if maps:
            data["m"] = maps
        data.update(self.timers.stored())  # guard: timers-not-stored
        return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def updated_ms(stored: str) -> int:
    """When a stored state was last written, on the epoch clock."""
    return int(json.loads(stored).get("u", 0))
