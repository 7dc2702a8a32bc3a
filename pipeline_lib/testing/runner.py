"""``run_on_records``: a spec's flows over in-memory records, through the job's own epoch code.

What is the job's own: the spec's validation; the planner cutting the records into epochs
(``trigger.max_records_per_epoch``, or per subtask; fair shares over partitions, as a run catching
up does); the epoch reader's decoding (RecordsReader: the same RecordBatcher, metadata columns and bad-record
rows); the choice between the Arrow path and the Spark SQL path and each path's code (transforms,
``python:`` hooks, partial aggregates, the tasks writing stateless rows and dead letters); the keyed
state's merge; the sink's part files and ``_SUCCESS`` markers, staged, and a files sink's epochs
then published to its folder (sink.published_files_sink), as a run does once HEAD moved; and
reading the table back as a downstream reader does (pipeline_lib.api.read_table).

What differs from ``pipeline-lib run``: no Kafka (no offsets are committed anywhere, no consumer,
no transactions or compaction), no S3 (every location is a local directory), Spark in local mode
in this process, and no snapshots: no manifests, state files or head pointer are written, so there
is nothing to restore, and keyed state lives on the driver for the whole call (as in local mode).
The records are the topic's whole contents at the start of an until-caught-up run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline_lib.api.specs import as_job
from pipeline_lib.api.tables import read_table
from pipeline_lib.errors import PipelineError
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.testing.local_spec import local_copy
from pipeline_lib.testing.records import Record

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


ATTEMPT = 1  # the one attempt of a test run: part names and markers carry it as a run's do


@dataclass(frozen=True)
class RecordsRun:
    """What ``run_on_records`` left: each flow's table as read back from its sink, the dead
    letters, the bad records counted, the epochs run and where everything was written."""

    tables: dict[str, list[dict]]  # per flow: read_table of its sink (one row per key for an aggregate)
    dead_letters: list[dict]  # the dead-letter sink's rows (on_error: dead_letter), else empty
    bad_records: int  # records that were dead-lettered or skipped
    epochs: int
    workdir: Path  # sinks/<flow>, dead-letters/<source>: file:// locations a test may read again

    def table(self, flow: str | None = None) -> list[dict]:
        """The table of ``flow``, or of the only flow when the run had one."""
        if flow is None:
            if len(self.tables) != 1:
                raise KeyError(f"the run has flows {sorted(self.tables)}; name one")
            return next(iter(self.tables.values()))
        return self.tables[flow]


def run_on_records(
    spec: JobSpec | Mapping[str, Any] | str | Path,
    records: Iterable[Record | dict | list | str | bytes | None],
    *,
    source: str | None = None,
    parallelism: int | None = None,
    workdir: str | Path | None = None,
    spark: SparkSession | None = None,
) -> RecordsRun:
    """Run the flows of ``spec`` that read ``source`` (default: the spec's only source) over
    ``records`` (Record, or a record's value: a dict is a JSON value), and read back their tables.

    A bad record does what ``on_error`` says: ``fail`` raises the run's PipelineError naming the
    record (``bad record at <topic>[<partition>]@<offset>: ...``), ``dead_letter`` and ``skip``
    keep it out of the tables (``dead_letter``: in ``dead_letters``). ``workdir``: where the
    sinks go (default: a new temporary directory, kept for the caller). ``spark``: a local
    SparkSession to reuse (a test suite's fixture); by default one is started and stopped."""
    import pyarrow as pa

    from pipeline_lib.execution.engine.spark_errors import clear_spark_errors
    from pipeline_lib.execution.engine.spark_session import start_spark, stop_spark
    from pipeline_lib.execution.engine.table_join import StaticTables
    from pipeline_lib.execution.runtime.chained_flows import ChainedInput, stages_of
    from pipeline_lib.execution.runtime.driver_merge import merge_on_driver
    from pipeline_lib.execution.runtime.epoch_path import Writers
    from pipeline_lib.execution.runtime.late_routing import dead_letter_files, routed, session_letters_written
    from pipeline_lib.execution.runtime.path_choice import driver_read
    from pipeline_lib.execution.runtime.process_merge import process_merge
    from pipeline_lib.execution.runtime.runner_parts import windowed_watermark
    from pipeline_lib.execution.runtime.runner_types import FlowRuntime, sink_digest, spec_fingerprint
    from pipeline_lib.execution.source.epoch_reader import epoch_range_reader, source_schema
    from pipeline_lib.execution.state.process_state import ProcessInput, ProcessState
    from pipeline_lib.execution.state.state_kinds import new_keyed_state
    from pipeline_lib.plan.epoch_budget import epoch_budget
    from pipeline_lib.plan.offsets import plan_epoch
    from pipeline_lib.sink.files_sink import FilesSink
    from pipeline_lib.sink.published_files_sink import PublishedFilesSink, read_location
    from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts
    from pipeline_lib.storage import open_store, parse_location
    from pipeline_lib.testing.records import RecordsReader, partition_logs

    job = as_job(spec)
    name = _source_of(job, source)
    root = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix=f"pipeline-lib-test-{job.name}-"))
    local = local_copy(job, root)
    p, maxp = local.effective_parallelism(parallelism), local.checkpoint.max_parallelism
    settings = ConnectionSettings()  # file:// locations only: no S3, no Kafka
    kafka = local.all_sources()[name].kafka
    kafka = kafka.model_copy(update={"key_encoding": local.key_encoding_of(name)})
    flows = [f for f in local.all_flows() if f.source == name]
    tolerant = local.on_error != "fail"
    sinks = {f.name: FilesSink(open_store(f.sink.parts_location, settings), f.sink.parts_format) for f in flows}
    published = [  # a files sink's folder: its staged epochs copied there, as a run does after HEAD moved
        PublishedFilesSink(sinks[f.name], open_store(f.sink.path, settings))
        for f in flows
        if f.sink.files is not None and f.sink.kafka is None
    ]
    states = {f.name: state for f in flows if (state := new_keyed_state(f.state, maxp)) is not None}
    dead_location = (
        str(parse_location(local.dead_letter.path).child(name))
        if local.on_error == "dead_letter" and local.dead_letter is not None
        else None
    )
    dead = FilesSink(open_store(dead_location, settings), "jsonl") if dead_location is not None else None
    fingerprint = spec_fingerprint(local)
    logs = partition_logs(records)
    positions, targets = {q: 0 for q in logs}, {q: len(log) for q, log in logs.items()}
    session = spark if spark is not None else start_spark(f"pipeline-lib-testing:{job.name}", None, p, local.spark)
    epoch, bad_records = 0, 0
    try:
        schema = source_schema(session, kafka, tolerant)
        runtimes = {
            f.name: FlowRuntime(
                spec=f, sink=sinks[f.name], state=states.get(f.name), watermark=windowed_watermark(local, f)
            )
            for f in flows
        }
        stages, stage_rows = stages_of(flows), {}
        read = driver_read(session, schema, list(runtimes.values()), tolerant, StaticTables(settings))
        while (
            plan := plan_epoch(
                epoch + 1,
                None,
                kafka.topic,
                positions,
                targets,
                epoch_budget(local.trigger, p),
                event_time=kafka.watermark is not None,
            )
        ).ranges:
            epoch = plan.epoch
            reader = RecordsReader.over(
                epoch_range_reader(
                    "", kafka, schema, plan, p, local.on_error, local.max_record_bytes, local.max_batch_bytes
                ),
                logs,
            )
            writers = [
                None if f.state is not None else TaskPartWriter.for_sink(sinks[f.name], settings, epoch, ATTEMPT, "r")
                for f in flows
            ]
            dead_writer = TaskPartWriter.for_sink(dead, settings, epoch, ATTEMPT, "d") if dead is not None else None
            with clear_spark_errors(f"epoch {epoch} of pipeline {name}"):
                bad, by_flow = read(reader, routed(Writers(writers, dead_writer), list(runtimes.values())))
            for flow in flows:
                result = by_flow[flow.name]
                digest = sink_digest(plan, fingerprint, p, sinks[flow.name].format)
                if isinstance(result, WrittenParts):  # a stateless flow: the read tasks wrote its rows
                    sinks[flow.name].write_epoch(epoch, digest, [], ATTEMPT, result.files)
                    continue
                runtime = runtimes[flow.name]
                state = states[flow.name]
                # a bounded source (stop) ends with the records, which closes every window and fires every timer
                ended = kafka.stop is not None and all(plan.end_positions().get(q, 0) >= n for q, n in targets.items())
                if isinstance(state, ProcessState) and isinstance(result, ProcessInput):  # the function's rows
                    column = kafka.watermark.column if kafka.watermark is not None else None
                    out = process_merge(runtime, state, result, p, ended, column).parts
                    if flow.name in stages:  # a dedup stage: its flow aggregates the rows it passed
                        stage_rows[flow.name], out = pa.concat_tables(out) if out else pa.table({}), []
                    sinks[flow.name].write_epoch(epoch, digest, out, ATTEMPT)
                    continue
                if isinstance(result, ChainedInput):
                    result = result.build(stage_rows.pop(result.after))
                assert isinstance(result, pa.Table), "state on the driver: the partials come to the driver"
                parts, _ = merge_on_driver(runtime, result, p, maxp, ended)
                sinks[flow.name].write_epoch(epoch, digest, parts, ATTEMPT)
            merge_letters = session_letters_written(Writers(writers, dead_writer), list(runtimes.values()))
            if bad is not None:
                bad_records += bad.rows
                if dead is not None:
                    files = dead_letter_files(bad, merge_letters)  # a session window's late records too
                    dead.write_epoch(epoch, sink_digest(plan, fingerprint, p, "dead-letters"), [], ATTEMPT, files)
            for sink in published:  # every flow's epoch is written: the epoch is what a run commits
                sink.publish_through(epoch, ATTEMPT)
            positions = plan.end_positions()
    finally:
        if spark is None:
            stop_spark(session)
    tables = {
        f.name: read_table(
            read_location(f), settings, key=f.state.state_key() if f.state and not f.state.process else None
        )
        for f in flows
    }
    dead_rows = read_table(dead_location, settings) if dead_location is not None else []
    return RecordsRun(tables, dead_rows, bad_records, epoch, root)


def _source_of(job: JobSpec, source: str | None) -> str:
    """The source whose flows run: ``source``, or the job's only one."""
    sources = sorted(job.all_sources())
    if source is None:
        if len(sources) != 1:
            raise PipelineError(f"job {job.name} has sources {sources}; choose one with source=")
        return sources[0]
    if source not in sources:
        raise PipelineError(f"job {job.name} has no source {source!r} (it has {sources})")
    return source
