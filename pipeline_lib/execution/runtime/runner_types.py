"""The values one pipeline run passes around: its options, a flow's live parts, an epoch's read
and report, and the digests its outputs are keyed by.
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import StateFileRef
from pipeline_lib.execution.runtime.lifecycle import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_STALL_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
)
from pipeline_lib.execution.state.owner_epochs import OwnedFlow
from pipeline_lib.execution.state.owner_task import StateReads
from pipeline_lib.execution.state.process_state import ProcessInput
from pipeline_lib.execution.state.state_kinds import KeyedState
from pipeline_lib.execution.state.watermark import Watermark
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.published_files_sink import PublishedFilesSink
from pipeline_lib.sink.task_parts import WrittenParts
from pipeline_lib.spec.models import FlowSpec, JobSpec

if TYPE_CHECKING:  # pyiceberg takes ~0.5 s of CPU to import: a run loads it only for an Iceberg sink (sink.sinks)
    from pipeline_lib.sink.iceberg_sink import IcebergSink

Mode = Literal["until-caught-up", "forever"]
EPOCH_PHASES = ("spark", "merge", "sink", "state", "commit", "cleanup")  # see EpochReport.phases


@dataclass(frozen=True)
class RunOptions:
    """How one run of a pipeline behaves (mode, restore point, parallelism, leases): the CLI's options."""

    mode: Mode = "until-caught-up"
    restore: str = "latest"
    parallelism: int | None = None
    poll_interval_s: float = 2.0
    max_epochs: int | None = None  # stop after this many epochs (tests, smoke runs)
    skip_completed: bool = True  # False = restore and deploy completed pipelines too (a whole-job restart)
    lease_seconds: float = DEFAULT_LEASE_SECONDS  # heartbeat lease on the STATUS record
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_SECONDS  # SCHEDULING → RUNNING within this
    stall_seconds: float = DEFAULT_STALL_SECONDS  # RUNNING with records waiting and no commit this long: STALLED
    launched_by: str = "cli"


@dataclass(frozen=True)
class EpochReport:
    """One committed epoch's numbers, handed to ``on_epoch`` for the progress line and the run summary."""

    pipeline: str
    epoch: int
    snapshot_id: str
    records: int
    rows_written: int
    keys: int
    lag: int
    seconds: float
    completed_splits: int
    bad_records: int = 0
    late_records: int = 0  # records dropped as late: their windows were closed (windowed flows)
    task_result_bytes: int | None = None  # what the epoch's tasks sent the driver (known on the Arrow path)
    state_reads: StateReads | None = None  # where owner tasks found the state they merged into (cache or store)
    state_bytes: int = 0  # every state file the snapshot references
    state_bytes_written: int = 0  # of which this epoch wrote (the incremental snapshot)
    # Wall seconds of the epoch's phases, in commit order (see EpochCommit.run, checkpoint.epoch_commit):
    # spark (waiting for the Spark jobs: read Kafka, decode, transform, partial aggregate; they
    # start while the epoch before commits, see ReadAhead), merge (keyed state
    # merge and sink rows on the driver), sink (part files + _SUCCESS), state (state files),
    # commit (head check, manifest, head compare-and-swap), cleanup (waiting for the previous epoch's
    # garbage collection and stale-part removal, which run beside this epoch: see BackgroundCleanup);
    # with Kafka sinks, publish (the writers' transactions, after the head moved: sink/kafka_publisher.py).
    phases: dict[str, float] = field(default_factory=dict, compare=False, hash=False)
    started: float = 0.0  # when the epoch started, on the runner's clock (monotonic seconds; see epoch_trigger)
    parallelism: int = 0  # the subtasks the epoch ran with (its snapshot records it)
    autoscale: str | None = None  # the autoscaler's decision after the epoch, with its reason (None: off)
    scaled_to: int | None = None  # the parallelism that decision changes to (None: it keeps it)
    autoscale_capped: bool = False  # that decision's scale-up stayed or fell short: Spark offered no more cores


@dataclass
class FlowRuntime:
    """A flow's live parts: its sink, its keyed state (on the driver; None for a stateless flow
    and for one whose state lives on owner tasks) and the state files of the last snapshot."""

    spec: FlowSpec
    sink: FilesSink | PublishedFilesSink | DeltaSink | IcebergSink
    state: KeyedState | None
    state_schema: pa.Schema | None = None
    state_files: dict[tuple[int, int], StateFileRef] = field(default_factory=dict)
    owned_keys: int = 0  # the keys of a state on owner tasks, as their last results counted them
    watermark: Watermark | None = None  # a windowed flow's watermark after the last merged epoch
    late_records: int = 0  # of the last merged epoch: records dropped as late (their windows closed)
    late_letters: pa.Table | None = None  # of the last epoch merged on the driver: a session window's late records

    @property
    def stateful(self) -> bool:
        """True for a flow with a keyed aggregate, wherever its state lives."""
        return self.spec.state is not None

    def keys(self) -> int:
        """The keys of the flow's state."""
        return len(self.state) if self.state is not None else self.owned_keys


@dataclass(frozen=True)
class EpochRead:
    """What the Spark jobs of one epoch brought to the driver: the dead-letter parts the read
    tasks wrote and the bad records they counted (None when bad records fail the run), and
    each flow's result: a stateful flow's partials (or, on owner tasks, the references of what
    they wrote), or the parts tasks wrote of a stateless flow's rows (see sink.task_parts)."""

    plan: EpochPlan
    bad: WrittenParts | None
    flows: dict[str, pa.Table | OwnedFlow | WrittenParts | ProcessInput]
    result_bytes: int | None = None  # task results the driver received (the Arrow path, with or without owners)
    # each source subtask's start-up checks (index, ok, detail) when the read ran them (runtime.startup)
    checks: list[tuple[int, bool, str]] | None = None
    state_reads: StateReads | None = None  # where the owner tasks found the previous state (None off owner tasks)
    late: WrittenParts | None = None  # the late records the read tasks dead-lettered (on_late: dead_letter)


@dataclass
class Prepared:
    """What a pipeline's start-up learns before it needs Spark (PipelineRunner.prepare): the
    planner's open Kafka consumer (closed with ``resources``), where each partition resumes, the
    stops of a bounded source and the ends the run reads to."""

    resources: ExitStack
    consumer: object
    positions: dict[int, int]
    stops: dict[int, int] | None
    targets: dict[int, int]


def sink_digest(plan: EpochPlan, fingerprint: str, parallelism: int, kind: str) -> str:
    """What an epoch's sink output is a function of: its planned input, the job's spec (a
    changed transform or aggregate gives other rows from the same input), the parallelism
    (how rows are cut into parts) and the sink's format, or ``dead-letters``. A marker is
    reused only for an equal digest; repair regenerates an epoch only for an equal one."""
    # guard: sink-digest-ignores-spec
    return hashlib.sha256(f"{plan.digest()}|{fingerprint}|{parallelism}|{kind}".encode()).hexdigest()


def spec_fingerprint(spec: JobSpec) -> str:
    """A hash of the whole spec, stored with each run so a changed spec is visible in its snapshots."""
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()
