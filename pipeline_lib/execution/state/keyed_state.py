"""The keyed running aggregation kept between epochs and stored in snapshots.

Spark (or, on the Arrow path, its Python workers) computes each epoch's partial aggregate per
key; this class merges those partials into the running values. sum/count/min/max are all
mergeable, so merge(state, partial) equals the aggregate over all records so far (count_distinct
keeps each key's set of values, avg a sum and a count, the approximate ones a sketch:
spec.aggregates.state_functions). Keys are
bucketed into key groups (see plan.keygroups) so a snapshot can be cut by key-group ranges and
restored with another parallelism.

The state is columnar: every key gets a slot; key columns are Arrow arrays by slot (keys are
only appended) and value columns NumPy arrays by slot, with a validity mask. A merge finds each
partial key's slot with one Arrow hash lookup (one string or integer key column; other keys are
looked up in a dict) and then combines whole columns at once; sink rows and state files are Arrow
tables taken by slot. Per-row Python work is left to new keys (their key groups, the dict).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.first_last import FIRST_LAST
from pipeline_lib.execution.engine.first_last import pick as pick_record
from pipeline_lib.execution.engine.sketches import SKETCH_FUNCTIONS, sketch_merge
from pipeline_lib.execution.engine.top_values import top_merge
from pipeline_lib.execution.state.key_values import python_values
from pipeline_lib.plan.keygroups import key_groups_of
from pipeline_lib.spec.aggregates import AggregateFunction

_INITIAL_SLOTS = 1024


# Every NaN key is this one object: tuples compare items by identity first, so all NaN keys are
# one key, as Spark groups them (distinct NaN objects never compare equal).
_NAN = float("nan")


def _is_numeric(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_)


def _to_numpy(array: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Values and validity of an Arrow column: native NumPy for numbers, Python objects otherwise."""
    valid = array.is_valid().to_numpy(zero_copy_only=False)
    if _is_numeric(array.type):
        values = (
            pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
            if array.null_count
            else array.to_numpy(zero_copy_only=False)
        )
    else:  # strings, decimals, timestamps, booleans: exactly the Python values Arrow gives back
        values = _objects(array.to_pylist())
    return values, valid


def _radix_sortable(key_groups: np.ndarray) -> np.ndarray:
    """Key groups (below ``max_parallelism``, at most 32,768) as 16-bit integers, for which
    numpy's stable sort is a radix sort: about 7x faster than on int32 at 100k keys, same order."""
    return key_groups.astype(np.uint16)


