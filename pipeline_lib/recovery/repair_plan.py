"""Which lost or damaged sink parts of committed epochs can be rebuilt, from what, and why not.

A committed epoch's output is a function of its saved plan, the spec, the parallelism and the
state before it (sink.part_layout): its marker's digest (``sink_digest``) records the first three.
So a part can be rebuilt when the epoch's plan is still saved and gives the marker's digest under
the current spec at some parallelism, its input is still in Kafka, and, for a stateful flow, the
state before the epoch can be rebuilt: from the nearest earlier retained snapshot, by replaying the
saved plans after it (each checked against its own markers), or from nothing before epoch 1.
Planning reads the stores and the topic's log starts and changes nothing; ``repair`` acts on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline_lib.checkpoint.manifest import FileRef, HistoryEntry, Manifest
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, candidates, read_spans
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import NotFound, PipelineError, SnapshotError
from pipeline_lib.execution.runtime.late_routing import late_letter_part
from pipeline_lib.execution.runtime.runner_types import sink_digest, spec_fingerprint
from pipeline_lib.graph import Pipeline, build_graph
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.recovery.verify import check_part, pipeline_sinks
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import MARKER, SuccessMarker
from pipeline_lib.sink.part_layout import part_slot
from pipeline_lib.sink.table_reader import committed_epochs
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import ObjectStore


@dataclass(frozen=True)
class TopicLog:
    """A topic as the broker has it now: each partition's first offset still in the log, and its id."""

    starts: dict[int, int]
    topic_id: str | None = None


@dataclass(frozen=True)
class DamagedPart:
    """A part a committed marker lists that is missing or differs from its recorded size or SHA-256."""

    sink: str  # the flow's name, or DEAD_LETTERS
    ref: FileRef
    problem: str  # LOST or DAMAGED
    detail: str


@dataclass
class EpochRepair:
    """One committed epoch with damaged parts: what rebuilds it, or why it cannot be rebuilt."""

    pipeline: str
    epoch: int
    parts: list[DamagedPart]
    markers: dict[str, bytes] = field(default_factory=dict)  # each damaged sink's marker, as read
    stores: dict[str, ObjectStore] = field(default_factory=dict, repr=False)  # each damaged sink's store
    plan: EpochPlan | None = None
    parallelism: int | None = None
    needs_state: bool = False
    start_from: str | None = None  # the snapshot whose state is loaded (None: empty, before epoch 1)
    replay: list[EpochPlan] = field(default_factory=list)  # plans replayed between it and the epoch
    refused: str | None = None

    @property
    def rebuildable(self) -> bool:
        """True when nothing found stands in the way of rebuilding the epoch's damaged parts."""
        return self.refused is None

    def describe(self) -> str:
        """How the epoch is rebuilt, or why not, in one line."""
        if self.refused:
            return f"cannot be rebuilt: {self.refused}"
        if not self.needs_state:
            return "rebuilt from its input alone"
        base = f"snapshot {self.start_from}" if self.start_from else "an empty state (before epoch 1)"
        replay = f", replaying epoch(s) {[p.epoch for p in self.replay]}" if self.replay else ""
        return f"rebuilt from {base}{replay}"


def parse_epochs(text: str | None) -> tuple[int, int | None]:
    """``--epochs``: ``N..M``, ``N..``, ``..M`` or ``N`` as (first, last or None)."""
    if not text:
        return 1, None
    first, sep, last = text.partition("..")
    try:
        lo = int(first) if first else 1
        hi = (int(last) if last else None) if sep else lo
    except ValueError:
        raise PipelineError(f"--epochs {text!r}: expected N..M, N.., ..M or N (epoch numbers)") from None
    if lo < 1 or (hi is not None and hi < lo):
        raise PipelineError(f"--epochs {text!r}: epochs start at 1 and the range must not be empty")
    return lo, hi


def plan_repairs(
    job: JobSpec,
    settings: ConnectionSettings,
    logs: Callable[[str], TopicLog],
    epochs: tuple[int, int | None] = (1, None),
    only: list[str] | None = None,
) -> list[EpochRepair]:
    """Every committed epoch in ``epochs`` with a lost or damaged part, per pipeline (``only``:
    these), each with how it is rebuilt or why it cannot be. ``logs`` gives a topic's log now."""
    pipelines = build_graph(job).pipelines()
    unknown = sorted(set(only or []) - {p.name for p in pipelines})
    if unknown:
        raise PipelineError(f"job {job.name} has no pipeline {unknown} (it has {[p.name for p in pipelines]})")
    repairs: list[EpochRepair] = []
    for pipeline in pipelines:
        if only and pipeline.name not in only:
            continue
        sinks = pipeline_sinks(job, pipeline, settings)
        damaged = _damaged_epochs(pipeline.name, sinks, epochs)
        if not damaged:
            continue
        planner = _Planner(
            job, pipeline, sinks, SnapshotStore.open(job.checkpoint.store, job.name, pipeline.name, settings)
        )
        for repair in damaged:
            planner.plan(repair, logs)
        repairs.extend(damaged)
    return repairs


