"""Keyed state on the driver: each flow's partials merged into its columnar state, the sink
parts cut per subtask, and the state files written at commit (incremental, see state_spans)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.manifest import StateSnapshot
from pipeline_lib.checkpoint.restore import Restored
from pipeline_lib.checkpoint.state_spans import Span, changed_per_span, plan_span_writes, spans_of, write_state_files
from pipeline_lib.execution.runtime.chained_flows import ChainedInput, stages_of
from pipeline_lib.execution.runtime.driver_merge import merge_on_driver
from pipeline_lib.execution.runtime.epoch_path import NO_SLOTS, FlowMerge, FlowResult, OwnerTasks
from pipeline_lib.execution.runtime.process_merge import dropped_spans, process_merge
from pipeline_lib.execution.runtime.runner_parts import PipelineParts
from pipeline_lib.execution.runtime.runner_types import EpochRead, FlowRuntime
from pipeline_lib.execution.state.process_state import ProcessInput, ProcessState
from pipeline_lib.faults import fault_point
from pipeline_lib.sink.task_parts import WrittenParts


class DriverState:
    """The driver holds every stateful flow's keyed state; what passes through it grows with
    the keys an epoch changes, never with the records read."""

    def __init__(self, parts: PipelineParts):
        self.parts = parts
        self.stages = stages_of([f.spec for f in parts.flows])  # dedup stages whose rows a flow reads
        self.stage_rows: dict[str, pa.Table] = {}  # of this epoch, from each stage's merge to its flow's

    def take_restored(self, restored: Restored | None, load_on_driver: Callable[[], None]) -> None:
        """A restore verified on the executors (for owner tasks) is read into the driver after all."""
        if restored is not None and not restored.state_loaded:
            load_on_driver()

    def owner_tasks(
        self, epoch: int, records: int, base: bool = True, ended: bool = False, parallelism: int | None = None
    ) -> OwnerTasks:
        """No owner tasks: the driver merges."""
        return ()

    def adopt(self, read: EpochRead) -> None:
        """Nothing to take: the driver's merge updates the state files at commit."""

    def merge(self, flow: FlowRuntime, result: FlowResult, ended: bool = False) -> FlowMerge:
        """Merge a stateful flow's partials into its state; its changed keys' rows, in key order,
        one part per subtask (a part is a function of the plan: sink.part_layout). A stateless
        flow's result is the parts its read tasks wrote. A windowed flow's rows are instead
        the windows the epoch closed (state.window_close); ``ended``: the bounded source is read
        to its end after this epoch, so every window closes."""
        if not flow.stateful:
            assert isinstance(result, WrittenParts)
            return FlowMerge([], NO_SLOTS, result.files)
        if isinstance(flow.state, ProcessState):
            assert isinstance(result, ProcessInput), "a process flow's result is its rows"
            column = self.parts.event_column(flow.spec)
            merged = process_merge(flow, flow.state, result, self.parts.parallelism, ended, column)
            if flow.spec.name not in self.stages:
                return merged
            self.stage_rows[flow.spec.name] = pa.concat_tables(merged.parts) if merged.parts else pa.table({})
            return FlowMerge([], merged.changed, ())  # a stage writes no rows: its flow aggregates them
        if isinstance(result, ChainedInput):
            result = result.build(self.stage_rows.pop(result.after))
        assert isinstance(result, pa.Table), "a stateful flow's result is its partials"
        parts, changed = merge_on_driver(flow, result, self.parts.parallelism, self.parts.maxp, ended)
        return FlowMerge(parts, changed, ())

    def state_writer(self, flow: FlowRuntime, epoch: int, changed: np.ndarray) -> Callable[[str], StateSnapshot | None]:
        """``write_state`` of the keys ``changed`` this epoch."""
        return partial(self.write_state, flow, epoch=epoch, changed=changed)

    def write_state(self, flow: FlowRuntime, snapshot_id: str, epoch: int, changed: np.ndarray) -> StateSnapshot | None:
        """Write a delta (or, when due, a new base) for each span holding a key changed this
        epoch (the slots ``changed``); reference the previous snapshot's entries for the rest
        (see checkpoint.state_spans)."""
        state = flow.state
        if state is None:
            return None
        assert flow.spec.state is not None and flow.state_schema is not None
        maxp, schema = self.parts.maxp, flow.state_schema
        per_file = self.parts.key_groups_per_file(len(state))
        every = state.slots_by_key_group()
        changed_slots = state.slots_by_key_group(changed)
        spans = spans_of(np.unique(every[1]).tolist(), per_file, maxp)
        # guard: expired-key-span-as-delta
        writes = plan_span_writes(
            {s: ref for s, ref in flow.state_files.items() if s in spans},
            changed_per_span(changed_slots[1], per_file, maxp),
            (spans - flow.state_files.keys()) | (spans & dropped_spans(state, per_file, maxp)),
        )

        def span_rows(span: Span) -> tuple[pa.Table, np.ndarray]:
            slots = state.slots_in(changed_slots if span in writes.deltas else every, range(*span))
            return state.table(slots, schema), state.key_groups(slots)

        files = dict(writes.kept)
        for ref in write_state_files(
            self.parts.snapshots.store, snapshot_id, flow.spec.name, writes.to_write(), span_rows
        ):
            span = (ref.key_group_start, ref.key_group_end)
            files[span] = writes.entry(ref, len(state.slots_in(every, range(*span))))
            fault_point("mid_snapshot_write", epoch)
        flow.state_files = files
        return StateSnapshot(
            key_columns=flow.spec.state.state_key(),
            value_columns=flow.spec.state.snapshot_columns(),
            max_parallelism=maxp,
            parallelism=self.parts.parallelism,
            keys=len(state),
            files=sorted(files.values(), key=lambda f: f.key_group_start),
        )
