"""The commit protocol's safety lines, each as a mutant that removes it (see tools/mutation.py).

The library marks a mutant's line with ``# guard: <id>`` (on each statement, for a mutant that
changes several). ``original`` is Python source matched by its syntax tree, never its text: either
the marked statements themselves, which ``replacement`` replaces, or an expression occurring once
in the marked statement (a compound statement's header), which ``replacement`` replaces. So the
library can be formatted freely. The unit tests must fail for every mutant; ``removes`` says which
guarantee would be lost.
``tests``: the unit test files that kill it, run first (the commit protocol's files when empty);
the rest of the unit tier runs only if they do not, so a mutant that only another file kills is
still caught, at the cost of a second pytest run.
When the code changes so that a marker is missing or ``original`` does not match, the runner stops
and says the list is stale: update the mutant with the code, never drop it silently.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    """One safety line removed: ``file``'s statement(s) marked ``# guard: <id>`` mutated."""

    id: str
    file: str
    original: str
    replacement: str
    removes: str
    tests: tuple[str, ...] = ()


SNAPSHOTS = "pipeline_lib/checkpoint/snapshot_store.py"
RESTORE = "pipeline_lib/checkpoint/restore.py"
MANIFEST = "pipeline_lib/checkpoint/manifest.py"
SINK = "pipeline_lib/sink/files_sink.py"
LIFECYCLE = "pipeline_lib/execution/runtime/lifecycle.py"
RUNNER_TYPES = "pipeline_lib/execution/runtime/runner_types.py"
RUNNER_PLANNING = "pipeline_lib/execution/runtime/runner_planning.py"
EPOCH_COMMIT = "pipeline_lib/checkpoint/epoch_commit.py"
LOCAL = "pipeline_lib/storage/local.py"
VERIFICATION = "pipeline_lib/execution/state/restore_verification.py"
STATE_FILES = "pipeline_lib/checkpoint/state_files.py"
OFFSETS = "pipeline_lib/plan/offsets.py"
KEYGROUPS = "pipeline_lib/plan/keygroups.py"
SPAN_OWNERS = "pipeline_lib/execution/state/span_owners.py"
OWNER_TASK = "pipeline_lib/execution/state/owner_task.py"
OWNER_EPOCHS = "pipeline_lib/execution/state/owner_epochs.py"
STATE_CACHE = "pipeline_lib/execution/state/state_cache.py"
RESTORE_PLAN = "pipeline_lib/recovery/restore_plan.py"
REPAIR_PLAN = "pipeline_lib/recovery/repair_plan.py"
REPAIR = "pipeline_lib/recovery/repair.py"
CLI_PLAN = "pipeline_lib/commands/planning.py"
KAFKA_BATCHES = "pipeline_lib/execution/source/kafka_batches.py"
BATCH_CONSUMER = "pipeline_lib/execution/source/batch_consumer.py"
RECORD_DECODING = "pipeline_lib/execution/source/record_decoding.py"
RECORD_BATCHER = "pipeline_lib/execution/source/record_batcher.py"
ERROR_ROWS = "pipeline_lib/execution/source/error_rows.py"
KAFKA_VERSION = "pipeline_lib/kafka_adapter/version.py"
WATERMARK = "pipeline_lib/execution/state/watermark.py"
WINDOW_CLOSE = "pipeline_lib/execution/state/window_close.py"
RUNNER_PARTS = "pipeline_lib/execution/runtime/runner_parts.py"
SESSION_MERGE = "pipeline_lib/execution/state/session_merge.py"
WINDOWS = ("tests/unit/test_window_state.py",)
TTL_EXPIRY = "pipeline_lib/execution/state/ttl_expiry.py"
DRIVER_MERGE = "pipeline_lib/execution/runtime/driver_merge.py"
AGGREGATE_TTL = ("tests/unit/test_aggregate_ttl.py",)
SESSIONS = ("tests/unit/test_session_merge.py",)

PROCESS_STATE = "pipeline_lib/execution/state/process_state.py"
DEDUP = "pipeline_lib/execution/state/dedup.py"
DRIVER_STATE = "pipeline_lib/execution/runtime/driver_state.py"
PROCESS_MERGE = "pipeline_lib/execution/runtime/process_merge.py"
PROCESS_OWNER = "pipeline_lib/execution/state/process_owner.py"
PROCESS_TIMERS = "pipeline_lib/execution/state/process_timers.py"
PROCESS_HANDLE = "pipeline_lib/execution/state/process_handle.py"
TIMER_TESTS = ("tests/unit/test_process_timers.py",)
KAFKA_WRITER = "pipeline_lib/sink/kafka_writer.py"
KAFKA_WRITER_TESTS = ("tests/unit/test_kafka_writer.py",)

# The unit test files that kill the owner path's, planning's and repair's mutants.
OWNER_GUARDS = ("tests/unit/test_owner_path_guards.py",)
PROCESS_TESTS = ("tests/unit/test_process_state.py",)
OWNER_TASKS = ("tests/unit/test_owner_tasks.py",)
CACHE_TESTS = ("tests/unit/test_state_cache.py",)
PLANNING_GUARDS = ("tests/unit/test_planning_guards.py",)
REPAIR_TESTS = ("tests/unit/test_repair_plan.py",)
CLI_TESTS = ("tests/unit/test_cli_errors.py",)
BATCH_TESTS = ("tests/unit/test_kafka_batches.py",)
RANGE_TESTS = ("tests/unit/test_range_reads.py",)
DECODING_TESTS = ("tests/unit/test_fast_decoding.py",)
BAD_RECORDS = ("tests/unit/test_record_batcher_bad_records.py",)
ADAPTER = ("tests/unit/test_kafka_adapter.py",)
STREAMING = ("tests/unit/test_airflow_streaming.py",)
RUN_WATCH = "pipeline_lib/orchestration/run_watch.py"
EPOCH_EVENTS = "pipeline_lib/orchestration/epoch_events.py"
DELTA = ("tests/unit/test_delta_sink.py",)
DELTA_SINK = "pipeline_lib/sink/delta_sink.py"
DELTA_MERGE = "pipeline_lib/sink/delta_merge.py"
DELTA_MERGE_TESTS = ("tests/unit/test_delta_merge.py",)
VERIFY_TABLES = "pipeline_lib/recovery/verify_tables.py"
ICEBERG = ("tests/unit/test_iceberg_sink.py",)
ICEBERG_SINK = "pipeline_lib/sink/iceberg_sink.py"

