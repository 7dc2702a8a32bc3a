"""Rebuild lost or damaged sink parts of committed epochs, byte for byte, and put them back.

For each epoch ``repair_plan`` found rebuildable, a rebuilder that commits nothing loads the state
of the snapshot the plan names (or none, before epoch 1), replays the plans after it, and runs the
epoch's saved plan once more on Spark with the same code as a run. Parts the read tasks write go
to a scratch location, parts the driver (or owner tasks) would write stay in memory. A regenerated
part is written back, with one put of the whole object through the sink's own store, only when
its size and SHA-256 equal those the epoch's ``_SUCCESS`` recorded and the marker is still the one
read when planning; anything else is refused, naming why. Markers, manifests, plans, state and
HEAD are never written. A live run of the pipeline never writes a part a committed marker lists
(part names carry the attempt that wrote them), so the two do not interfere: if a run rewrites a
damaged epoch itself meanwhile, its marker changes, and repair leaves that epoch alone.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.epoch_commit import plan_ends
from pipeline_lib.checkpoint.manifest import sha256_hex
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, read_spans
from pipeline_lib.errors import NotFound, PipelineError, SnapshotError
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.runtime.epoch_path import Writers
from pipeline_lib.execution.runtime.late_routing import dead_letter_files, session_letters_written, with_session_letters
from pipeline_lib.execution.runtime.path_choice import choose_path
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_epoch import EpochReader
from pipeline_lib.execution.runtime.runner_parts import PipelineParts, restored_watermark
from pipeline_lib.execution.runtime.runner_types import FlowRuntime, RunOptions
from pipeline_lib.execution.source.two_topic_source import pipeline_schema, second_topic_join
from pipeline_lib.execution.state.owner_task import OWNER_LABEL
from pipeline_lib.execution.state.span_owners import SpanOwners, key_groups_of_rows
from pipeline_lib.graph import build_graph
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.recovery.findings import check_part
from pipeline_lib.recovery.repair_plan import EpochRepair
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import MARKER, encode_part
from pipeline_lib.sink.part_layout import key_order, part_slot
from pipeline_lib.sink.task_parts import ROWS_PER_PART, TaskPartWriter
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import Location, open_store, parse_location

log = logging.getLogger(__name__)
RESTORED, WOULD_RESTORE, REFUSED, UNCHANGED = "restored", "rebuildable", "REFUSED", "unchanged"
Slot = tuple[str, int, int]


@dataclass(frozen=True)
class PartOutcome:
    """What repair did, or would do, with one lost or damaged part."""

    pipeline: str
    epoch: int
    what: str  # "flow <name>" or "dead letters"
    part: str
    status: str  # restored | rebuildable (--dry-run) | REFUSED | unchanged
    detail: str

    def to_dict(self) -> dict:
        """For ``--json``."""
        return asdict(self)


def _what(sink: str) -> str:
    return "dead letters" if sink == DEAD_LETTERS else f"flow {sink}"


def dry_run(repairs: list[EpochRepair]) -> list[PartOutcome]:
    """What ``repair`` would do, from the planning alone: nothing is read from Kafka or written."""
    return [
        PartOutcome(
            r.pipeline,
            r.epoch,
            _what(p.sink),
            p.ref.key,
            WOULD_RESTORE if r.rebuildable else REFUSED,
            f"{p.problem} ({p.detail}); {r.describe()}",
        )
        for r in repairs
        for p in r.parts
    ]


def repair(
    job: JobSpec, settings: ConnectionSettings, repairs: list[EpochRepair], scratch: str | None = None
) -> list[PartOutcome]:
    """Rebuild every rebuildable epoch of ``repairs`` and write back the parts that come out
    identical; one outcome per damaged part. ``scratch``: where read tasks write regenerated
    parts (default: a temporary local directory, which needs Spark in local mode)."""
    outcomes = [o for r in repairs if not r.rebuildable for o in dry_run([r])]
    todo = [r for r in repairs if r.rebuildable]
    if not todo:
        return outcomes
    from pipeline_lib.execution.engine.spark_session import start_spark, stop_spark

    master = settings.spark_master
    if scratch is None and master and not master.startswith("local"):  # guard: repair-cluster-without-scratch
        raise PipelineError(
            "repair on a Spark cluster needs --scratch s3://BUCKET/PATH: the executors write "
            "regenerated parts there, and a local directory is not shared"
        )
    parallelism = max(r.parallelism or 1 for r in todo)
    pipelines = {p.name: p for p in build_graph(job).pipelines()}
    with _scratch(scratch, settings) as location:
        spark = start_spark(f"pipeline-lib-repair:{job.name}", master, parallelism, job.spark)
        try:
            rebuilder: _Rebuilder | None = None
            for r in todo:
                assert r.plan is not None and r.parallelism is not None
                try:
                    if rebuilder is None or not rebuilder.continues(r):
                        rebuilder = None
                        rebuilder = _Rebuilder(job, pipelines[r.pipeline], settings, r.parallelism, location, spark)
                        rebuilder.start(r)
                    regenerated = rebuilder.rebuild(r)
                except (SnapshotError, NotFound) as exc:  # e.g. a snapshot garbage-collected since planning
                    r.refused, rebuilder = f"its state could not be rebuilt: {exc}", None
                    outcomes.extend(dry_run([r]))
                    continue
                outcomes.extend(_write_back(r, regenerated))
        finally:
            stop_spark(spark)
    return sorted(outcomes, key=lambda o: (o.pipeline, o.epoch, o.what, o.part))


@contextmanager
def _scratch(scratch: str | None, settings: ConnectionSettings) -> Iterator[str]:
    """A fresh folder for this repair's regenerated parts (under ``scratch``, or a temporary
    directory), deleted afterwards; nothing else under ``scratch`` is touched."""
    made = tempfile.mkdtemp(prefix="pipeline-lib-repair-") if scratch is None else None
    location = f"file://{made}" if made else str(parse_location(str(scratch)).child(f"repair-{uuid.uuid4().hex}"))
    store = open_store(location, settings)
    try:
        yield location
    finally:
        if location.startswith("file://"):
            shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
        else:
            store.delete_many(list(store.list()))


class ScratchPartWriters:
    """The rebuilder's part writers: read tasks write the rebuilt epoch's parts to the scratch
    location, and only while ``writing`` (the epoch being rebuilt); replays write nothing."""

    def __init__(self, parts: PipelineParts, scratch: Location):
        self.parts, self.scratch = parts, scratch
        self.writing = False

    def of(self, sink: str) -> Location:
        """Where read tasks write the regenerated parts of ``sink`` (a flow's name or DEAD_LETTERS)."""
        if sink == DEAD_LETTERS:
            return self.scratch.child("dead-letters")
        return self.scratch.child(f"flow-{[f.spec.name for f in self.parts.flows].index(sink)}")

    def for_epoch(self, epoch: int) -> Writers:
        """Scratch writers of ``epoch``'s parts while writing, else none (attempt 0: repair claims none)."""
        flows = self.parts.flows
        if not self.writing:
            return Writers([None] * len(flows), None)
        settings = self.parts.settings
        writers: list[TaskPartWriter | None] = [
            None
            if flow.stateful
            else TaskPartWriter(str(self.of(flow.spec.name)), settings, flow.sink.format, epoch, 0, "r")
            for flow in flows
        ]
        dead = (
            TaskPartWriter(str(self.of(DEAD_LETTERS)), settings, "jsonl", epoch, 0, "d")
            if self.parts.dead_letters is not None
            else None
        )
        return Writers(writers, dead)


class _Rebuilder:
    """A pipeline's epoch reads and merges that commit nothing and claim no attempt: it loads a
    snapshot's state, replays plans into it, and regenerates an epoch's parts, with keyed state on
    the driver whatever the spec says; read tasks write through ``ScratchPartWriters``."""

    def __init__(self, job: JobSpec, pipeline, settings: ConnectionSettings, parallelism: int, scratch: str, spark):
        self.parts = parts = PipelineParts.from_spec(job, pipeline, settings, RunOptions(parallelism=parallelism))
        self.pipeline, self.flows, self.parallelism, self.spark = pipeline, parts.flows, parallelism, spark
        self.writers = ScratchPartWriters(parts, parse_location(scratch))
        self.at_epoch: int | None = None  # the state holds the output of epochs up to this one
        attempt = RunAttempt(job.name, pipeline.name)
        # the rows the flows read: with a stream join's own topic, both topics' (as a run reads them)
        self.schema = pipeline_schema(
            spark, parts.source, second_topic_join(f.spec for f in parts.flows), parts.tolerant
        )
        path = choose_path(parts, attempt, spark, self.schema, stored_groups_apply=True, owners_allowed=False)
        self.reader = EpochReader(parts, path, self.writers, attempt)
        self.state = path.state

    def continues(self, repair: EpochRepair) -> bool:
        """True when this rebuilder's state is the one ``repair``'s epoch builds on (or it needs none)."""
        # guard: rebuilder-continues-other-parallelism
        if repair.pipeline != self.pipeline.name or repair.parallelism != self.parallelism:
            return False
        return not repair.needs_state or self.at_epoch == repair.epoch - 1  # guard: rebuilder-continues-any-epoch

    def start(self, repair: EpochRepair) -> None:
        """Load the state ``repair`` starts from, then replay the plans after it."""
        if repair.needs_state and repair.start_from is not None:
            manifest = self.parts.snapshots.load_manifest(repair.start_from)
            for flow in self.flows:
                flow.watermark = restored_watermark(self.parts.job, flow.spec, manifest)
                commit = manifest.flows.get(flow.spec.name)
                if flow.state is None or commit is None or commit.state is None or not commit.state.files:
                    continue
                decoded, _ = read_spans(self.parts.snapshots, commit.state.files, len(commit.state.key_columns))
                same_groups = commit.state.max_parallelism == self.parts.maxp
                flow.state.load(
                    pa.concat_tables([t for t, _ in decoded]),
                    np.concatenate([g for _, g in decoded]) if same_groups else None,
                )
                flow.state_schema = decoded[0][0].schema
        for plan in repair.replay:
            log.info("repair of pipeline %s epoch %d: replaying epoch %d", self.pipeline.name, repair.epoch, plan.epoch)
            self._merge(plan)
        self.at_epoch = repair.epoch - 1 if repair.needs_state else None  # None: the state means nothing

    def _merge(self, plan: EpochPlan) -> dict[str, tuple[list[pa.Table], int, tuple]]:
        """Read ``plan`` on Spark and merge it into the state; per flow its driver parts, the
        keys of its state before the epoch, and the references of parts its tasks wrote."""
        read = self.reader.read(self.spark, self.schema, plan)
        merged = {}
        ended = plan_ends(plan)  # both topics' ends when it reads two
        for flow in self.flows:
            keys_before = flow.keys()
            parts, _, written = self.state.merge(flow, read.flows[flow.spec.name], ended)
            merged[flow.spec.name] = (parts, keys_before, tuple(written))
        if read.bad is not None:
            session = session_letters_written(self.writers.for_epoch(plan.epoch), self.flows)
            late = with_session_letters(read.late, session)
            merged[DEAD_LETTERS] = ([], 0, dead_letter_files(read.bad, late))  # late records' too
        return merged

    def rebuild(self, repair: EpochRepair) -> dict[str, dict[Slot, bytes]]:
        """The epoch's regenerated parts of each damaged sink, by their place in its layout."""
        assert repair.plan is not None
        self.writers.writing = True
        try:
            merged = self._merge(repair.plan)
        finally:
            self.writers.writing = False
        self.at_epoch = repair.epoch if self.at_epoch == repair.epoch - 1 else None
        flows = {f.spec.name: f for f in self.flows}
        wanted = {p.sink for p in repair.parts}
        out: dict[str, dict[Slot, bytes]] = {}
        for name in wanted:
            parts, keys_before, written = merged.get(name, ([], 0, ()))
            slots: dict[Slot, bytes] = {}
            where = open_store(str(self.writers.of(name)), self.parts.settings) if written else None
            for ref in written:
                slot = part_slot(ref.key)
                if slot is not None and where is not None:
                    slots[slot] = where.get(ref.key)
            if name in flows and flows[name].stateful:
                fmt = flows[name].sink.format
                slots.update({("", i, 0): encode_part(t, fmt) for i, t in enumerate(parts) if t.num_rows})
                if any((part_slot(p.ref.key) or ("",))[0] == OWNER_LABEL for p in repair.parts if p.sink == name):
                    slots.update(self._owner_parts(flows[name], parts, keys_before or repair.plan.records))
            out[name] = slots
        return out

    def _owner_parts(self, flow: FlowRuntime, parts: list[pa.Table], keys_before: int) -> dict[Slot, bytes]:
        """The epoch's parts as owner tasks cut them, spans sized to the state before the epoch."""
        assert flow.spec.state is not None
        if flow.spec.state.process is not None:
            raise PipelineError(
                f"flow {flow.spec.name}: parts a process function's owner tasks wrote cannot be rebuilt yet "
                "(its parts written on the driver can); run the pipeline again from an earlier snapshot instead"
            )
        owners = SpanOwners(self.parallelism, self.parts.maxp, self.parts.key_groups_per_file(keys_before))
        changed = [t for t in parts if t.num_rows]
        if not changed:
            return {}
        agg = flow.spec.state.aggregate
        keys = agg.state_key()  # a windowed flow's order takes its bounds too, and its key groups but a session's
        hashed = list(FlowInWorker.of(agg).hashed)
        return owner_parts(pa.concat_tables(changed), keys, flow.sink.format, owners, hashed)


def owner_parts(
    changed: pa.Table, key_columns: list[str], fmt: str, owners: SpanOwners, hashed: list[str] | None = None
) -> dict[Slot, bytes]:
    """An epoch's sink parts as its owner tasks write them, from the rows of every key it
    changed (in any order): each owner's keys (its whole spans of key groups) in key order, a
    part every ROWS_PER_PART rows (see execution.state.owner_task and sink.part_layout).
    ``hashed``: the columns of the key groups when not all ``key_columns`` (a session's grouping key)."""
    groups = key_groups_of_rows(changed, hashed or key_columns, owners.max_parallelism)  # guard: repair-session-groups
    of_row = owners.owner_of(groups)
    slots: dict[Slot, bytes] = {}
    for owner in np.unique(of_row).tolist():
        rows = key_order(changed.filter(pa.array(of_row == owner)), key_columns)
        for sequence, start in enumerate(range(0, rows.num_rows, ROWS_PER_PART)):
            slots[(OWNER_LABEL, owner, sequence)] = encode_part(rows.slice(start, ROWS_PER_PART), fmt)
    return slots


def _write_back(repair: EpochRepair, regenerated: dict[str, dict[Slot, bytes]]) -> list[PartOutcome]:
    """Put back each damaged part whose regenerated bytes are the recorded ones, while the
    epoch's marker is still the one planned from and the part still damaged."""
    outcomes = []
    for part in repair.parts:
        ref, what = part.ref, _what(part.sink)
        slot = part_slot(ref.key)
        data = regenerated.get(part.sink, {}).get(slot) if slot is not None else None

        def outcome(status: str, detail: str, part=part, what=what) -> PartOutcome:
            return PartOutcome(repair.pipeline, repair.epoch, what, part.ref.key, status, detail)

        if data is None:
            outcomes.append(
                outcome(REFUSED, f"{part.problem}; the rebuilt epoch has no part in its place: not written")
            )
            continue
        if len(data) != ref.bytes or sha256_hex(data) != ref.sha256:  # guard: repair-writes-back-differing-part
            outcomes.append(
                outcome(
                    REFUSED,
                    (
                        f"{part.problem}; the rebuilt part ({len(data)} bytes) differs from the one its {MARKER} "
                        f"recorded ({ref.bytes} bytes, SHA-256 {ref.sha256[:12]}…): not written (a floating-point sum "
                        "whose order varies, or other library versions than those that wrote it)"
                    ),
                )
            )
            continue
        store = repair.stores[part.sink]
        try:
            marker_now = store.get(f"epoch={repair.epoch}/{MARKER}")
        except NotFound:
            marker_now = None
        if marker_now != repair.markers[part.sink]:  # guard: repair-ignores-changed-marker
            outcomes.append(
                outcome(
                    UNCHANGED,
                    f"{part.problem}; the epoch's {MARKER} changed since repair read it "
                    "(a run rewrote the epoch): left alone",
                )
            )
            continue
        if check_part(store, ref) is None:  # guard: repair-rewrites-intact-part
            outcomes.append(outcome(UNCHANGED, "intact again (rewritten meanwhile): left alone"))
            continue
        store.put(ref.key, data)
        restored = check_part(store, ref)
        outcomes.append(
            outcome(RESTORED, f"was {part.problem}; rebuilt {ref.rows} row(s), {ref.bytes} bytes, SHA-256 as recorded")
            if restored is None
            else outcome(REFUSED, f"written back, but reads back {restored[0]}: {restored[1]}")
        )
    return outcomes
