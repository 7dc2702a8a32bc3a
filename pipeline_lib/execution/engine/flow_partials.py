"""What a Python worker makes of one flow's records on the Arrow path: its rows as read, or its
partial aggregate per key (one row per key, mergeable with the partials of other batches, tasks
and epochs). A windowed flow's records are first assigned their windows (event_windows), whose
bounds join the key; ``count_distinct`` partials are the set of values per key, as a list, and
the approximate ones a serialized sketch per key (sketches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.event_windows import HIDDEN_PARTIALS, WindowAssigner
from pipeline_lib.execution.engine.first_last import FIRST_LAST, Ranked, pick
from pipeline_lib.execution.engine.session_candidates import LATE_CANDIDATES, split_candidates, with_candidates
from pipeline_lib.execution.engine.sketches import SKETCH_FUNCTIONS, sketch_merge, sketch_of
from pipeline_lib.execution.engine.top_values import top_merge, top_of

if TYPE_CHECKING:  # a worker takes plain values made of the spec, never its models
    from pipeline_lib.spec.flow_spec import AggregateSpec

_ROW = "__row"  # a row's index, to gather the sets of count_distinct partials by group
_GATHERED = ("count_distinct", "top", *SKETCH_FUNCTIONS, *FIRST_LAST)  # partials merged in Python, by group
_LISTED = ("top", *SKETCH_FUNCTIONS)  # partials made in Python from each group's list of values


_SKIP_NULLS = pc.ScalarAggregateOptions(skip_nulls=True, min_count=1)  # all-null group → null, as in Spark
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class FlowInWorker:
    """What a worker makes of one flow: its rows as read (no ``keys``) or its partial aggregate."""

    keys: tuple[str, ...] = ()
    aggregates: tuple[tuple[str, str, str | None], ...] = ()  # (output name, function, column; None: count(*))
    window: WindowAssigner | None = None  # a windowed flow's windows (its keys end with their bounds)
    tops: tuple[tuple[str, int], ...] = ()  # (output name, n) of each top(col, n)
    orders: tuple[tuple[str, str], ...] = ()  # (output name, event-time column) of each first/last

    @classmethod
    def of(cls, agg: AggregateSpec | None) -> FlowInWorker:
        """The worker side of a flow with aggregate ``agg`` (None: a stateless flow): the
        state's key and running values (event_windows), and a windowed flow's hidden partials."""
        if agg is None:
            return cls()
        window = WindowAssigner.of(agg)
        functions = agg.state_functions()
        aggregates = tuple((name, f.name, f.column) for name, f in functions.items())
        tops = tuple((name, int(f.param or 0)) for name, f in functions.items() if f.name == "top")
        orders = tuple((name, f.order) for name, f in functions.items() if f.order is not None)
        return cls(tuple(agg.state_key()), aggregates + (HIDDEN_PARTIALS if window else ()), window, tops, orders)

    @property
    def hashed(self) -> tuple[str, ...]:
        """The key columns a partial's key group is hashed from: a session's grouping key only
        (its bounds change as it merges with others, its key group must not: session_merge),
        else the whole state key."""
        if self.window is not None and self.window.gap_ms:
            return self.window.keys  # guard: session-hashed-by-bounds
        return self.keys

    @property
    def stateful(self) -> bool:
        """True for an aggregating flow (partials per key), False for one whose rows pass through."""
        return bool(self.keys)

    def partials(self, table: pa.Table) -> pa.Table:
        """At most one row per key of ``table``: the key columns, then one partial per aggregate."""
        if self.window is not None:
            table = self.window.assign(table)
        specs: list[tuple] = []
        ranked: dict[str, Ranked] = {}  # by event-time column: the records' order, for first/last
        orders = dict(self.orders)
        for name, fn, column in self.aggregates:
            if fn in FIRST_LAST:
                order = orders[name]
                if order not in ranked:
                    ranked[order] = Ranked(table, order)
                    table = table.append_column(f"__rank_{order}", ranked[order].rank)
                specs.append((f"__rank_{order}", "min" if fn == "first" else "max", _SKIP_NULLS))
            elif fn == "count_distinct":
                specs.append((column, "distinct", pc.CountOptions("only_valid")))
            elif fn in _LISTED:
                specs.append((column, "list"))  # each group's values, made its partial below
            elif fn == "count":
                specs.append((column or self.keys[0], "count", pc.CountOptions("only_valid" if column else "all")))
            elif column is None:
                raise ValueError(f"aggregate {fn} needs an input column")
            else:
                specs.append((column, fn, _SKIP_NULLS))
        self._check_sums(table, [(column, fn) for _, fn, column in self.aggregates])
        grouped = self._grouped(table, specs)
        for i, (name, fn, column) in enumerate(self.aggregates):
            if fn in FIRST_LAST:  # each group's rank back to its record's (t, p, o, v)
                structs = ranked[orders[name]].structs(grouped.column(len(self.keys) + i), column or "")
                grouped = grouped.set_column(len(self.keys) + i, name, structs)
        return self._sketched(grouped)

    def _sketched(self, grouped: pa.Table) -> pa.Table:
        """``grouped`` with each sketch function's list of values per group made its sketch, and
        each top's made its n largest."""
        nkeys, tops = len(self.keys), dict(self.tops)
        for i, (name, fn, column) in enumerate(self.aggregates):
            if fn == "top":
                lists = [top_of(values, tops[name]) for values in grouped.column(nkeys + i).to_pylist()]
                grouped = grouped.set_column(nkeys + i, name, pa.array(lists, grouped.schema.field(nkeys + i).type))
            elif fn in SKETCH_FUNCTIONS:
                where = f"{fn}({column})"
                sketches = [sketch_of(fn, values, where) for values in grouped.column(nkeys + i).to_pylist()]
                grouped = grouped.set_column(nkeys + i, name, pa.array(sketches, pa.binary()))
        return grouped

    def combined(self, partials: Sequence[pa.Table]) -> pa.Table:
        """Partials of the same keys (from several batches or tasks) folded into one row per key."""
        if len(partials) == 1:
            return partials[0]
        if LATE_CANDIDATES in partials[0].column_names:  # a session's late candidates: their lists joined
            split = [split_candidates(p, self.hashed) for p in partials]
            folded = self.combined([rest for rest, _ in split])
            candidates = pa.concat_tables([c for _, c in split if c is not None])
            return with_candidates(folded, candidates, self.hashed)
        table = pa.concat_tables(partials)
        self._check_sums(table, [(name, "sum" if fn == "count" else fn) for name, fn, _ in self.aggregates])
        if not any(fn in _GATHERED for _, fn, _ in self.aggregates):
            return self._grouped(
                table, [(name, "sum" if fn == "count" else fn, _SKIP_NULLS) for name, fn, _ in self.aggregates]
            )
        return self._combined_sets(table)

    def _combined_sets(self, table: pa.Table) -> pa.Table:
        """``combined`` with count_distinct or sketch partials: each group's rows by index (one
        grouping, so they line up with its other partials), whose sets are joined (sketches
        merged) in Python (partial rows number the keys changed, not the records)."""
        table = table.append_column(_ROW, pa.array(range(table.num_rows), pa.int64()))
        specs: list = [
            (_ROW, "list") if fn in _GATHERED else (name, "sum" if fn == "count" else fn, _SKIP_NULLS)
            for name, fn, _ in self.aggregates
        ]
        grouped = self._grouped(table, specs)
        nkeys, tops = len(self.keys), dict(self.tops)
        for i, (name, fn, _) in enumerate(self.aggregates):
            if fn not in _GATHERED:
                continue
            values, groups = table.column(name).to_pylist(), grouped.column(nkeys + i).to_pylist()
            if fn == "top":
                n = tops[name]
                lists = [top_merge([values[r] for r in rows], n) for rows in groups]  # guard: top-partials-merge
                grouped = grouped.set_column(nkeys + i, name, pa.array(lists, table.schema.field(name).type))
                continue
            if fn in FIRST_LAST:
                firsts = [pick(fn, [values[r] for r in rows]) for rows in groups]  # guard: first-last-partials-merge
                grouped = grouped.set_column(nkeys + i, name, pa.array(firsts, table.schema.field(name).type))
                continue
            if fn in SKETCH_FUNCTIONS:
                merge = sketch_merge
                merged = [merge(fn, [values[r] for r in rows]) for rows in groups]  # guard: sketch-partials-merge
                grouped = grouped.set_column(nkeys + i, name, pa.array(merged, pa.binary()))
                continue
            sets = [sorted({v for r in rows for v in values[r] or ()}) for rows in groups]
            grouped = grouped.set_column(nkeys + i, name, pa.array(sets, table.schema.field(name).type))
        return grouped

    def _grouped(self, table: pa.Table, specs: list) -> pa.Table:
        # use_threads=False: groups come out in order of first appearance, the same in every attempt
        grouped = table.group_by(list(self.keys), use_threads=False).aggregate(specs)
        nkeys = len(self.keys)
        if grouped.column_names[:nkeys] != list(self.keys):  # older pyarrow puts the keys last
            grouped = grouped.select(list(range(len(specs), len(specs) + nkeys)) + list(range(len(specs))))
        return grouped.rename_columns(list(self.keys) + [name for name, _, _ in self.aggregates])

    def _check_sums(self, table: pa.Table, sums: list[tuple[str | None, str]]) -> None:
        """Refuse an integer sum that leaves int64 (pyarrow's wraps around; Spark's raises).

        Wrapped intermediate sums are harmless (addition modulo 2**64 gives the exact total when
        the total fits), so only a group whose exact total does not fit is an error; it is looked
        for, in decimals, only when the column's largest magnitude times its rows could reach it."""
        for column, fn in sums:
            if fn != "sum" or column is None or not pa.types.is_integer(table.schema.field(column).type):
                continue
            bounds = pc.min_max(table.column(column))
            low, high = bounds["min"].as_py() or 0, bounds["max"].as_py() or 0
            if max(abs(low), abs(high)) * table.num_rows <= _INT64_MAX:
                continue
            exact = table.select(list(self.keys)).append_column(
                "exact", pc.cast(table.column(column), pa.decimal128(38, 0))
            )
            totals = exact.group_by(list(self.keys), use_threads=False).aggregate([("exact", "sum")])
            over = pc.or_(pc.greater(totals["exact_sum"], _INT64_MAX), pc.less(totals["exact_sum"], -_INT64_MAX - 1))
            if pc.any(over).as_py():
                row = totals.filter(pc.fill_null(over, False)).slice(0, 1).to_pylist()[0]
                key = tuple(row[k] for k in self.keys)
                raise PipelineError(f"sum of column {column!r} overflows bigint for key {key!r}")