def _damaged_epochs(pipeline: str, sinks: dict[str, ObjectStore], epochs: tuple[int, int | None]) -> list[EpochRepair]:
    """The committed epochs in range with a lost or damaged part, each part checked by its bytes."""
    lo, hi = epochs
    found: dict[int, EpochRepair] = {}
    for name, store in sinks.items():
        for epoch in committed_epochs(store):
            if epoch < lo or (hi is not None and epoch > hi):
                continue
            try:
                raw = store.get(f"epoch={epoch}/{MARKER}")
                marker = SuccessMarker.model_validate_json(raw)
            except (NotFound, ValueError):
                continue  # gone or unreadable: verify reports it; repair never writes a marker
            bad = [(ref, problem) for ref in marker.files if (problem := check_part(store, ref)) is not None]
            if bad:
                repair = found.setdefault(epoch, EpochRepair(pipeline, epoch, []))
                repair.markers[name], repair.stores[name] = raw, store
                repair.parts.extend(DamagedPart(name, ref, status, detail) for ref, (status, detail) in bad)
    return [found[e] for e in sorted(found)]


class _Planner:
    """One pipeline's planning: its stateful flows, formats, saved plans and retained snapshots."""

    def __init__(self, job: JobSpec, pipeline: Pipeline, sinks: dict[str, ObjectStore], snapshots: SnapshotStore):
        self.job, self.pipeline, self.sinks, self.snapshots = job, pipeline, sinks, snapshots
        flows = {f.name: f for f in job.all_flows() if f.name in pipeline.flows}
        self.kinds = {name: f.sink.parts_format for name, f in flows.items()} | {DEAD_LETTERS: "dead-letters"}
        self.stateful = {name for name, f in flows.items() if f.state is not None}
        self.fingerprint = spec_fingerprint(job)
        self.history: list[HistoryEntry] = candidates(snapshots, "latest")
        self._plans: dict[int, EpochPlan | None] = {}

    def _plan_of(self, epoch: int) -> EpochPlan | None:
        if epoch not in self._plans:
            self._plans[epoch] = self.snapshots.load_plan(epoch)
        return self._plans[epoch]

    def _parallelism(self, plan: EpochPlan, markers: dict[str, SuccessMarker]) -> int | None:
        """The parallelism at which ``plan`` and the current spec give every marker's digest."""
        for p in range(1, self.job.checkpoint.max_parallelism + 1):
            if all(sink_digest(plan, self.fingerprint, p, self.kinds[name]) == m.digest for name, m in markers.items()):
                return p
        return None

    def plan(self, repair: EpochRepair, logs: Callable[[str], TopicLog]) -> None:
        """Fill in how ``repair``'s epoch is rebuilt, or ``refused`` with why it cannot be;
        ``logs`` gives each topic's log now (a stream join's own topic's too)."""
        repair.refused = self._refusal(repair, logs)

    def _refusal(self, repair: EpochRepair, logs: Callable[[str], TopicLog]) -> str | None:
        epoch = repair.epoch
        odd = [p.ref.key for p in repair.parts if part_slot(p.ref.key) is None]
        if odd:  # guard: repair-odd-part-name-accepted
            return f"part {odd[0]} has a name of no known layout, so which rows it held is unknown"
        plan = self._plan_of(epoch)
        if plan is None:  # guard: repair-missing-plan-accepted
            return (
                f"the plan of epoch {epoch} is no longer saved (plans are kept back to the oldest retained "
                "snapshot's epoch), so its input is unknown"
            )
        markers = {name: SuccessMarker.model_validate_json(raw) for name, raw in repair.markers.items()}
        repair.plan, repair.parallelism = plan, self._parallelism(plan, markers)
        if repair.parallelism is None:  # guard: repair-digest-mismatch-accepted
            return (
                f"the marker of epoch {epoch} records another input, spec or parallelism than its saved plan and "
                "the current spec give (the spec changed since, or the plan was replaced)"
            )
        # guard: repair-keyed-flow-without-state
        repair.needs_state = any(p.sink in self.stateful for p in repair.parts)
        if any(p.sink == DEAD_LETTERS and late_letter_part(p.ref.key) for p in repair.parts):
            repair.needs_state = True  # a late record's letter is judged by the watermark the epoch started with
        if repair.needs_state:
            why = self._base_state(repair)
            if why:
                return why
        for read in [*repair.replay, plan]:  # guard: repair-replay-input-unchecked
            why = _input_gone(read, logs, epoch)
            if why:
                return why
        return None

    def _base_state(self, repair: EpochRepair) -> str | None:
        """Set where the state before the epoch comes from and the plans replayed after it;
        None, or why the state cannot be rebuilt."""
        epoch = repair.epoch
        earlier = [e for e in self.history if e.epoch < epoch]  # guard: repair-starts-from-its-own-snapshot
        manifest: Manifest | None = None
        problems: list[str] = []
        for entry in earlier:  # newest first: the fewest epochs to replay
            try:
                # guard: repair-ignores-head-sha
                manifest = self.snapshots.load_manifest(entry.snapshot_id, entry.manifest_sha256 or None)
                for flow in manifest.flows.values():
                    if flow.state:
                        # guard: repair-skips-state-check
                        read_spans(self.snapshots, flow.state.files, len(flow.state.key_columns))
                break
            except (SnapshotError, NotFound) as exc:
                problems.append(f"snapshot {entry.snapshot_id}: {exc}")
                manifest = None
        if manifest is None and epoch > 1:  # guard: repair-from-empty-state-after-epoch-1
            oldest = f" (the oldest retained is of epoch {self.history[-1].epoch})" if self.history else ""
            damaged = f"; {'; '.join(problems)}" if problems else ""
            return (
                f"no usable retained snapshot precedes epoch {epoch}{oldest}{damaged}, so the state before it "
                "cannot be rebuilt"
            )
        repair.start_from = manifest.snapshot_id if manifest else None
        positions = manifest.positions if manifest else None
        for k in range((manifest.epoch if manifest else 0) + 1, epoch):
            plan = self._plan_of(k)
            if plan is None:
                return f"the plan of epoch {k}, replayed to rebuild the state before epoch {epoch}, is no longer saved"
            if positions is not None and {p: o for p, o in plan.positions.items() if p in positions} != {
                p: o for p, o in positions.items() if p in plan.positions
            }:  # guard: repair-replay-chain-unchecked
                return (
                    f"the plan of epoch {k} does not start where the epoch before it ended, so replaying it "
                    f"would not rebuild the state before epoch {epoch}"
                )
            why = self._replayable(plan)
            if why:
                return why
            repair.replay.append(plan)
            positions = plan.end_positions()
        assert repair.plan is not None
        # guard: repair-epoch-start-unchecked
        if positions is not None and {p: o for p, o in repair.plan.positions.items() if p in positions} != {
            p: o for p, o in positions.items() if p in repair.plan.positions
        }:
            return f"the plan of epoch {epoch} does not start where the state rebuilt before it ends"
        return None

    def _replayable(self, plan: EpochPlan) -> str | None:
        """A replayed epoch must be the one committed: each stateful flow's marker has its digest."""
        for name in sorted(self.stateful):
            try:
                marker = SuccessMarker.model_validate_json(self.sinks[name].get(f"epoch={plan.epoch}/{MARKER}"))
            except (NotFound, ValueError):
                return f"epoch {plan.epoch} of flow {name}, replayed to rebuild the state, has no readable {MARKER}"
            # guard: repair-replay-digest-unchecked
            if not any(
                sink_digest(plan, self.fingerprint, p, self.kinds[name]) == marker.digest
                for p in range(1, self.job.checkpoint.max_parallelism + 1)
            ):
                return (
                    f"the saved plan of epoch {plan.epoch}, replayed to rebuild the state, is not the one its "
                    f"marker of flow {name} committed"
                )
        return None


