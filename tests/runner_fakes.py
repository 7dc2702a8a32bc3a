"""A pipeline runner's collaborators for tests without Spark: the real restorer, planner and
commit over local-directory stores (each wrapped in ``Watched``, whose ``log`` and ``after`` a
test sets when it starts watching), the keyed state on the driver, a fake clock and a fake path
that hands out canned reads."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa

from pipeline_lib.checkpoint.epoch_commit import CommittedEpoch
from pipeline_lib.checkpoint.manifest import HistoryEntry
from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup
from pipeline_lib.execution.runtime.driver_state import DriverState
from pipeline_lib.execution.runtime.epoch_path import FlowMerge, FlowResult, OwnerTasks, Writers
from pipeline_lib.execution.runtime.part_writers import SinkPartWriters
from pipeline_lib.execution.runtime.phase_timer import PhaseTimer
from pipeline_lib.execution.runtime.pipeline_runner import PipelineRunner
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_epoch import EpochCommit
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_planning import EpochPlanner
from pipeline_lib.execution.runtime.runner_restore import Restorer
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime, RunOptions
from pipeline_lib.graph import build_graph
from pipeline_lib.plan.offsets import EpochPlan
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.storage import open_store, parse_location
from tests.watched_store import Watched


class FakeClock:
    """A monotonic clock that moves only when told (``advance``)."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeSpark:
    """What the runner asks of a Spark session when every Spark job is left to a fake path: the
    scheduler's properties, job groups and tags (noted in ``calls``), and a local master."""

    def __init__(self, master: str = "local[2]"):
        self.calls: list[tuple] = []
        self.sparkContext = self
        self.master = master

    def __getattr__(self, name: str):
        if name in ("setLocalProperty", "setJobGroup", "addJobTag", "cancelJobGroup", "cancelJobsWithTag"):
            return lambda *args, **kwargs: self.calls.append((name, *args))
        raise AttributeError(name)

    def getConf(self):
        return {}


class FakePath:
    """An epoch path whose reads are canned: each planned range of partition ``p`` brings one key
    ``user-p`` whose amount is the range's record count (as the spend job's partials would), with
    the real keyed state on the driver; it carries the source subtasks' start-up checks, passed."""

    name, carries_checks = "fake path", True

    def __init__(self, state: DriverState, flows: list[FlowRuntime], parallelism: int):
        self.state, self.flows, self.parallelism = state, flows, parallelism
        self.read_epochs: list[int] = []
        self.events: list[str] = []  # "read N" and "warmed at P" (a warm-up's tasks, as it ends), in order
        self.warm_up_seconds = 0.0

    def read(self, spark, reader, plan: EpochPlan, writers: Writers, owners: OwnerTasks, start=None) -> EpochRead:
        self.read_epochs.append(plan.epoch)
        self.events.append(f"read {plan.epoch}")
        amounts = {f"user-{r.partition}": r.end - r.start for r in plan.ranges if r.end > r.start}
        table = pa.table(
            {
                "user": list(amounts),
                "total": pa.array(list(amounts.values()), pa.int64()),
                "n": pa.array(list(amounts.values()), pa.int64()),
            }
        )
        checks = [(i, True, "fake subtask started") for i in range(self.parallelism)] if start is not None else None
        return EpochRead(plan, None, {flow.spec.name: table for flow in self.flows}, checks=checks)

    def warm_up(self, spark, reader, writers: Writers, owners: OwnerTasks) -> None:
        time.sleep(self.warm_up_seconds)
        self.events.append(f"warmed at {len(reader.tasks)}")


class WatchedStores:
    """A store opener for PipelineParts.from_spec: each store a ``tap`` (a Watched store) named
    ``ckpt``, ``dlq``, ``out`` (the files sink's staged commit) or ``pub`` (its folder), noting
    nothing until ``watch``."""

    def __init__(self, spec: JobSpec, tap: type[Watched] = Watched):
        self.taps: list[Watched] = []
        self.tap = tap
        self.checkpoint = str(parse_location(spec.checkpoint.store))
        self.dead = str(parse_location(spec.dead_letter.path)) if spec.dead_letter else None

    def __call__(self, location, settings: ConnectionSettings):
        where = str(parse_location(location) if isinstance(location, str) else location)
        name = (
            "ckpt"
            if where.startswith(self.checkpoint)
            else "dlq"
            if self.dead and where.startswith(self.dead)
            else "out"
            if where.rstrip("/").endswith("/_staging")
            else "pub"  # a files sink's folder, where committed epochs are published
        )
        store = self.tap(open_store(location, settings), name, [])
        self.taps.append(store)
        return store

    def watch(self, log: list, after: Callable[[str, str], None] | None = None) -> None:
        """Note every store call from now on in ``log``, each passed to ``after``."""
        for tap in self.taps:
            tap.log, tap.after = log, after


