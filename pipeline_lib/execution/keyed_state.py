"""The keyed running aggregation kept between epochs and stored in snapshots.

Spark computes each epoch's partial aggregate per key; this class merges those partials into
the running values. sum/count/min/max are all mergeable, so merge(state, partial) equals the
aggregate over all records so far. Keys are bucketed into key groups (see plan.keygroups) so a
snapshot can be cut by key-group ranges and restored with another parallelism.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.spec.aggregates import AggregateFunction


def _merge_value(fn: str, old: Any, new: Any) -> Any:
    if old is None:
        return new
    if new is None:
        return old
    if fn in ("sum", "count"):
        return old + new
    if fn == "min":
        return new if new < old else old
    return new if new > old else old


class KeyedAggregateState:
    def __init__(self, key_columns: list[str], functions: dict[str, AggregateFunction], max_parallelism: int):
        self.key_columns = list(key_columns)
        self.value_columns = list(functions)
        self._fns = [functions[name].name for name in self.value_columns]
        self.max_parallelism = max_parallelism
        self.values: dict[tuple, list] = {}
        self.key_groups: dict[tuple, int] = {}
        # key group -> its keys, so a snapshot can write a few key groups without a full scan
        self.keys_by_group: dict[int, list[tuple]] = defaultdict(list)

    @property
    def columns(self) -> list[str]:
        return self.key_columns + self.value_columns

    def __len__(self) -> int:
        return len(self.values)

    def merge(self, partial_rows: Iterable[tuple]) -> list[tuple]:
        """Merge rows of (keys..., partial values...); return the keys that changed."""
        nkeys = len(self.key_columns)
        changed = []
        for row in partial_rows:
            key, partial = tuple(row[:nkeys]), row[nkeys:]
            current = self.values.get(key)
            if current is None:
                self.values[key] = [0 if fn == "count" and v is None else v for fn, v in zip(self._fns, partial)]
                kg = self.key_groups[key] = key_group_of(key, self.max_parallelism)
                self.keys_by_group[kg].append(key)
            else:
                for i, (fn, v) in enumerate(zip(self._fns, partial)):
                    current[i] = _merge_value(fn, current[i], v)
            changed.append(key)
        return changed

    def rows(self, keys: Iterable[tuple]) -> list[tuple]:
        return [key + tuple(self.values[key]) for key in keys]

    def keys_in(self, key_groups: range) -> list[tuple]:
        return [key for kg in key_groups for key in self.keys_by_group.get(kg, ())]

    def load_rows(self, rows: list[tuple], key_groups: list[int] | None = None) -> None:
        """Add restored (keys..., values...) rows; each key must be new. ``key_groups`` are the
        rows' key groups as stored beside them (computed again when not given)."""
        nkeys = len(self.key_columns)
        keys = [tuple(row[:nkeys]) for row in rows]
        if key_groups is None:
            key_groups = [key_group_of(key, self.max_parallelism) for key in keys]
        loaded = dict(zip(keys, (list(row[nkeys:]) for row in rows)))
        if len(loaded) != len(keys) or not self.values.keys().isdisjoint(loaded):
            seen: set[tuple] = set(self.values)
            twice = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise ValueError(f"key {twice!r} restored twice")
        if self.values:
            self.values.update(loaded)
            self.key_groups.update(zip(keys, key_groups))
        else:  # the usual restore into an empty state: no copy
            self.values, self.key_groups = loaded, dict(zip(keys, key_groups))
        for key, kg in zip(keys, key_groups):
            self.keys_by_group[kg].append(key)