def _objects(values: list) -> np.ndarray:
    """A 1-d object array of ``values`` (np.array would nest sequences into more dimensions)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@dataclass
class _Column:
    """One state column by slot: values, validity, and the Arrow type to give them back as."""

    name: str
    type: pa.DataType
    values: np.ndarray
    valid: np.ndarray

    @classmethod
    def empty(cls, name: str, type_: pa.DataType, capacity: int) -> _Column:
        dtype = type_.to_pandas_dtype() if _is_numeric(type_) else object
        return cls(name, type_, np.zeros(capacity, dtype=dtype), np.zeros(capacity, dtype=bool))

    def grow(self, capacity: int) -> None:
        self.values = np.resize(self.values, capacity)
        self.valid = np.resize(self.valid, capacity)

    def put(self, slots: np.ndarray, values: np.ndarray, valid: np.ndarray) -> None:
        self.values[slots] = values
        self.valid[slots] = valid

    def arrow(self, slots: np.ndarray) -> pa.Array:
        valid = self.valid[slots]
        return pa.array(self.values[slots], type=self.type, mask=None if valid.all() else ~valid)


@dataclass
class _KeyColumn:
    """One key column by slot, kept as Arrow. A key keeps its slot and keys are only ever
    appended, so handing keys back to Arrow (sink rows and state files, every epoch) is a
    ``take``, not a conversion of Python objects on the driver."""

    name: str
    type: pa.DataType
    chunks: list[pa.Array]
    size: int = 0

    def append(self, first_slot: int, array: pa.Array | pa.ChunkedArray) -> None:
        if first_slot != self.size:
            raise AssertionError(f"key column {self.name}: appending at slot {first_slot}, holding {self.size}")
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        self.chunks.append(array if array.type == self.type else array.cast(self.type))
        self.size += len(array)

    def whole(self) -> pa.Array:
        """Every key of this column, by slot."""
        if len(self.chunks) != 1:  # new keys since the last call: one array again
            self.chunks = [pa.concat_arrays(self.chunks) if self.chunks else pa.array([], self.type)]
        return self.chunks[0]

    def arrow(self, slots: np.ndarray) -> pa.Array:
        return self.whole().take(slots)


def _hashes_like_python(type_: pa.DataType) -> bool:
    return (
        pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_integer(type_)
        or pa.types.is_boolean(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
    )


def _combine(fn: str, old: np.ndarray, new: np.ndarray, param: float | None = None) -> np.ndarray:
    """fn applied to two arrays of values that are both present (no nulls here); ``param``: the
    function's parameter (top's n)."""
    if old.dtype != object:
        if fn in ("sum", "count"):
            return old + new
        # Spark orders NaN above every number: max(x, NaN) is NaN, min(x, NaN) is x
        return np.fmin(old, new) if fn == "min" else np.maximum(old, new)
    if fn in ("sum", "count"):
        return _objects([a + b for a, b in zip(old, new)])
    if fn == "count_distinct":  # the sets of values seen, as sorted lists
        return _objects([sorted(set(a).union(b)) for a, b in zip(old, new)])
    if fn == "top":  # each key's n largest values
        return _objects([top_merge([a, b], int(param or 0)) for a, b in zip(old, new)])  # guard: top-state-merge
    if fn in FIRST_LAST:  # the (event time, partition, offset, value) of the earlier (later) record
        return _objects([pick_record(fn, [a, b]) for a, b in zip(old, new)])  # guard: first-last-state-merge
    if fn in SKETCH_FUNCTIONS:  # serialized sketches: their union
        return _objects([sketch_merge(fn, [a, b]) for a, b in zip(old, new)])  # guard: sketch-state-merge
    pick = min if fn == "min" else max
    return _objects([pick(a, b) for a, b in zip(old, new)])


def _overflowed(old: np.ndarray, new: np.ndarray, result: np.ndarray) -> np.ndarray:
    """Where a signed integer sum wrapped around: both operands' signs differ from the result's."""
    return ((old ^ result) & (new ^ result)) < 0


class KeyedAggregateState:
    """A flow's running aggregate per key, on the driver, in slots.

    Invariants: a key's slot never changes and slots are only appended (so key columns stay
    Arrow and ``table`` is a ``take``); each slot's key group is fixed when the key arrives; a
    ``merge`` that fails (an integer overflow) leaves every value as it was.
    """

    def __init__(self, key_columns: list[str], functions: dict[str, AggregateFunction], max_parallelism: int):
        self.key_columns = list(key_columns)
        self.value_columns = list(functions)
        self._fns = [functions[name].name for name in self.value_columns]
        self._params = [functions[name].param for name in self.value_columns]
        self.max_parallelism = max_parallelism
        self._slots: dict[tuple, int] = {}  # key -> slot
        self._keys: list[tuple] = []  # slot -> key
        self._key_groups = np.zeros(_INITIAL_SLOTS, dtype=np.int32)  # slot -> key group
        self._key_arrays: list[_KeyColumn] | None = None  # typed by the first table seen
        self._columns: list[_Column] | None = None  # the value columns, by slot

    @property
    def columns(self) -> list[str]:
        """Key columns then value columns: the column order of partials, restored rows and ``table``."""
        return self.key_columns + self.value_columns

    def __len__(self) -> int:
        return len(self._keys)

    # -- reading --------------------------------------------------------------------------
    def key_groups(self, slots: np.ndarray | None = None) -> np.ndarray:
        """The key group of each slot (of every key when ``slots`` is None)."""
        return self._key_groups[: len(self)] if slots is None else self._key_groups[slots]

    def slots_by_key_group(self, slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every slot (or each of ``slots`` once) ordered by key group, keys in order of arrival
        within one, and the key group of each: ``slots_in`` cuts spans out of it with two binary
        searches. That order is how a span's state file, or its delta, holds its keys."""
        if slots is None:
            order = np.argsort(_radix_sortable(self.key_groups()), kind="stable")
            return order, self._key_groups[order]
        present = np.zeros(len(self), dtype=bool)  # each slot once, in slot order: O(keys), no hashing
        present[slots] = True
        unique = np.flatnonzero(present)
        order = unique[np.argsort(_radix_sortable(self._key_groups[unique]), kind="stable")]
        return order, self._key_groups[order]

    @staticmethod
    def slots_in(by_group: tuple[np.ndarray, np.ndarray], key_groups: range) -> np.ndarray:
        """The slots whose key group is in ``key_groups``, from ``slots_by_key_group``'s result."""
        order, sorted_groups = by_group
        # bounds of the groups' own dtype: with a list, NumPy would cast all the groups to int64 first (O(keys))
        bounds = np.array([key_groups.start, key_groups.stop], dtype=sorted_groups.dtype)
        lo, hi = np.searchsorted(sorted_groups, bounds)
        return order[lo:hi]

    def table(self, slots: np.ndarray, schema: pa.Schema) -> pa.Table:
        """The keys and values at ``slots`` as rows of ``schema`` (the state's column types)."""
        if self._columns is None or self._key_arrays is None:
            return schema.empty_table()
        arrays = [c.arrow(slots) for c in self._key_arrays] + [c.arrow(slots) for c in self._columns]
        return pa.Table.from_arrays(arrays, schema=schema)

    def value(self, key: tuple) -> list[Any]:
        """The current values of one key (tests, diagnostics)."""
        assert self._columns is not None
        slot = np.array([self._slots[tuple(_NAN if v != v else v for v in key)]])
        return [c.arrow(slot)[0].as_py() for c in self._columns]

    def key_column(self, name: str) -> pa.Array:
        """Every key's value of key column ``name``, by slot (no copy when no key came since)."""
        assert self._key_arrays is not None
        return self._key_arrays[self.key_columns.index(name)].whole()

    def keys(self) -> list[tuple]:
        """Every key, as a tuple, in slot order (a copy)."""
        return list(self._keys)

    # -- writing --------------------------------------------------------------------------
    def merge(self, partials: pa.Table, key_groups: np.ndarray | None = None) -> np.ndarray:
        """Merge an epoch's partial aggregate (key columns, then one partial value per function,
        at most one row per key); return the slots of the keys it changed. ``key_groups``: each
        row's key group, when the caller has them already (computed again for new keys if not)."""
        slots = self._find_in_arrow(partials)
        if slots is None:
            keys = self._key_tuples(partials)
            slots = np.fromiter((self._slots.get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        new = slots < 0
        known = np.flatnonzero(~new)
        # every merged column first: an error (an overflow) leaves the state as it was
        merged = self._merged_values(partials, known, slots[known]) if len(known) else []
        if new.any():
            positions = np.flatnonzero(new)
            slots[positions] = self._add_keys(
                self._key_tuples(partials.take(pa.array(positions))),
                None if key_groups is None else key_groups[positions],
            )
            self._put(partials, positions, slots[positions], count_nulls_as_zero=True)
        if merged:
            assert self._columns is not None, "merged values without value columns"  # set with the first keys
            for column, (values, valid) in zip(self._columns, merged):
                column.put(slots[known], values, valid)
        return slots

    def load(self, table: pa.Table, key_groups: np.ndarray | None = None) -> None:
        """Add restored rows (keys, values); each key must be new. ``key_groups`` are the rows'
        key groups as stored beside them (computed again when not given)."""
        keys = self._key_tuples(table)
        first = len(self._keys)
        added = dict(zip(keys, range(first, first + len(keys))))  # also what _add_keys stores
        if len(added) != len(keys) or not self._slots.keys().isdisjoint(added):
            seen: set[tuple] = set(self._slots)
            twice = next(k for k in keys if k in seen or seen.add(k))  # type: ignore[func-returns-value]
            raise ValueError(f"key {twice!r} restored twice")
        slots = self._add_keys(keys, key_groups, added)
        self._put(table, np.arange(len(keys)), slots, count_nulls_as_zero=False)

    # -- internals ------------------------------------------------------------------------
    def _find_in_arrow(self, partials: pa.Table) -> np.ndarray | None:
        """Each row's slot (-1: a new key) by a hash lookup in Arrow, for one key column of a
        type whose Arrow equality is Python's (not floating point: Python takes -0.0 for 0.0);
        None: look the keys up in the dict instead."""
        if len(self.key_columns) != 1 or self._key_arrays is None or partials.num_columns != len(self.columns):
            return None
        column = self._key_arrays[0]
        if not _hashes_like_python(column.type):
            return None
        keys = partials.column(0)
        if keys.type != column.type:
            keys = keys.cast(column.type)
        found = pc.index_in(keys, value_set=column.whole(), skip_nulls=False)  # index = slot
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)

    def _key_tuples(self, table: pa.Table) -> list[tuple]:
        if table.num_columns != len(self.columns):
            raise PipelineError(f"keyed state of {self.columns} got a table of columns {table.column_names}")
        columns = []
        for i in range(len(self.key_columns)):
            values = python_values(table.column(i))
            if pa.types.is_floating(table.column(i).type):
                values = [_NAN if v != v else v for v in values]
            columns.append(values)
        return list(zip(*columns))

    def _add_keys(
        self, keys: list[tuple], key_groups: np.ndarray | None, added: dict[tuple, int] | None = None
    ) -> np.ndarray:
        """Give ``keys`` (all new) the next slots; ``added`` is that key → slot mapping if the
        caller built it already."""
        first = len(self._keys)
        slots = np.arange(first, first + len(keys))
        self._ensure_capacity(first + len(keys))
        if added is None:
            added = dict(zip(keys, slots.tolist()))
        if self._slots:
            self._slots.update(added)
        else:  # the usual restore into an empty state: no copy
            self._slots = added
        self._keys.extend(keys)
        if key_groups is None:
            maxp = self.max_parallelism
            key_groups = key_groups_of(keys, len(keys), maxp)
        self._key_groups[slots] = key_groups
        return slots

    def _ensure_capacity(self, size: int) -> None:
        capacity = len(self._key_groups)
        if size <= capacity:
            return
        while capacity < size:
            capacity *= 2
        self._key_groups = np.resize(self._key_groups, capacity)
        for column in self._columns or ():
            column.grow(capacity)

    def _typed_columns(self, table: pa.Table) -> tuple[list[_KeyColumn], list[_Column]]:
        if self._key_arrays is None or self._columns is None:
            nkeys, types = len(self.key_columns), table.schema.types
            self._key_arrays = [_KeyColumn(name, types[i], []) for i, name in enumerate(self.key_columns)]
            self._columns = [
                _Column.empty(name, types[nkeys + i], len(self._key_groups))
                for i, name in enumerate(self.value_columns)
            ]
        return self._key_arrays, self._columns

    def _put(self, table: pa.Table, rows: np.ndarray, slots: np.ndarray, count_nulls_as_zero: bool) -> None:
        """Set the columns of ``slots`` (new keys, in slot order) to ``table``'s ``rows``."""
        selected = table if len(rows) == table.num_rows else table.take(pa.array(rows))
        nkeys = len(self.key_columns)
        key_columns, value_columns = self._typed_columns(table)
        for i, column in enumerate(key_columns):
            column.append(int(slots[0]) if len(slots) else column.size, selected.column(i))
        for i, value_column in enumerate(value_columns):
            values, valid = _to_numpy(selected.column(nkeys + i))
            if count_nulls_as_zero and self._fns[i] == "count" and not valid.all():
                values, valid = np.where(valid, values, 0), np.ones_like(valid)
            value_column.put(slots, values, valid)

    def _merged_values(
        self, table: pa.Table, rows: np.ndarray, slots: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each value column's values and validity at ``slots`` after merging ``table``'s ``rows``."""
        selected = table.take(pa.array(rows))
        nkeys = len(self.key_columns)
        assert self._columns is not None
        out = []
        for fn, param, column, partial in zip(self._fns, self._params, self._columns, selected.columns[nkeys:]):
            new, new_valid = _to_numpy(partial)
            old, old_valid = column.values[slots], column.valid[slots]
            both = old_valid & new_valid
            merged = np.where(new_valid, new, old)  # one side missing: keep the other (possibly none)
            if both.any():
                a, b = old[both], new[both]
                result = _combine(fn, a, b, param)
                if fn in ("sum", "count") and result.dtype.kind == "i":
                    wrapped = _overflowed(a, b, result)
                    if wrapped.any():
                        key = self._keys[slots[np.flatnonzero(both)[np.argmax(wrapped)]]]
                        raise PipelineError(f"{fn} of column {column.name!r} overflows {column.type} for key {key!r}")
                merged[both] = result
            out.append((merged, old_valid | new_valid))
        return out