def _input_gone(plan: EpochPlan, logs: Callable[[str], TopicLog], epoch: int) -> str | None:
    """Why ``plan``'s ranges can no longer be read (for repairing ``epoch``), or None: each range
    against its own topic's log now (a stream join's second topic has its own id and log starts)."""
    why = f"replayed to rebuild the state before epoch {epoch}" if plan.epoch != epoch else "the epoch's input"
    ids = {r.topic: plan.topic_id for r in plan.ranges}
    if plan.second_topic is not None:  # guard: repair-second-topic-as-first
        ids[plan.second_topic.topic] = plan.second_topic.topic_id
    for topic, topic_id in ids.items():
        log = logs(topic)
        # guard: repair-ignores-topic-id
        if topic_id is not None and log.topic_id is not None and topic_id != log.topic_id:
            return (
                f"topic {topic} was deleted and created again since epoch "
                f"{plan.epoch} read it (topic id {topic_id}, now {log.topic_id}): {why} is gone"
            )
    for r in plan.ranges:
        start = logs(r.topic).starts.get(r.partition)  # guard: repair-range-against-first-topic
        if r.size and (start is None or start > r.start):  # guard: repair-ignores-retention
            where = f"the log starts at offset {start}" if start is not None else "the partition is gone"
            return (
                f"{why}, {r.topic}[{r.partition}] offsets [{r.start}, {r.end}) of epoch {plan.epoch}, is no "
                f"longer in Kafka: {where} (retention or a records deletion)"
            )
    return None


def kafka_logs(settings: ConnectionSettings) -> Callable[[str], TopicLog]:
    """Each topic's log as the broker has it now, asked once per topic (a topic that no longer
    exists has no partitions, so none of its ranges can be read)."""
    from pipeline_lib.plan import kafka_offsets

    seen: dict[str, TopicLog] = {}

    def log_of(topic: str) -> TopicLog:
        if topic not in seen:
            with kafka_offsets.offsets_consumer(settings.require_kafka()) as consumer:
                try:
                    partitions = kafka_offsets.topic_partitions(consumer, topic, timeout_s=5.0)
                except PipelineError:
                    seen[topic] = TopicLog({})
                else:
                    seen[topic] = TopicLog(
                        kafka_offsets.earliest_offsets(consumer, topic, partitions),
                        kafka_offsets.topic_id(consumer, topic),
                    )
        return seen[topic]

    return log_of
