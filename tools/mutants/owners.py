"""The mutants of the owner path: which owner holds, reads, merges and writes which span; the executors' state cache."""

from .model import Mutant
from .paths import (
    CACHE_TESTS,
    CHAINED_OWNERS,
    CHAINED_OWNERS_TESTS,
    OWNER_EPOCHS,
    OWNER_GUARDS,
    OWNER_TASK,
    OWNER_TASKS,
    SPAN_OWNERS,
    STATE_CACHE,
)

MUTANTS: list[Mutant] = [
    # -- the owner path: which owner holds, reads, merges and writes which span ----------------
    Mutant(
        "spans-covering-unaligned-start",
        SPAN_OWNERS,
        "range(start - start % self.per_file, stop, self.per_file)",
        "range(start, stop, self.per_file)",
        "after a span size that does not divide the old one, every new span an old one overlaps is rewritten "
        "(else its keys drop out while the key count agrees)",
        OWNER_GUARDS,
    ),
    Mutant(
        "owner-of-unaligned-key-group",
        SPAN_OWNERS,
        "key_groups - key_groups % self.per_file",
        "key_groups",
        "a span's partials all go to one owner, the one holding its first key group",
        OWNER_TASKS,
    ),
    Mutant(
        "owned-not-whole-spans",
        SPAN_OWNERS,
        "range(self._span_boundary(kgs.start), self._span_boundary(kgs.stop))",
        "range(kgs.start, kgs.stop)",
        "an owner holds whole spans: a span is never split between two owners",
        OWNER_TASKS,
    ),
    Mutant(
        "cut-gives-owners-every-row",
        SPAN_OWNERS,
        "with_groups.filter(pa.array(of_row == owner)) if len(of_row) else with_groups",
        "with_groups",
        "a read task sends each owner only the partials of its spans",
        OWNER_TASKS,
    ),
    Mutant(
        "owner-takes-every-base-span",
        OWNER_TASK,
        "ref.key_group_start < owned.stop and ref.key_group_end > owned.start",
        "True",
        "an owner keeps and rewrites only the spans it owns (else spans and keys are counted twice)",
        OWNER_TASKS,
    ),
    Mutant(
        "off-grid-span-kept",
        OWNER_TASK,
        "self.owners.span_of(r.key_group_start) == (r.key_group_start, r.key_group_end)",
        "True",
        "a span of another span size is rewritten on the current grid, never kept as it is",
        OWNER_TASKS,
    ),
    Mutant(
        "off-grid-spans-not-rewritten",
        OWNER_TASK,
        "plan_span_writes(on_grid, changed_per_span(key_groups, self.owners.per_file, "
        "self.owners.max_parallelism), off_grid)",
        "plan_span_writes(on_grid, changed_per_span(key_groups, self.owners.per_file, "
        "self.owners.max_parallelism), ())",
        "the spans of an old grid's files are rewritten whole (else their keys are lost)",
        OWNER_TASKS,
    ),
    Mutant(
        "cache-lookup-by-base-sha",
        OWNER_TASK,
        "cache.get(r.chain_digest())",
        "cache.get(r.sha256)",
        "the executor cache is looked up by the whole chain's digest (a span with deltas never gets its base's "
        "stale rows)",
        OWNER_GUARDS,
    ),
    Mutant(
        "cache-stores-fetched-under-base-sha",
        OWNER_TASK,
        "cache.put(ref.chain_digest(), *rows)",
        "cache.put(ref.sha256, *rows)",
        "a chain folded from the store is cached under the chain's digest, never under its base's",
        OWNER_GUARDS,
    ),
    Mutant(
        "cache-stores-written-under-base-sha",
        OWNER_TASK,
        "cache.put(ref.chain_digest(), state.table(slots, schema), state.key_groups(slots))",
        "cache.put(ref.sha256, state.table(slots, schema), state.key_groups(slots))",
        "a span an owner wrote is cached under its new chain's digest (the next epoch's lookup)",
        OWNER_GUARDS,
    ),
    Mutant(
        "merge-order-by-delivery",
        OWNER_EPOCHS,
        "Partial(task, sequence, pa.ipc.open_stream(ipc).read_all())",
        "Partial(0, 0, pa.ipc.open_stream(ipc).read_all())",
        "an owner merges partials in (read task, sequence) order, not the shuffle's: a retry writes the same bytes",
        OWNER_GUARDS,
    ),
    # -- the executors' state cache ----------------------------------------------------------
    Mutant(
        "cache-any-name",
        STATE_CACHE,
        'len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256)',
        "False",
        "a cache entry's name is a SHA-256 (never a path out of the cache)",
        CACHE_TESTS,
    ),
    Mutant(
        "cache-on-at-zero-bound",
        STATE_CACHE,
        "max_bytes <= 0 or not local_dirs",
        "not local_dirs",
        "checkpoint.cache_bytes 0 turns the executor cache off",
        CACHE_TESTS,
    ),
    Mutant(
        "cache-hit-not-recent",
        STATE_CACHE,
        "os.utime(path)",
        "pass",
        "a hit makes an entry the most recently used",
        CACHE_TESTS,
    ),
    Mutant(
        "cache-evicts-newest-first",
        STATE_CACHE,
        "sorted(entries)",
        "sorted(entries, reverse=True)",
        "trim evicts the least recently used entries first",
        CACHE_TESTS,
    ),
    Mutant(
        "cache-trim-deletes-fresh-temporaries",
        STATE_CACHE,
        'entry.name.endswith(".tmp") and info.st_mtime_ns < stale_before',
        'entry.name.endswith(".tmp")',
        "trim deletes only temporaries a killed worker left, never one a live worker is writing",
        CACHE_TESTS,
    ),
    # -- a dedup stage and the aggregate after it, both on owner tasks (chained_owners) ---------
    Mutant(
        "stage-rows-written-not-passed",
        OWNER_TASK,
        "passed = out if self.flow.passes else None",
        "passed = None",
        "a dedup stage's owner hands its rows on to its flow's owners rather than writing them as its own output",
        CHAINED_OWNERS_TESTS,
    ),
    Mutant(
        "chained-rows-to-driver",
        CHAINED_OWNERS,
        "is_rows if self.keep else value[0] != ROWS",
        "is_rows if self.keep else True",
        "the stage's rows go only to its flow's owner tasks: the driver collects references, never rows",
        CHAINED_OWNERS_TESTS,
    ),
]
