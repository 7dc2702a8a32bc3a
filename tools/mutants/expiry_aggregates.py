"""The mutants of expiring state and the aggregates on owner tasks."""

from .model import Mutant
from .paths import AGGREGATE_TTL, DRIVER_MERGE, EXPIRY_ROWS, OWNER_TASK, RETRACTIONS, TABLE_READER, TTL_EXPIRY

MUTANTS: list[Mutant] = [
    # -- a plain running aggregate's ttl (spec.md, "Expiring state") -----------------------------
    Mutant(
        "ttl-expiry-boundary",
        TTL_EXPIRY,
        "last_ms + ttl_ms <= clock_ms",
        "last_ms + ttl_ms < clock_ms",
        "an aggregate's key leaves exactly ttl after its last update on its clock, not a tick later",
        AGGREGATE_TTL,
    ),
    Mutant(
        "ttl-expired-kept",
        TTL_EXPIRY,
        "fresh, remap = evicted(agg, state, schema, gone)",
        "fresh, remap = state, np.arange(len(state))",
        "an expired key leaves the aggregate's state, so its next record starts from zero",
        AGGREGATE_TTL,
    ),
    Mutant(
        "ttl-expired-span-as-delta",
        DRIVER_MERGE,
        "flow.state_files = spans_without(flow.state_files, gone.groups)",
        "flow.state_files = flow.state_files",
        "a span that lost an expired key is written whole, as a delta would leave the key in its base",
        AGGREGATE_TTL,
    ),
    # -- keys a ttl expires leave every sink once (spec.md, "What the sinks see") -------------
    Mutant(
        "ttl-retractions-dropped",
        DRIVER_MERGE,
        "expired_slots(remap)",
        "expired_slots(None)",
        "the epoch that expires a key writes its delete, so the sinks drop the key",
        (*AGGREGATE_TTL, *RETRACTIONS),
    ),
    Mutant(
        "retraction-written-twice",
        EXPIRY_ROWS,
        "kept = changed[~np.isin(changed, expired)]",
        "kept = changed",
        "a key that changed and expired in one epoch is written once, as its delete",
        RETRACTIONS,
    ),
    Mutant(
        "retraction-not-written",
        EXPIRY_ROWS,
        "np.concatenate([kept, expired])",
        "kept",
        "an expired key's delete is among the epoch's rows",
        RETRACTIONS,
    ),
    Mutant(
        "retraction-ignored-by-reader",
        TABLE_READER,
        "is_deleted(row)",
        "False",
        "read_upsert_table drops a key whose last row is a delete",
        RETRACTIONS,
    ),
    Mutant(
        "retraction-kept-in-table",
        "pipeline_lib/sink/retractions.py",
        "live = rows.filter(pc.invert(pc.fill_null(rows.column(DELETED_COLUMN), False)))",
        "live = rows",
        "a Delta or Iceberg upsert does not write an expired key's row back",
        RETRACTIONS,
    ),
    Mutant(
        "delta-merge-keeps-expired-rows",
        "pipeline_lib/sink/delta_merge.py",
        "touched",
        "changed",
        "a bucket's merge drops the current row of a key the epoch expired",
        RETRACTIONS,
    ),
    Mutant(
        "delta-expired-key-kept",
        "pipeline_lib/sink/delta_sink.py",
        "merger.when_matched_delete(predicate=deleted)",
        "merger",
        "a partitioned Delta upsert's MERGE deletes the rows of keys the epoch expired",
        RETRACTIONS,
    ),
    # -- avg, count_distinct, the sketches and top on owner tasks (distributed-state.md) ------------
    Mutant(
        "owner-derived-rows",
        OWNER_TASK,
        "self.derived is not None",
        "False",
        "an owner task writes a derived aggregate's averages, estimates and quantiles, not its state's sketches",
        ("tests/unit/test_owner_derived.py",),
    ),
    Mutant(
        "owner-top-keeps-n",
        OWNER_TASK,
        "AggregateFunction(fn, column, tops.get(name))",
        "AggregateFunction(fn, column)",
        "an owner task merges a key's top(col, n) into its n largest values, not into none",
        ("tests/unit/test_owner_derived.py",),
    ),
]