def composed_runner(
    spec: JobSpec,
    options: RunOptions,
    settings: ConnectionSettings,
    clock: Callable[[], float],
    stores: WatchedStores,
    verify=None,
) -> tuple[PipelineRunner, FakePath]:
    """A real PipelineRunner of the spec's one pipeline, composed as runner_factory composes it,
    but on ``stores``, with ``clock``, and with a FakePath for its epochs (so no Spark job runs)."""
    [pipeline] = build_graph(spec).pipelines()
    parts = PipelineParts.from_spec(spec, pipeline, settings, options, stores)
    attempt = RunAttempt(spec.name, pipeline.name)
    path = FakePath(DriverState(parts), parts.flows, parts.parallelism)
    restorer = Restorer(parts, verify) if verify is not None else Restorer(parts)
    runner = PipelineRunner(
        parts,
        restorer,
        EpochPlanner(parts),
        attempt,
        lambda spark, schema, groups: path,
        SinkPartWriters(parts, attempt),
        BackgroundCleanup(f"pipeline {pipeline.name}"),
        clock,
    )
    return runner, path


class TestRunner:
    """A runner's collaborators, composed as ``runner_factory`` composes them, minus Spark and the
    loop: the stores are the spec's local directories, each wrapped in ``Watched`` (``stores``)."""

    __test__ = False  # not a test class

    def __init__(
        self,
        spec: JobSpec,
        options: RunOptions,
        settings: ConnectionSettings | None = None,
        clock: Callable[[], float] | None = None,
        tap: type[Watched] = Watched,
    ):
        settings = settings or ConnectionSettings()
        [pipeline] = build_graph(spec).pipelines()
        self.stores = WatchedStores(spec, tap)
        self.parts = PipelineParts.from_spec(spec, pipeline, settings, options, self.stores)
        self.run_attempt = RunAttempt(spec.name, pipeline.name)
        self.restorer, self.planner = Restorer(self.parts), EpochPlanner(self.parts)
        self.state = DriverState(self.parts)
        self.writers = SinkPartWriters(self.parts, self.run_attempt)
        self.cleanup = BackgroundCleanup(f"pipeline {pipeline.name}")
        self.timer = PhaseTimer(clock) if clock is not None else PhaseTimer()
        self.commit = EpochCommit(self.parts, self.state, self.run_attempt, self.cleanup.submit, self.timer)

    def watch(self, log: list, after: Callable[[str, str], None] | None = None) -> None:
        """Note every store call from now on in ``log``, each passed to ``after``."""
        self.stores.watch(log, after)

    @property
    def snapshots(self):
        return self.parts.snapshots

    @property
    def flows(self) -> list[FlowRuntime]:
        return self.parts.flows

    @property
    def dead_letters(self):
        return self.parts.dead_letters

    @property
    def restored(self) -> Restored | None:
        return self.restorer.restored

    def restore(self) -> Restored | None:
        return self.restorer.restore()

    @property
    def attempt(self) -> int:
        return self.run_attempt.number

    def claim(self) -> int:
        self.run_attempt.number = self.parts.snapshots.claim_attempt()
        return self.run_attempt.number

    def sink_digest(self, plan: EpochPlan, kind: str) -> str:
        return self.parts.sink_digest(plan, kind)

    def plan(
        self,
        epoch: int,
        base: str | None,
        positions: dict[int, int],
        targets: dict[int, int],
        stops: dict[int, int] | None = None,
    ) -> EpochPlan:
        return self.planner.plan(epoch, base, positions, targets, stops)

    def task_writers(self, epoch: int) -> Writers:
        return self.writers.for_epoch(epoch)

    def merge(self, flow: FlowRuntime, result: FlowResult) -> FlowMerge:
        return self.state.merge(flow, result)

    def run_epoch(self, read: EpochRead, history: list[HistoryEntry], head_version: str | None) -> CommittedEpoch:
        """The epoch's merge and commit, then its clean-up awaited."""
        committed = self.commit.run(read, history, head_version)
        self.cleanup.wait()
        return committed

    def close(self) -> None:
        self.cleanup.close()
