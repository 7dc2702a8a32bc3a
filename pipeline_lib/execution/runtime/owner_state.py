"""Keyed state on owner tasks: the driver holds none; each epoch's owner tasks merge it and write
its sink parts and state files, and the driver keeps their references (owner_epochs)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from pipeline_lib.checkpoint.epoch_commit import plan_ends
from pipeline_lib.checkpoint.manifest import StateSnapshot, snapshot_id_for
from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.execution.runtime.chained_flows import stages_of
from pipeline_lib.execution.runtime.epoch_path import NO_SLOTS, FlowMerge, FlowResult, OwnerTasks
from pipeline_lib.execution.runtime.process_merge import timer_clock
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.state.owner_epochs import OwnedFlow, OwnerEpochs
from pipeline_lib.execution.state.owner_task import OWNER_LABEL, OwnerFlow, OwnerTask
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.topic_watermark import merged_tops
from pipeline_lib.execution.state.window_clock import WindowClock
from pipeline_lib.faults import fault_point
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts


class OwnerState:
    """Owner tasks hold the keyed state (``owner_epochs``: what a worker makes of each flow);
    the driver keeps each flow's latest state files and key count."""

    def __init__(self, parts: PipelineParts, attempt: RunAttempt, owner_epochs: OwnerEpochs):
        self.parts, self.attempt, self.owner_epochs = parts, attempt, owner_epochs

    def take_restored(self, restored: Restored | None, load_on_driver: Callable[[], None]) -> None:
        """The driver drops what the restore loaded of the state; its state files and key counts stay."""
        for flow in self.parts.flows:
            if flow.stateful:
                flow.owned_keys, flow.state = flow.keys(), None
        if restored is not None:
            restored.flows.clear()

    def owner_tasks(
        self, epoch: int, records: int, base: bool = True, ended: bool = False, parallelism: int | None = None
    ) -> OwnerTasks:
        """Per flow (None: a stateless flow), owners of spans sized to the state's keys before the
        epoch (to the records, for a first epoch), building on the flow's latest state files
        (none when not ``base``: the warm-up's tasks, which must write nothing); a process flow's
        timers fire against its watermark as the epoch starts (``ended``: and all after its rows),
        and a windowed flow's owners judge late records by it and close windows by it advanced
        (``ended``: every window); owned by ``parallelism`` subtasks (default: the pipeline's now,
        another for the warm-up of a scale-up's)."""
        parts, sides = self.parts, self.owner_epochs
        checkpoint = parts.checkpoint_at()
        tasks: list[OwnerTask | None] = []
        stages = stages_of([f.spec for f in parts.flows])  # their rows go to their flow's owners
        for index, flow in enumerate(parts.flows):
            if not flow.stateful:
                tasks.append(None)
                continue
            per_file = parts.key_groups_per_file(flow.owned_keys or records)
            sink = TaskPartWriter.for_sink(flow.sink, parts.settings, epoch, self.attempt.number, OWNER_LABEL)
            files = tuple(flow.state_files.values()) if base else ()
            process = flow.spec.state.process if flow.spec.state is not None else None
            agg = flow.spec.state.aggregate if process is None and flow.spec.state is not None else None
            windowed = agg is not None and agg.window is not None
            # a windowed flow's partials carry hidden ones (event_windows) beside the state's values
            partial = process is not None or windowed or flow.state_schema is None
            schema = sides.schemas[index] if partial else flow.state_schema
            column = parts.event_column(flow.spec) if process is not None else None
            derived = agg if agg is not None and agg.derived else None
            windows = WindowClock(flow.watermark, ended) if windowed and flow.watermark is not None else None
            ttl_start = flow.watermark if agg is not None and agg.ttl is not None else None
            owned = OwnerFlow(
                flow.spec.name,
                sides.flows[index],
                schema,
                sink,
                files,
                process,
                column,
                derived,
                passes=flow.spec.name in stages,
            )
            tasks.append(
                OwnerTask(
                    checkpoint,
                    snapshot_id_for(epoch, self.attempt.number),
                    epoch,
                    SpanOwners(parallelism or parts.parallelism, parts.maxp, per_file),
                    owned,
                    parts.job.checkpoint.cache_bytes,
                    timer_clock(flow, ended),
                    windows,  # guard: owner-window-watermark-not-passed
                    ttl_start,  # guard: owner-ttl-watermark-not-passed
                )
            )
        return tuple(tasks)

    def adopt(self, read: EpochRead) -> None:
        """Take the state files and key counts the owner tasks of ``read`` returned as each
        flow's latest: its commit references them, and the next epoch's owners build on them
        (its read may start before this epoch commits, see ReadAhead)."""
        for flow in self.parts.flows:
            result = read.flows.get(flow.spec.name)
            agg = flow.spec.state.aggregate_spec if flow.spec.state is not None else None
            if flow.stateful and isinstance(result, OwnedFlow):
                flow.state_files = {(f.key_group_start, f.key_group_end): f for f in result.files}
                flow.owned_keys = result.keys
                if flow.watermark is not None:  # a process or windowed flow's: by every owner's largest event time
                    tops = [o.max_event_ms for o in result.owners if o.max_event_ms is not None]
                    ends = plan_ends(read.plan) and not (agg is not None and agg.ttl is not None)  # a ttl's never ends
                    by_topic = (
                        merged_tops(o.topic_max_ms for o in result.owners)
                        if flow.watermark.topics is not None
                        else None
                    )
                    top = max(tops) if tops else None
                    flow.watermark = flow.watermark.advanced(top, ended=ends, by_topic=by_topic)
                flow.late_records = sum(o.late_records for o in result.owners)

    def merge(self, flow: FlowRuntime, result: FlowResult, ended: bool = False) -> FlowMerge:
        """The owner tasks merged and wrote (their files are taken in ``adopt``; a windowed flow's
        owners closed its windows by ``ended`` already); the parts written."""
        if not flow.stateful:
            assert isinstance(result, WrittenParts)
            return FlowMerge([], NO_SLOTS, result.files)
        assert isinstance(result, OwnedFlow), "a stateful flow's result on owner tasks is their references"
        return FlowMerge([], NO_SLOTS, result.sink)

    def state_writer(self, flow: FlowRuntime, epoch: int, changed: np.ndarray) -> Callable[[str], StateSnapshot | None]:
        """``owned_state``: the owner tasks wrote the files already."""
        return partial(self.owned_state, flow, epoch)

    def owned_state(self, flow: FlowRuntime, epoch: int, snapshot_id: str) -> StateSnapshot | None:
        """A flow's state in the snapshot, from the references its owner tasks returned (they
        wrote the files, under this snapshot id)."""
        if flow.spec.state is None:
            return None
        if snapshot_id != snapshot_id_for(epoch, self.attempt.number):
            raise AssertionError(f"owner tasks wrote epoch {epoch}'s state for another snapshot than {snapshot_id}")
        fault_point("mid_snapshot_write", epoch)  # the state files exist; no manifest references them yet
        return StateSnapshot(
            key_columns=flow.spec.state.state_key(),
            value_columns=flow.spec.state.snapshot_columns(),
            max_parallelism=self.parts.maxp,
            parallelism=self.parts.parallelism,
            keys=flow.owned_keys,
            files=sorted(flow.state_files.values(), key=lambda f: f.key_group_start),
        )