MUTANTS: list[Mutant] = [
    # -- HEAD: the commit --------------------------------------------------------------------
    Mutant(
        "head-cas-plain-put",
        SNAPSHOTS,
        "version = self.store.put_if(layout.HEAD_KEY, head.model_dump_json(indent=1).encode(), expected_version)",
        "self.store.put(layout.HEAD_KEY, head.model_dump_json(indent=1).encode())\n"
        "version = self.store.get_versioned(layout.HEAD_KEY)[1]",
        "the HEAD compare-and-swap: an overtaken attempt could still commit over the newer one",
    ),
    Mutant(
        "head-check-noop",
        SNAPSHOTS,
        "(found[1] if found else None) != expected_version",
        "False",
        "ensure_head_unchanged: a fenced attempt would go on writing sink output",
    ),
    Mutant(
        "runner-skips-head-check",
        EPOCH_COMMIT,
        "snapshots.ensure_head_unchanged(head_version)",
        "None",
        "the runner's head check before any visible write of an epoch",
    ),
    Mutant(
        "runner-head-before-manifest",
        EPOCH_COMMIT,
        "manifest_sha = snapshots.write_manifest(manifest)\n"
        'fault_point("after_manifest", epoch)\n'
        "head, version = snapshots.move_head(manifest, manifest_sha, history, head_version, owner.retain)",
        'manifest_sha = __import__("hashlib").sha256(manifest.to_bytes()).hexdigest()\n'
        "head, version = snapshots.move_head(manifest, manifest_sha, history, head_version, owner.retain)\n"
        "snapshots.write_manifest(manifest)",
        "commit order: the manifest is durable before HEAD points at it",
    ),
    Mutant(
        "reset-head-ignores-read-version",
        SNAPSHOTS,
        "version != expected_version or (version := self.store.put_if(layout.HEAD_KEY, empty, version)) is None",
        "(version := self.store.put_if(layout.HEAD_KEY, empty, version)) is None",
        "start-over resets HEAD only from the version this attempt read at its start",
    ),
    Mutant(
        "reset-head-plain-put",
        SNAPSHOTS,
        "(version := self.store.put_if(layout.HEAD_KEY, empty, version))",
        "self.store.put(layout.HEAD_KEY, empty) or (version := self.store.get_versioned(layout.HEAD_KEY)[1])",
        "start-over's HEAD reset is a compare-and-swap: a commit landing meanwhile fences the reset",
    ),
    # -- attempts and STATUS -----------------------------------------------------------------
    Mutant(
        "claim-attempt-plain-put",
        SNAPSHOTS,
        'self.store.put_if(layout.attempt_key(attempt), b"", None) is None',
        'self.store.put(layout.attempt_key(attempt), b"") is not None',
        "claim_attempt's exclusive create: two runners could hold one attempt number",
    ),
    Mutant(
        "status-cas-plain-put",
        SNAPSHOTS,
        "return self.store.put_if(layout.STATUS_KEY, status.model_dump_json(indent=1).encode(), expected_version)",
        "self.store.put(layout.STATUS_KEY, status.model_dump_json(indent=1).encode())\n"
        "return self.store.get_versioned(layout.STATUS_KEY)[1]",
        "the STATUS compare-and-swap: a write racing a newer attempt's would replace its record",
    ),
    Mutant(
        "lifecycle-ignores-newer-attempt",
        LIFECYCLE,
        "found is not None and found.attempt > self.attempt",
        "False",
        "a newer attempt's STATUS record fences an older attempt's writes",
    ),
    Mutant(
        "lifecycle-fence-not-sticky",
        LIFECYCLE,
        "if self.fenced:\n    return",
        "pass",
        "a fenced attempt never writes STATUS again",
    ),
    # -- the local store's compare-and-swap --------------------------------------------------
    Mutant(
        "local-put-if-no-precondition",
        LOCAL,
        "(current[1] if current else None) != expected_version",
        "False",
        "LocalStore.put_if's precondition, under every compare-and-swap of a local store",
    ),
    Mutant(
        "local-version-size-only",
        LOCAL,
        'f"{st.st_mtime_ns}-{st.st_size}-{hashlib.sha256(data).hexdigest()[:16]}"',
        'f"{st.st_size}"',
        "a version token changes with every write, not only with the size",
    ),
    # -- the sink's _SUCCESS marker ----------------------------------------------------------
    Mutant(
        "marker-cas-plain-put",
        SINK,
        "self.store.put_if(self.marker_key(epoch), marker.model_dump_json(indent=1).encode(), version) is None",
        "self.store.put(self.marker_key(epoch), marker.model_dump_json(indent=1).encode()) is not None",
        "the _SUCCESS compare-and-swap: a marker committed while this attempt wrote parts is replaced",
    ),
    Mutant(
        "marker-ignores-newer-attempt",
        SINK,
        "existing is not None and existing.writer() > attempt",
        "False",
        "a newer attempt's marker fences an older writer of the epoch",
    ),
    Mutant(
        "marker-reused-for-any-digest",
        SINK,
        "existing is not None and existing.digest == digest",
        "existing is not None",
        "a committed epoch is reused only for the same planned input (equal digest)",
    ),
    Mutant(
        "marker-reused-with-lost-parts",
        SINK,
        "self._parts_intact(existing)",
        "True",
        "a marker is reused only while every part it lists is there with its size",
    ),
    Mutant(
        "sink-digest-ignores-spec",
        RUNNER_TYPES,
        'f"{plan.digest()}|{fingerprint}|{parallelism}|{kind}"',
        'f"{plan.digest()}|{parallelism}|{kind}"',
        "a sink epoch is reused only under the same spec (other transforms give other rows)",
    ),
    Mutant(
        "replayed-plan-keeps-old-base",
        RUNNER_PLANNING,
        'planned.model_copy(update={"base_snapshot": base})',
        "planned",
        "a replayed plan's lineage names the snapshot it was really built on",
    ),
    Mutant(
        "dead-letter-stale-parts-kept",
        EPOCH_COMMIT,
        "dead_letters.sink.remove_stale_parts(dead_letter_commit, owner.attempt)",
        "None",
        "an epoch's clean-up removes older attempts' dead-letter parts as well as the flows'",
    ),
    Mutant(
        "stale-parts-ignores-newer-marker",
        SINK,
        "current is None or current.writer() > attempt",
        "current is None",
        "clean-up deletes nothing once a newer attempt's marker is in place",
    ),
    Mutant(
        "stale-parts-ignores-marker-in-place",
        SINK,
        "{f.key for f in commit.files} | {f.key for f in current.files}",
        "{f.key for f in commit.files}",
        "clean-up never deletes a part the marker in place lists",
    ),
    Mutant(
        "stale-parts-deletes-non-parts",
        SINK,
        'key in listed or not key.rsplit("/", 1)[-1].startswith("part-")',
        "key in listed",
        "clean-up deletes part files only (never the _SUCCESS marker)",
    ),
    Mutant(
        "stale-parts-deletes-newer-attempts",
        SINK,
        "writer is None or writer <= attempt",
        "True",
        "clean-up never deletes a part of a newer attempt (one writing the epoch right now)",
    ),
    Mutant(
        "stale-parts-keeps-own-orphans",
        SINK,
        "writer <= attempt",
        "writer < attempt",
        "clean-up deletes this attempt's parts the marker does not list (a failed task attempt's)",
    ),
    Mutant(
        "retract-ignores-newer-marker",
        SINK,
        "existing is not None and existing.writer() > attempt",
        "False",
        "start-over never retracts an epoch a newer attempt committed",
    ),
    Mutant(
        "retract-marker-plain-put",
        SINK,
        "self.store.put_if(self.marker_key(epoch), empty.model_dump_json(indent=1).encode(), version) is None",
        "self.store.put(self.marker_key(epoch), empty.model_dump_json(indent=1).encode()) is not None",
        "start-over's empty marker is a compare-and-swap: a marker committed meanwhile fences it",
    ),
    # -- restore verification ----------------------------------------------------------------
    Mutant(
        "restore-ignores-head-sha",
        RESTORE,
        "snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)",
        "snapshots.load_manifest(entry.snapshot_id, None)",
        "restore checks the manifest against its SHA-256 in HEAD",
    ),
    Mutant(
        "manifest-sha-unchecked",
        SNAPSHOTS,
        "expected_sha is not None and sha256_hex(data) != expected_sha",
        "False",
        "load_manifest compares the manifest's bytes with the SHA-256 it was committed with",
    ),
    Mutant(
        "manifest-self-checksum-skipped",
        SNAPSHOTS,
        "not manifest.verify_checksum()",
        "False",
        "load_manifest rejects a manifest whose self-checksum fails",
    ),
    Mutant(
        "manifest-verify-always-true",
        MANIFEST,
        "bool(self.checksum) and self.checksum == sha256_hex(self._body())",
        "True",
        "Manifest.verify_checksum compares the sealed checksum with the body",
    ),
    Mutant(
        "restore-skips-sink-marker",
        RESTORE,
        "not sink.exists(commit.sink.marker)",
        "False",
        "restore requires each flow's _SUCCESS marker",
    ),
    Mutant(
        "restore-skips-dead-letter-marker",
        RESTORE,
        "dlq is None or not dlq.exists(manifest.dead_letters.marker)",
        "False",
        "restore requires the dead-letter commit's _SUCCESS marker",
    ),
    Mutant(
        "restore-skips-part-files",
        RESTORE,
        'check_part_files(sink, commit.sink, f"flow {name}")',
        "None",
        "restore requires every part file a flow's sink commit lists",
    ),
    Mutant(
        "restore-skips-dead-letter-part-files",
        RESTORE,
        'check_part_files(dlq, manifest.dead_letters, "dead letters")',
        "None",
        "restore requires every part file the dead-letter commit lists",
    ),
    Mutant(
        "restore-skips-part-size",
        RESTORE,
        "size != ref.bytes",
        "False",
        "restore requires each listed part file to have its recorded size",
    ),
    Mutant(
        "restore-skips-row-count",
        RESTORE,
        "file_table.num_rows != ref.rows",
        "False",
        "restore compares each state file's rows with the manifest",
    ),
    Mutant(
        "restore-skips-key-count",
        RESTORE,
        "flow.rows != commit.state.keys",
        "False",
        "restore compares a flow's restored keys with the manifest's key count",
    ),
    Mutant(
        "restore-skips-key-group-range",
        RESTORE,
        "len(outside)",
        "False",
        "restore rejects a state file holding a key group outside its span",
    ),
    Mutant(
        "restore-skips-state-sha",
        RESTORE,
        "sha256_hex(data) != ref.sha256",
        "False",
        "restore checks every state file (span of a pack) against its SHA-256",
    ),
    Mutant(
        "restore-exact-id-falls-back",
        RESTORE,
        "exact",
        "False",
        "a restore of an explicit snapshot id refuses instead of silently restoring an older one",
    ),
    Mutant(
        "restore-after-exact-id-falls-back",
        RESTORE,
        "exact",
        "False",
        "an explicit snapshot id whose state the executors refuse is refused, not an older one restored",
    ),
    # -- restore verification on the executors (the owner path) -----------------------------
    Mutant(
        "verification-ignores-a-problem",
        VERIFICATION,
        "check.problem is not None",
        "False",
        "a span an owner found missing or corrupt refuses the snapshot",
    ),
    Mutant(
        "span-skips-file-check",
        RESTORE,
        "check_state_file(file_ref, file_table, file_groups)",
        "None",
        "the driver and the executors check each file of a span's chain (rows, key groups) against the manifest",
    ),
    Mutant(
        "span-skips-key-count",
        RESTORE,
        "table.num_rows != ref.span_keys()",
        "False",
        "a span folded from its base and deltas must hold the keys its manifest entry says",
    ),
    Mutant(
        "span-fold-keeps-oldest-value",
        STATE_FILES,
        "last[np.lexsort((first, key_groups[first]))]",
        "first[np.lexsort((first, key_groups[first]))]",
        "a span's key takes its value from the newest delta holding it",
    ),
    Mutant(
        "span-chain-reads-base-only",
        MANIFEST,
        '[self.model_copy(update={"deltas": (), "keys": None}), *self.deltas]',
        '[self.model_copy(update={"deltas": (), "keys": None})]',
        "every reader of a span (restore, verification, owners, GC) takes its deltas too",
    ),
    Mutant(
        "verification-skips-key-count",
        VERIFICATION,
        "rows != commit.state.keys",
        "False",
        "the owners' rows of a flow must be the manifest's key count",
    ),
    # -- garbage collection ------------------------------------------------------------------
    Mutant(
        "gc-deletes-newer-manifests",
        SNAPSHOTS,
        "sid not in retained and layout.epoch_of_snapshot(sid) <= latest.epoch",
        "sid not in retained",
        "GC never deletes a manifest newer than the head (an epoch being committed)",
    ),
    Mutant(
        "gc-deletes-newer-state",
        SNAPSHOTS,
        "key not in referenced and layout.epoch_of_snapshot(sid) <= latest.epoch",
        "key not in referenced",
        "GC never deletes state newer than the head (an epoch being committed)",
    ),
    Mutant(
        "gc-refs-latest-only",
        SNAPSHOTS,
        "head.history",
        "head.history[:1]",
        "GC keeps what every retained snapshot references, not only the newest",
    ),
    Mutant(
        "gc-ignores-deltas",
        MANIFEST,
        "ref.chain()",
        "[ref]",
        "GC keeps the packs holding a retained span's deltas, not only its base",
    ),
    Mutant(
        "gc-ignores-references",
        SNAPSHOTS,
        "referenced |= refs",
        "pass",
        "GC keeps every state object a retained snapshot references",
    ),
    Mutant(
        "gc-deletes-retained-plans",
        SNAPSHOTS,
        "int(k[6:16]) < oldest_epoch",
        "int(k[6:16]) <= latest.epoch",
        "GC keeps the plans of retained epochs (a restore of any of them replays the same input)",
    ),
    # -- planning ----------------------------------------------------------------------------
    Mutant(
        "plan-digest-ignores-ranges",
        OFFSETS,
        '{"epoch", "positions", "ranges"}',
        '{"epoch", "positions"}',
        "the plan digest covers the ranges: other input never reuses a committed sink epoch",
    ),
    Mutant(
        "plan-digest-ignores-positions",
        OFFSETS,
        '{"epoch", "positions", "ranges"}',
        '{"epoch", "ranges"}',
        "the plan digest covers the positions",
    ),
    Mutant(
        "plan-digest-ignores-epoch",
        OFFSETS,
        '{"epoch", "positions", "ranges"}',
        '{"positions", "ranges"}',
        "the plan digest covers the epoch",
    ),
    Mutant(
        "plan-range-end-past-share",
        OFFSETS,
        "positions[p] + shares[p]",
        "positions[p] + shares[p] + 1",
        "a planned range ends at start + share, never past the target or stop offset",
    ),
    Mutant(
        "plan-end-positions-unmoved",
        OFFSETS,
        "{**self.positions, **{r.partition: r.end for r in self.ranges}}",
        "dict(self.positions)",
        "a snapshot's positions are its epoch's range ends (else records are read twice)",
    ),
    # -- key groups --------------------------------------------------------------------------
    Mutant(
        "keygroup-md5",
        KEYGROUPS,
        'zlib.crc32(encoded.encode("utf-8"))',
        'int.from_bytes(__import__("hashlib").md5(encoded.encode("utf-8")).digest()[:4], "big")',
        "the key-group hash is crc32: stored snapshots place keys by it",
    ),
    Mutant(
        "keygroup-ascii-json",
        KEYGROUPS,
        'json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=False)',
        'json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=True)',
        "the canonical form keeps non-ASCII characters as UTF-8",
    ),
    Mutant(
        "keygroup-spaced-json",
        KEYGROUPS,
        'json.dumps([_canonical(v) for v in key], separators=(",", ":"), ensure_ascii=False)',
        "json.dumps([_canonical(v) for v in key], ensure_ascii=False)",
        "the canonical form is compact JSON",
    ),
    Mutant(
        "keygroup-float-as-int",
        KEYGROUPS,
        "value",
        "int(value)",
        "float keys keep their type: 1.0 and 1 are different keys",
    ),
    Mutant(
        "keygroup-datetime-str",
        KEYGROUPS,
        "value.isoformat()",
        "str(value)",
        "dates and times are canonicalised as ISO 8601",
    ),
    Mutant(
        "keygroup-decimal-raw",
        KEYGROUPS,
        "str(value)",
        "value",
        "decimal keys are canonicalised as their text (JSON has no decimals)",
    ),
    Mutant(
        "keygroup-range-start",
        KEYGROUPS,
        "subtask * max_parallelism + parallelism - 1",
        "subtask * max_parallelism",
        "subtask key-group ranges tile [0, max_parallelism) and agree with subtask_of",
    ),
    Mutant(
        "subtask-of-modulo",
        KEYGROUPS,
        "key_group * parallelism // max_parallelism",
        "key_group % parallelism",
        "subtask_of gives each key group to the subtask whose range holds it",
    ),
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
    # -- restore verification on the executors -----------------------------------------------
    Mutant(
        "verification-owner-ignores-columns",
        VERIFICATION,
        "schemas.setdefault(flow, table.schema) != table.schema",
        "False",
        "an owner refuses spans of one flow with other columns",
        OWNER_GUARDS,
    ),
    Mutant(
        "verification-owners-disagree-on-columns",
        VERIFICATION,
        "schemas.setdefault(flow, schema) != schema",
        "False",
        "owners disagreeing on a flow's columns refuse the snapshot (the restore falls back; the first epoch "
        "does not crash)",
        OWNER_GUARDS,
    ),
    Mutant(
        "verification-caches-under-base-sha",
        VERIFICATION,
        "cache.put(ref.chain_digest(), table, key_groups)",
        "cache.put(ref.sha256, table, key_groups)",
        "the verification caches a span under its chain's digest, where the first epoch's owners look",
        ("tests/unit/test_commit_protocol_restore.py",),
    ),
    Mutant(
        "verification-all-spans-on-one-owner",
        VERIFICATION,
        "zip(refs, of_file.tolist())",
        "zip(refs, [0] * len(refs))",
        "each owner verifies and caches the spans it will own at the restoring run's parallelism",
        OWNER_GUARDS,
    ),
    Mutant(
        "span-delta-columns-unchecked",
        RESTORE,
        "decoded and file_table.schema != decoded[0][0].schema",
        "False",
        "a delta with other columns than its span's base refuses the snapshot",
        OWNER_GUARDS,
    ),
    Mutant(
        "restore-ignores-column-mismatch",
        RESTORE,
        "flow.schema is not None and file_table.schema != flow.schema",
        "False",
        "the driver's restore refuses spans of one flow with other columns",
        OWNER_GUARDS,
    ),
    # -- restore planning (plan --restore) ---------------------------------------------------
    Mutant(
        "plan-restore-id-ignores-head-sha",
        RESTORE_PLAN,
        "snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)",
        "snapshots.load_manifest(entry.snapshot_id, None)",
        "plan --restore ID checks the manifest against HEAD's SHA-256 as run does",
        PLANNING_GUARDS,
    ),
    Mutant(
        "plan-latest-ignores-head-sha",
        RESTORE_PLAN,
        "snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)",
        "snapshots.load_manifest(entry.snapshot_id, None)",
        "plan --restore latest passes over a manifest that fails HEAD's SHA-256, as run does",
        PLANNING_GUARDS,
    ),
    Mutant(
        "plan-restore-id-any-pipeline",
        RESTORE_PLAN,
        'which not in ("latest", "none") and len(only or names) != 1',
        "False",
        "plan --restore ID names one pipeline's snapshot, as run requires",
        CLI_TESTS,
    ),
    Mutant(
        "plan-skips-parallelism-check",
        CLI_PLAN,
        "job.effective_parallelism(parallelism)",
        "parallelism or job.parallelism",
        "plan refuses a --parallelism that run refuses",
        CLI_TESTS,
    ),
    # -- epoch planning ----------------------------------------------------------------------
    Mutant(
        "split-piece-past-range-end",
        OFFSETS,
        "min(r.end, start + piece)",
        "min(r.end + 1, start + piece)",
        "a range cut for Spark's tasks ends where the range ends (one offset past: a duplicate, or a read "
        "stalled at the log's end)",
        PLANNING_GUARDS,
    ),
    # -- repair planning ---------------------------------------------------------------------
    Mutant(
        "repair-ignores-topic-id",
        REPAIR_PLAN,
        "plan.topic_id is not None and log.topic_id is not None and plan.topic_id != log.topic_id",
        "False",
        "a repair of an epoch whose topic was deleted and created again is refused when planned",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-replay-chain-unchecked",
        REPAIR_PLAN,
        "positions is not None and {p: o for p, o in plan.positions.items() if p in positions} != {p: o "
        "for p, o in positions.items() if p in plan.positions}",
        "False",
        "each replayed plan starts where the state before it ends (else a wasted rebuild, then a refusal)",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-epoch-start-unchecked",
        REPAIR_PLAN,
        "positions is not None and {p: o for p, o in repair.plan.positions.items() if p in positions} != "
        "{p: o for p, o in positions.items() if p in repair.plan.positions}",
        "False",
        "the repaired epoch's plan starts where the rebuilt state ends",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-replay-digest-unchecked",
        REPAIR_PLAN,
        "not any(sink_digest(plan, self.fingerprint, p, self.kinds[name]) == marker.digest for p in "
        "range(1, self.job.checkpoint.max_parallelism + 1))",
        "False",
        "a replayed plan is the one its marker committed (its digest at some parallelism)",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-ignores-head-sha",
        REPAIR_PLAN,
        "self.snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)",
        "self.snapshots.load_manifest(entry.snapshot_id, None)",
        "repair starts from a snapshot only if its manifest matches HEAD's SHA-256",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-skips-state-check",
        REPAIR_PLAN,
        "read_spans(self.snapshots, flow.state.files, len(flow.state.key_columns))",
        "pass",
        "repair starts from a snapshot only if its state reads back checked",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-odd-part-name-accepted",
        REPAIR_PLAN,
        "odd",
        "False",
        "a lost part whose name has no known layout is refused",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-missing-plan-accepted",
        REPAIR_PLAN,
        "plan is None",
        "False",
        "an epoch whose plan is no longer saved is refused",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-digest-mismatch-accepted",
        REPAIR_PLAN,
        "repair.parallelism is None",
        "False",
        "an epoch whose marker records another input, spec or parallelism is refused",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-keyed-flow-without-state",
        REPAIR_PLAN,
        "any(p.sink in self.stateful for p in repair.parts)",
        "False",
        "a keyed flow's epoch is rebuilt on the state before it",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-starts-from-its-own-snapshot",
        REPAIR_PLAN,
        "e.epoch < epoch",
        "e.epoch <= epoch",
        "repair starts from a snapshot before the epoch, never the epoch's own (its state after the epoch)",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-from-empty-state-after-epoch-1",
        REPAIR_PLAN,
        "manifest is None and epoch > 1",
        "False",
        "without a usable earlier snapshot an epoch past the first is refused, not rebuilt from an empty state",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-replay-input-unchecked",
        REPAIR_PLAN,
        "[*repair.replay, plan]",
        "[plan]",
        "the replayed epochs' input must still be in Kafka",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-ignores-retention",
        REPAIR_PLAN,
        "r.size and (start is None or start > r.start)",
        "False",
        "an epoch whose input retention deleted is refused",
        REPAIR_TESTS,
    ),
    # -- repair's write-back and rebuild -----------------------------------------------------
    Mutant(
        "repair-writes-back-differing-part",
        REPAIR,
        "len(data) != ref.bytes or sha256_hex(data) != ref.sha256",
        "False",
        "a rebuilt part is written back only with the recorded size and SHA-256",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-ignores-changed-marker",
        REPAIR,
        "marker_now != repair.markers[part.sink]",
        "False",
        "a part is written back only under the marker repair planned from",
        REPAIR_TESTS,
    ),
    Mutant(
        "repair-rewrites-intact-part",
        REPAIR,
        "check_part(store, ref) is None",
        "False",
        "a part intact again (rewritten meanwhile) is left alone",
        PLANNING_GUARDS,
    ),
    Mutant(
        "repair-cluster-without-scratch",
        REPAIR,
        'scratch is None and master and not master.startswith("local")',
        "False",
        "repair on a cluster needs a shared scratch location, refused before Spark starts",
        PLANNING_GUARDS,
    ),
    Mutant(
        "rebuilder-continues-other-parallelism",
        REPAIR,
        "repair.pipeline != self.pipeline.name or repair.parallelism != self.parallelism",
        "repair.pipeline != self.pipeline.name",
        "a rebuilder goes on only at the parallelism of the epoch it rebuilds",
        PLANNING_GUARDS,
    ),
    Mutant(
        "rebuilder-continues-any-epoch",
        REPAIR,
        "not repair.needs_state or self.at_epoch == repair.epoch - 1",
        "True",
        "a rebuilder goes on only from the state of the epoch before",
        PLANNING_GUARDS,
    ),
    # -- the Kafka read path: batches, ranges, records --------------------------------------------
    Mutant(
        "kafka-length-varint-unbounded",
        KAFKA_BATCHES,
        "np.flatnonzero((lengths < lowest) | (lengths > left))",
        "np.flatnonzero(lengths < lowest)",
        "a record's key, value and header lengths are -1 or within its bytes left, before any sum",
        BATCH_TESTS,
    ),
    Mutant(
        "kafka-trailing-bytes-accepted",
        KAFKA_BATCHES,
        "pos != size",
        "pos > size",
        "bytes after a batch's last record (a count lower than the records it holds) make it corrupt",
        BATCH_TESTS,
    ),
    Mutant(
        "kafka-offsets-may-repeat",
        KAFKA_BATCHES,
        "np.diff(offset_delta) <= 0",
        "np.diff(offset_delta) < 0",
        "offsets rise strictly within a batch: no record is read in two ranges",
        BATCH_TESTS,
    ),
    Mutant(
        "kafka-range-end-inclusive",
        KAFKA_BATCHES,
        "[start, end]",
        "[start, end + 1]",
        "a range's end offset is exclusive: the record there belongs to the next range only",
        BATCH_TESTS,
    ),
    Mutant(
        "kafka-compacted-tail-unskipped",
        BATCH_CONSUMER,
        "self.next_fetch_offset = last_batch.next_offset",
        "pass",
        "a batch whose tail compaction removed ends at its header's last offset: the range finishes",
        RANGE_TESTS,
    ),
    Mutant(
        "timestamp-range-unchecked",
        RECORD_DECODING,
        "parsed.astimezone(dt.UTC)",
        "pass",
        "an ISO timestamp outside 0001..9999 once in UTC is a bad record naming its field",
        DECODING_TESTS,
    ),
    Mutant(
        "epoch-seconds-unbounded",
        RECORD_DECODING,
        "if not MIN_EPOCH_SECONDS <= v < MAX_EPOCH_SECONDS:\n"
        '    raise ValueError(f"epoch seconds {v!r:.40} out of range ({TIMESTAMP_RANGE})")\n'
        "try:\n"
        "    return dt.datetime.fromtimestamp(v, tz=dt.UTC)\n"
        "except (OverflowError, OSError, ValueError):  # rounds past 9999-12-31T23:59:59.999999\n"
        '    raise ValueError(f"epoch seconds {v!r:.40} out of range ({TIMESTAMP_RANGE})") from None',
        "try:\n"
        "    return dt.datetime.fromtimestamp(v, tz=dt.UTC)\n"
        "except ValueError:  # rounds past 9999-12-31T23:59:59.999999\n"
        '    raise ValueError(f"epoch seconds {v!r:.40} out of range ({TIMESTAMP_RANGE})") from None',
        "epoch seconds outside 0001..9999 are a bad record naming its field, not fromtimestamp's OSError",
        DECODING_TESTS,
    ),
    Mutant(
        "batcher-unconvertible-fails-read",
        RECORD_BATCHER,
        "try:\n    return self._arrays(rows)\nexcept Exception:  # find the records at fault, one by one\n    pass",
        "return self._arrays(rows)",
        "a value PySpark's converter or Arrow refuses is a bad record naming its field, not a failed read",
        DECODING_TESTS,
    ),
    Mutant(
        "error-row-null-in-not-null-field",
        RECORD_BATCHER,
        "error_row(schema.fields[:self.width])",
        "(None,) * self.width",
        "a bad record with a NOT NULL field is an error row, not a failed batch",
        BAD_RECORDS,
    ),
    Mutant(
        "error-row-struct-without-zeros",
        ERROR_ROWS,
        "error_row(data_type.fields)",
        "None",
        "a NOT NULL struct field of an error row holds its own NOT NULL fields' zeros",
        BAD_RECORDS,
    ),
    Mutant(
        "record-timestamp-range-unchecked",
        RECORD_BATCHER,
        "not MIN_TIMESTAMP_MS <= stamp < MAX_TIMESTAMP_MS",
        "False",
        "a record timestamp outside 0001..9999 is a bad record naming topic, partition and offset",
        BAD_RECORDS,
    ),
    Mutant(
        "record-timestamp-fast-path-unchecked",
        RECORD_BATCHER,
        "not (sizes > limit).any() and batch_errors is None and stamps_held",
        "not (sizes > limit).any() and batch_errors is None",
        "a poll with an out-of-range timestamp is read record by record, never in one unchecked pass",
        BAD_RECORDS,
    ),
    Mutant(
        "record-timestamp-unheld-shown",
        RECORD_BATCHER,
        "~held",
        "stamps < 0",
        "_timestamp is null for a timestamp Spark cannot hold, never a wrong time",
        BAD_RECORDS,
    ),
    Mutant(
        "kafka-python-version-unchecked",
        KAFKA_VERSION,
        "installed in TESTED_VERSIONS",
        "True",
        "an untested kafka-python release fails at import, naming installed and supported releases",
        ADAPTER,
    ),
    Mutant(
        "run-watch-fence-unseen",
        RUN_WATCH,
        "pipeline in attempts",
        "False",
        "a deferred run whose pipeline a newer attempt took over ends the task red, fenced, never waits forever",
        STREAMING,
    ),
    Mutant(
        "run-watch-lease-ignored",
        RUN_WATCH,
        "status.observed(now)",
        "(status.state, status.reason)",
        "a deferred run whose heartbeat lease ran out ends the task red (LOST), never waits forever",
        STREAMING,
    ),
    Mutant(
        "epoch-batch-reannounced",
        EPOCH_EVENTS,
        "e.snapshot_id not in seen",
        "True",
        "an asset watcher announces each committed epoch once, never again at its next poll",
        STREAMING,
    ),
    Mutant(
        "watermark-late-strict",
        WATERMARK,
        "event_ms < self.value_ms",
        "event_ms <= self.value_ms",
        "a record exactly at the watermark is not late (late means strictly behind it)",
        WINDOWS,
    ),
    Mutant(
        "window-closed-at-end",
        WATERMARK,
        "window_end_ms <= self.value_ms",
        "window_end_ms < self.value_ms",
        "a window closes as soon as the watermark reaches its (exclusive) end",
        WINDOWS,
    ),
    Mutant(
        "late-window-kept",
        WINDOW_CLOSE,
        "late = watermark.closed(ends)",
        "late = np.zeros(len(ends), dtype=bool)",
        "partials of windows closed before the epoch are dropped and counted, never merged or written again",
        WINDOWS,
    ),
    Mutant(
        "closed-window-kept",
        WINDOW_CLOSE,
        "state, remap = evicted(agg, state, schema, closed)",
        "remap = np.arange(len(state))",
        "a closed window leaves the keyed state (the state holds open windows only, and no window is written twice)",
        WINDOWS,
    ),
    Mutant(
        "evicted-span-kept",
        WINDOW_CLOSE,
        "np.searchsorted(ordered, span[1]) == np.searchsorted(ordered, span[0])",
        "True",
        "the state files of a span that lost closed windows are written again without them",
        WINDOWS,
    ),
    Mutant(
        "watermark-not-stored",
        EPOCH_COMMIT,
        'manifest = manifest.model_copy(update={"watermarks": watermarks, "late_records": late}).sealed()',
        "pass",
        "each snapshot stores its windowed flows' watermark and the epoch's late records",
        WINDOWS,
    ),
    Mutant(
        "watermark-restore-reset",
        RUNNER_PARTS,
        "return Watermark.from_json(stored, start.delay_ms)",
        "return start",
        "a restore continues from the watermark its snapshot stored, not from none",
        WINDOWS,
    ),
    Mutant(
        "sessions-not-merged",
        SESSION_MERGE,
        "starts[nxt] < end",
        "False",
        "overlapping sessions of a key are one session",
        SESSIONS,
    ),
    Mutant(
        "late-session-joined",
        SESSION_MERGE,
        "not joining",
        "True",
        "a late partial session linked to a live one joins it, whatever tasks and batches the records were read in",
        SESSIONS,
    ),
    # -- the Delta sink (sink/delta_sink.py) and verify's reading of its txn -------------------
    Mutant(
        "delta-ignores-newer-attempt",
        DELTA_SINK,
        "writer is not None and writer > attempt",
        "False",
        "an attempt older than the table's #attempt txn is fenced before it stages or commits anything",
        DELTA,
    ),
    Mutant(
        "delta-commits-replayed-epoch",
        DELTA_SINK,
        "done is not None and done >= epoch",
        "False",
        "an epoch the table's txn already holds is not committed again (the replay after a crash past it)",
        DELTA,
    ),
    Mutant(
        "delta-merge-keeps-changed-keys",
        DELTA_MERGE,
        "current.filter(pc.invert(hit))",
        "current",
        "a bucket's merge drops the old row of every changed key: one current row per key",
        DELTA_MERGE_TESTS,
    ),
    Mutant(
        "delta-merge-null-keys-differ",
        DELTA_MERGE,
        "pc.is_in(current.column(column), value_set=changed.column(column).combine_chunks(), skip_nulls=False)",
        "pc.is_in(current.column(column), value_set=changed.column(column).combine_chunks(), skip_nulls=True)",
        "a null key is one key in a bucket's merge, as in keyed state: its old row is replaced",
        DELTA_MERGE_TESTS,
    ),
    Mutant(
        "delta-merge-keeps-replaced-files",
        DELTA_MERGE,
        "[list(f) for f in live]",
        "[]",
        "a bucket's new file comes with the remove actions of the files it replaces",
        DELTA_MERGE_TESTS,
    ),
    Mutant(
        "delta-merge-ignores-foreign-files",
        DELTA_MERGE,
        "bucket is None",
        "False",
        "a table file outside the bucket layout (another tool's rewrite) is refused, never left beside the merge",
        DELTA_MERGE_TESTS,
    ),
    Mutant(
        "delta-merge-ignores-table-buckets",
        DELTA_SINK,
        "int(configured) if configured else self.buckets",
        "self.buckets",
        "an upserted table is merged with the bucket count it was created with, whatever the spec says now",
        DELTA_MERGE_TESTS,
    ),
    Mutant(
        "delta-vacuum-reaches-epoch-in-flight",
        "pipeline_lib/sink/delta_maintenance.py",
        "max(retention_hours, min_hours)",
        "retention_hours",
        "a table's VACUUM keeps at least an hour of unreferenced files: the next epoch's merge files in flight",
        ("tests/unit/test_delta_upkeep.py",),
    ),
    Mutant(
        "verify-table-behind-head",
        VERIFY_TABLES,
        "have < want",
        "False",
        "verify reports a Delta table whose txn is behind the head snapshot's epoch",
        DELTA,
    ),
    Mutant(
        "verify-table-far-ahead",
        VERIFY_TABLES,
        "have > want + 1",
        "False",
        "verify reports a Delta table whose txn is more than one epoch past the head snapshot's",
        DELTA,
    ),
    # -- a process function's state (your-own-state.md) ------------------------------------------
    Mutant(
        "ttl-expires-late",
        PROCESS_STATE,
        "updated_ms(stored) + self.ttl_ms <= self.clock_ms",
        "updated_ms(stored) + self.ttl_ms < self.clock_ms",
        "a key's state leaves exactly ttl after its last update on the epoch clock, not a tick later",
        PROCESS_TESTS,
    ),
    Mutant(
        "process-rows-unordered",
        PROCESS_STATE,
        'rows = rows.sort_by([(c, "ascending") for c in ORDER_COLUMNS])',
        "rows = rows",
        "a key's rows reach the function in offset order whatever order the read tasks gave them",
        PROCESS_TESTS,
    ),
    Mutant(
        "process-state-null-loaded",
        PROCESS_STATE,
        "stored is None",
        "False",
        "a stored key without a state is refused at restore, never given to the function as empty",
        PROCESS_TESTS,
    ),
    Mutant(
        "expired-key-span-as-delta",
        DRIVER_STATE,
        "spans & dropped_spans(state, per_file, maxp)",
        "set()",
        "a span that lost a key (ttl, a cleared state) is written whole: a delta would leave the key in its base",
        PROCESS_TESTS,
    ),
    Mutant(
        "owner-expired-span-as-delta",
        PROCESS_OWNER,
        "dropped & writes.deltas.keys()",
        "set()",
        "an owner task writes a span that lost a key whole: a delta would leave the key in its base",
        PROCESS_TESTS,
    ),
    Mutant(
        "process-parts-by-subtask",
        PROCESS_MERGE,
        "out.filter(subtasks == i)",
        "out",
        "each output row of a process function goes to its key's subtask's part alone",
        PROCESS_TESTS,
    ),
    Mutant(
        "timer-fires-early",
        PROCESS_TIMERS,
        "event[0] <= event_until",
        "True",
        "an event-time timer fires only once the watermark the epoch started with has reached it",
        TIMER_TESTS,
    ),
    Mutant(
        "timer-fires-late",
        PROCESS_TIMERS,
        "event[0] <= event_until",
        "event[0] < event_until",
        "an event-time timer fires in the epoch whose watermark equals its time, not an epoch later",
        TIMER_TESTS,
    ),
    Mutant(
        "timers-not-stored",
        PROCESS_HANDLE,
        "data.update(self.timers.stored())",
        "pass",
        "a key's timers are stored in its state's JSON, so a snapshot and a restore keep them",
        TIMER_TESTS,
    ),
    Mutant(
        "timers-not-indexed",
        PROCESS_STATE,
        "self.spec.on_timer is not None",
        "False",
        "every stored timer (set in a call or restored from a snapshot) is in the index that fires them",
        TIMER_TESTS,
    ),
    Mutant(
        "owner-timer-spans-skipped",
        PROCESS_OWNER,
        "process.ttl is not None or process.on_timer is not None",
        "process.ttl is not None",
        "an owner of a process state with timers loads and writes all its spans: any key may fire without rows",
        TIMER_TESTS,
    ),
    Mutant(
        "process-watermark-stuck",
        PROCESS_MERGE,
        "flow.watermark = flow.watermark.advanced(top, ended=ended)",
        "pass",
        "a process flow's watermark advances by each epoch's largest event time (and to the end with the source)",
        TIMER_TESTS,
    ),
    Mutant(
        "dedup-passes-seen-key",
        DEDUP,
        "None if seen.exists() else rows.slice(0, 1)",
        "rows.slice(0, 1)",
        "dedup drops a key seen before, in any epoch and after a restore",
        PROCESS_TESTS,
    ),
    Mutant(
        "kafka-writer-fences",
        KAFKA_WRITER,
        "producer.init_transactions()",
        "pass",
        "a Kafka sink writer fences older producers of its id, ending their open transaction, before its marker read",
        KAFKA_WRITER_TESTS,
    ),
    Mutant(
        "kafka-skip-published",
        KAFKA_WRITER,
        "published_epoch(task.kafka, tid, task.topic, partition) >= task.epoch",
        "False",
        "an epoch a Kafka sink's partition already holds is never sent again (a restore after the publish)",
        KAFKA_WRITER_TESTS,
    ),
    Mutant(
        "kafka-marker-in-transaction",
        KAFKA_WRITER,
        "producer.send_offsets_to_transaction(marker, tid)",
        "pass",
        "a Kafka sink writer's marker commits in the same transaction as the epoch's rows",
        KAFKA_WRITER_TESTS,
    ),
    Mutant(
        "sketch-state-merge",
        "pipeline_lib/execution/state/keyed_state.py",
        "sketch_merge(fn, [a, b])",
        "b",
        "a key's approx_count_distinct/approx_percentile sketch is the union of every epoch's, not the last one's",
        ("tests/unit/test_sketches.py",),
    ),
    Mutant(
        "sketch-partials-merge",
        "pipeline_lib/execution/engine/flow_partials.py",
        "merge(fn, [values[r] for r in rows])",
        "values[rows[-1]]",
        "a worker's batches' sketches of one key are merged, not the last batch's kept",
        ("tests/unit/test_sketches.py",),
    ),
    Mutant(
        "top-state-merge",
        "pipeline_lib/execution/state/keyed_state.py",
        "top_merge([a, b], int(param or 0))",
        "b",
        "a key's top(col, n) is the n largest of every epoch's values, not the last epoch's",
        ("tests/unit/test_sketches.py",),
    ),
    Mutant(
        "top-partials-merge",
        "pipeline_lib/execution/engine/flow_partials.py",
        "top_merge([values[r] for r in rows], n)",
        "values[rows[-1]]",
        "a worker's batches' top lists of one key are merged, not the last batch's kept",
        ("tests/unit/test_sketches.py",),
    ),
    # -- the Iceberg sink (sink/iceberg_sink.py) ---------------------------------------------------
    Mutant(
        "iceberg-ignores-newer-attempt",
        ICEBERG_SINK,
        "writer is not None and writer > attempt",
        "False",
        "an attempt older than the Iceberg table's attempt record is fenced before it stages or commits anything",
        ICEBERG,
    ),
    Mutant(
        "iceberg-commits-replayed-epoch",
        ICEBERG_SINK,
        "done is not None and done >= epoch",
        "False",
        "an epoch the Iceberg table's epoch record already holds is not committed again (the replay after a crash)",
        ICEBERG,
    ),
    Mutant(
        "iceberg-commit-retries",
        ICEBERG_SINK,
        'TABLE_PROPERTIES = {"commit.retry.num-retries": "0", "format-version": "2"}',
        'TABLE_PROPERTIES = {"commit.retry.num-retries": "4", "format-version": "2"}',
        "pyiceberg never rebases a lost Iceberg commit by itself: the sink reads the table again and checks its fence",
        ICEBERG,
    ),
    Mutant(
        "iceberg-created-table-unfenced",
        ICEBERG_SINK,
        'raise CommitFailedException("created by another writer") from exc',
        "return self.catalog.load_table(self.name)",
        "a table another writer created first is read again and its fence checked before this attempt commits to it",
        ICEBERG,
    ),
    Mutant(
        "kafka-staging-drops-retained",
        "pipeline_lib/sink/kafka_staging.py",
        "oldest_retained = min(history_epochs)",
        "oldest_retained = max(history_epochs)",
        "a Kafka sink's staged epoch a retained snapshot commits is kept (a restore publishes it, verify checks it)",
        ("tests/unit/test_kafka_staging.py",),
    ),
    Mutant(
        "kafka-staging-drops-unpublished",
        "pipeline_lib/sink/kafka_staging.py",
        "min(published + 1, oldest_retained)",
        "oldest_retained",
        "a Kafka sink's staged epoch a writer has not published is kept",
        ("tests/unit/test_kafka_staging.py",),
    ),
    Mutant(
        "kafka-staging-keeps-marker",
        "pipeline_lib/sink/kafka_staging.py",
        "sink.store.delete(marker)",
        "pass",
        "a deleted staged epoch loses its marker too (no marker left listing deleted parts)",
        ("tests/unit/test_kafka_staging.py",),
    ),
    Mutant(
        "kafka-tombstone-sent-as-value",
        KAFKA_WRITER,
        "row[tombstone] is True",
        "False",
        "a row whose sink.kafka.tombstone column is true is sent as its key with a null value",
        KAFKA_WRITER_TESTS,
    ),
    # Autoscaling (docs/autoscaling.md): a change applies with nothing in flight, every epoch's
    # manifest records the parallelism it ran at, a restore resumes with it; the decision's bounds.
    Mutant(
        "autoscale-read-ahead-straddles-change",
        "pipeline_lib/execution/runtime/autoscaler.py",
        "self.pending is not None",
        "False",
        "no epoch's read starts ahead of a pending parallelism change (every epoch runs at one parallelism)",
        ("tests/unit/test_autoscale_runner.py",),
    ),
    Mutant(
        "autoscale-manifest-records-parallelism",
        "pipeline_lib/execution/runtime/runner_epoch.py",
        "parts.parallelism",
        "None",
        "an epoch's manifest records the parallelism it ran at (a restore after a scale resumes with it)",
        ("tests/unit/test_autoscale_runner.py",),
    ),
    Mutant(
        "autoscale-restore-spec-parallelism",
        "pipeline_lib/execution/runtime/autoscaler.py",
        "manifest.parallelism",
        "self.parts.parallelism",
        "an autoscaled pipeline's restore resumes with its snapshot's parallelism, not the spec's",
        ("tests/unit/test_autoscale_runner.py",),
    ),
    Mutant(
        "autoscale-below-min-kept",
        "pipeline_lib/plan/autoscale_decision.py",
        "current < settings.min",
        "False",
        "a parallelism below autoscale.min comes back to it",
        ("tests/unit/test_autoscale_decision.py",),
    ),
    Mutant(
        "autoscale-above-max-kept",
        "pipeline_lib/plan/autoscale_decision.py",
        "current > settings.max",
        "False",
        "a parallelism above autoscale.max comes back to it",
        ("tests/unit/test_autoscale_decision.py",),
    ),
    Mutant(
        "autoscale-no-cooldown",
        "pipeline_lib/plan/autoscale_decision.py",
        "last is not None and load.epoch - last.epoch < settings.cooldown_epochs",
        "False",
        "no change within cooldown_epochs of the last one",
        ("tests/unit/test_autoscale_decision.py",),
    ),
    Mutant(
        "autoscale-ignores-capacity",
        "pipeline_lib/plan/autoscale_decision.py",
        "min(want, capacity)",
        "want",
        "a scale-up goes no further than the cores Spark offers",
        ("tests/unit/test_autoscale_decision.py",),
    ),
    Mutant(
        "autoscale-beyond-granted-cores",
        "pipeline_lib/execution/engine/spark_capacity.py",
        "most is not None",
        "False",
        "on a cluster a scale-up goes no further than the cores granted to the live executors (not spark.cores.max)",
        ("tests/unit/test_spark_capacity.py",),
    ),
    Mutant(
        "autoscale-driver-cores",
        "pipeline_lib/execution/engine/spark_capacity.py",
        'executor_id != "driver"',
        "True",
        "the driver's cores are not counted as the cluster's: it runs no task there",
        ("tests/unit/test_spark_capacity.py",),
    ),
    Mutant(
        "autoscale-capped-unsaid",
        "pipeline_lib/plan/autoscale_decision.py",
        "granted < want",
        "False",
        "a scale-up that falls short of what the load asked for says so (its reason, autoscale_capped)",
        ("tests/unit/test_autoscale_decision.py",),
    ),
    Mutant(
        "plan-digest-ignores-tables",
        OFFSETS,
        '({"tables"} if self.tables else set())',
        "set()",
        "the plan digest covers the joined tables' pinned versions: a sink epoch of another version is not reused",
        tests=("tests/unit/test_table_pins.py",),
    ),
    Mutant(
        "plan-pins-no-tables",
        RUNNER_PLANNING,
        "pin_tables(self.joins, self.parts.settings, self.pinned, where)",
        "{}",
        "each new plan pins the version of every table its flows join",
        tests=("tests/unit/test_table_pins.py",),
    ),
    Mutant(
        "replayed-plan-repinned",
        RUNNER_PLANNING,
        "location not in plan.tables",
        "True",
        "a replayed plan keeps the table versions it pinned: a replay or repair joins the rows the first run joined",
        tests=("tests/unit/test_table_pins.py",),
    ),
    Mutant(
        "join-reads-unpinned-version",
        "pipeline_lib/execution/engine/table_join.py",
        "got is None or len(data) != file.size or (file.version is not None and version != file.version)",
        "got is None",
        "a pinned file that changed since its plan is refused, never joined",
        tests=("tests/unit/test_table_pins.py",),
    ),
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
]
