"""The Arrow path (aggregation in the Python workers) against the Spark SQL path, in one real Spark
session reading one real topic: for every flow shape, with and without bad records, both give the
same table (Arrow schema and rows; row order aside, floating-point sums to rounding). On the Arrow
path the read tasks write stateless rows and bad records themselves: those are read back."""

from __future__ import annotations

import base64
import io
import json
import math
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from pyspark import SparkContext
from pyspark.sql import functions as F

from pipeline_lib.execution.engine.aggregate import partials_frame
from pipeline_lib.execution.engine.worker_aggregation import ArrowEpochs
from pipeline_lib.execution.source.epoch_reader import (
    DEAD_LETTER_RAW_BYTES,
    bad_records_frame,
    epoch_range_reader,
    range_reader,
    read_tasks,
    source_schema,
)
from pipeline_lib.plan import kafka_offsets
from pipeline_lib.plan.offsets import plan_epoch
from pipeline_lib.samples import create_topic, produce_raw
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.task_parts import TaskPartWriter, WrittenParts
from pipeline_lib.spec.models import FlowSpec, KafkaSourceSpec
from pipeline_lib.storage import open_store

DDL = "user string, n int, amount bigint, price double, day date, ts timestamp, flag boolean, note string"
SINK = {"files": {"path": "file:///unused", "format": "parquet"}}
FLOWS = [
    {
        "name": "per_user",
        "state": {
            "aggregate": {
                "key": ["user"],
                "values": {
                    "total": "sum(amount)",
                    "events": "count(*)",
                    "seen": "count(amount)",
                    "low": "min(amount)",
                    "high": "max(note)",
                    "spent": "sum(price)",
                    "ints": "sum(n)",
                    "latest": "max(ts)",
                },
            }
        },
    },
    {
        "name": "per_day_flag",
        "state": {
            "aggregate": {
                "key": ["day", "flag"],
                "values": {"first": "min(ts)", "notes": "count(note)", "yes": "max(flag)", "small": "min(n)"},
            }
        },
    },
    {"name": "per_n", "state": {"aggregate": {"key": ["n"], "values": {"events": "count(*)"}}}},
    {"name": "rows"},
]
OVERSIZED = DEAD_LETTER_RAW_BYTES + 40_000  # a bad record a dead letter keeps only the start of


def _event(rng: random.Random) -> dict:
    maybe = lambda value: None if rng.random() < 0.1 else value  # noqa: E731
    return {
        "user": maybe(f"u{rng.randrange(60)}"),
        "n": maybe(rng.randint(-(2**31), 2**31 - 1)),
        "amount": maybe(rng.randint(-(10**12), 10**12)),
        "price": maybe(rng.uniform(-100, 100)),
        "day": maybe(f"2026-11-{rng.randint(1, 3):02d}"),
        "ts": maybe(f"2026-11-22T10:{rng.randrange(60):02d}:07Z"),
        "flag": maybe(rng.random() < 0.5),
        "note": maybe(rng.choice(["a", "zz", "é", ""])),
    }


@pytest.fixture(scope="module")
def spark():
    from pipeline_lib.execution.engine.spark_session import start_spark

    session = start_spark("arrow-path-e2e", None, 2)
    gateway = session.sparkContext._gateway
    yield session
    session.stop()
    # The JVM of this test process: stop it by its PID now, with its py4j connections, instead
    # of leaving both to interpreter exit.
    SparkContext._gateway = SparkContext._jvm = None
    gateway.shutdown()
    gateway.proc.kill()
    gateway.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def topics(local_stack):
    """{"clean": topic, "dirty": topic with some records that are not JSON of the schema, one of
    them larger than what a dead letter keeps of it}."""
    rng = random.Random(11)
    made = {}
    for kind in ("clean", "dirty"):
        topic = f"arrow-path-{kind}"
        create_topic(local_stack.kafka_bootstrap, topic, 3)
        values = []
        for i in range(4_000):
            values.append(json.dumps(_event(rng)).encode())
            if kind == "dirty" and i == 5:
                values.append(b"x" * OVERSIZED)
            elif kind == "dirty" and i % 400 == 5:
                values.append(rng.choice([b"not json", b'{"user": "x", "amount": "ten"}', b"\xff\xfe"]))
        for p in range(3):
            produce_raw(local_stack.kafka_bootstrap, topic, values[p::3], partition=p)
        made[kind] = topic
    return made


def _source(topic: str) -> KafkaSourceSpec:
    return KafkaSourceSpec.model_validate({"topic": topic, "format": "json", "schema": DDL})


def _whole_topic_plan(bootstrap: str, topic: str):
    with kafka_offsets.offsets_consumer(bootstrap) as consumer:
        partitions = kafka_offsets.topic_partitions(consumer, topic)
        start = kafka_offsets.earliest_offsets(consumer, topic, partitions)
        end = kafka_offsets.confirmed_end_offsets(consumer, topic, partitions)
    return plan_epoch(1, None, topic, start, end, 1_000_000, None)


def _spark_path(spark, reader, flows: list[FlowSpec], tolerant: bool):
    df = read_tasks(spark, reader)
    bad = bad_records_frame(df).toArrow() if tolerant else None
    good = df.filter(F.col("_error").isNull()).drop("_error", "_raw") if tolerant else df
    return bad, [partials_frame(good, f.state.aggregate).toArrow() if f.state else good.toArrow() for f in flows]


def _rows(table: pa.Table, order: list[str]) -> list[dict]:
    """Rows in a fixed order (nulls first), floats rounded to what any order of additions agrees on."""

    def rounded(value):
        return float(f"{value:.9g}") if isinstance(value, float) and math.isfinite(value) else value

    rows = [{k: rounded(v) for k, v in row.items()} for row in table.to_pylist()]
    return sorted(rows, key=lambda row: [(row[c] is not None, row[c] if row[c] is not None else 0) for c in order])


def _order(flow: FlowSpec) -> list[str]:
    return list(flow.state.aggregate.key) if flow.state else ["_partition", "_offset"]


def _writers(root, flows: list[FlowSpec], tolerant: bool):
    """Task writers of epoch 1 into ``root``: parquet parts of stateless flows, dead letters."""

    def writer(label: str) -> TaskPartWriter:
        return TaskPartWriter(f"file://{root}/{label}", ConnectionSettings(), "parquet", 1, 1, label[0])

    return [None if f.state else writer("rows") for f in flows], writer("dead") if tolerant else None


def _written_rows(root, label: str, written: WrittenParts) -> pa.Table:
    store = open_store(f"file://{root}/{label}", ConnectionSettings())
    return pa.concat_tables([pq.read_table(io.BytesIO(store.get(f.key))) for f in written.files])


@pytest.mark.parametrize("kind, on_error", [("clean", "fail"), ("dirty", "dead_letter")])
def test_both_paths_give_equal_tables_for_every_flow_shape(spark, local_stack, topics, kind, on_error, tmp_path):
    tolerant = on_error != "fail"
    topic = topics[kind]
    source = _source(topic)
    schema = source_schema(spark, source, tolerant=tolerant)
    flows = [FlowSpec.model_validate({"source": "main", "sink": SINK, **f}) for f in FLOWS]
    arrow, why = ArrowEpochs.for_flows(spark, schema, flows, tolerant)
    assert arrow is not None, why
    plan = _whole_topic_plan(local_stack.kafka_bootstrap, topic)
    reader = epoch_range_reader(local_stack.kafka_bootstrap, source, schema, plan, 2, on_error)
    assert len(reader.tasks) == 2

    spark_bad, spark_tables = _spark_path(spark, reader, flows, tolerant)
    writers, dead_letters = _writers(tmp_path, flows, tolerant)
    arrow_bad, arrow_results, received = arrow.read(spark, reader, writers, dead_letters)
    # the driver received at least the keyed flows' partials (one row per key per task)
    assert received >= sum(got.nbytes for flow, got in zip(flows, arrow_results) if flow.state)

    for flow, want, got in zip(flows, spark_tables, arrow_results):
        if not flow.state:  # the read tasks wrote the rows: read back what they wrote
            assert got.rows == want.num_rows and len({f.key for f in got.files}) == len(got.files) == 2
            got = _written_rows(tmp_path, "rows", got)
        assert got.schema == want.schema, flow.name
        assert got.num_rows == want.num_rows > 0, flow.name
        assert _rows(got, _order(flow)) == _rows(want, _order(flow)), flow.name
    if tolerant:
        assert arrow_bad.rows == spark_bad.num_rows == 10
        written = _written_rows(tmp_path, "dead", arrow_bad)
        assert written.schema == spark_bad.schema
        in_order = [("partition", "ascending"), ("offset", "ascending")]
        assert written.sort_by(in_order).to_pylist() == spark_bad.sort_by(in_order).to_pylist()
        [big] = [r for r in spark_bad.to_pylist() if r["raw_bytes"] == OVERSIZED]  # cut the same on both paths
        assert base64.b64decode(big["raw_base64"]) == b"x" * DEAD_LETTER_RAW_BYTES
        first = spark_bad.sort_by(in_order).slice(0, 1).to_pylist()[0]
        assert arrow_bad.first_bad == {k: first[k] for k in ("topic", "partition", "offset", "error")}
    else:
        assert arrow_bad is None


def test_a_read_of_nothing_gives_empty_tables_of_the_same_schemas(spark, local_stack, topics, tmp_path):
    source = _source(topics["dirty"])
    schema = source_schema(spark, source, tolerant=True)
    flows = [FlowSpec.model_validate({"source": "main", "sink": SINK, **f}) for f in FLOWS]
    arrow, _ = ArrowEpochs.for_flows(spark, schema, flows, True)
    reader = range_reader(local_stack.kafka_bootstrap, source, schema, [[], []], 0, "dead_letter")
    spark_bad, spark_tables = _spark_path(spark, reader, flows, True)
    arrow_bad, arrow_results, _ = arrow.read(spark, reader, *_writers(tmp_path, flows, True))
    stateful = [(f, t) for f, t in zip(flows, arrow_results) if f.state]
    assert [t.schema for _, t in stateful] == [t.schema for f, t in zip(flows, spark_tables) if f.state]
    assert all(t.num_rows == 0 for t in spark_tables) and all(t.num_rows == 0 for _, t in stateful)
    stateless = [w for f, w in zip(flows, arrow_results) if not f.state]
    assert all(w.rows == 0 and w.files == () for w in stateless + [arrow_bad])
    assert not list(tmp_path.iterdir())  # nothing read, nothing written


def test_a_record_the_strict_path_cannot_read_fails_the_epoch_naming_it(spark, local_stack, topics):
    from pipeline_lib.errors import PipelineError
    from pipeline_lib.execution.engine.spark_errors import clear_spark_errors

    topic = topics["dirty"]
    source = _source(topic)
    schema = source_schema(spark, source)
    flows = [FlowSpec.model_validate({"source": "main", "sink": SINK, **FLOWS[0]})]
    arrow, _ = ArrowEpochs.for_flows(spark, schema, flows, False)
    reader = epoch_range_reader(
        local_stack.kafka_bootstrap, source, schema, _whole_topic_plan(local_stack.kafka_bootstrap, topic), 2
    )
    with pytest.raises(PipelineError, match=rf"{topic}\[\d\]@\d+"):
        with clear_spark_errors("epoch 1"):
            arrow.read(spark, reader, [None])


def test_owner_tasks_keep_the_same_state_and_send_the_driver_only_references(spark, local_stack, topics, tmp_path):
    """The owner path of the same epoch: each stateful flow's state files and sink parts, read back,
    hold the Spark path's table; the driver receives references and counts only, a few hundred
    bytes per reference, whatever the keys and records."""
    from pipeline_lib.checkpoint.manifest import snapshot_id_for
    from pipeline_lib.checkpoint.restore import read_state_files
    from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
    from pipeline_lib.checkpoint.state_files import decode_state_file
    from pipeline_lib.execution.state.owner_epochs import OwnedFlow, OwnerEpochs
    from pipeline_lib.execution.state.owner_task import OWNER_LABEL, CheckpointAt, OwnerFlow, OwnerTask
    from pipeline_lib.execution.state.span_owners import SpanOwners

    topic = topics["clean"]
    source = _source(topic)
    schema = source_schema(spark, source)
    flows = [FlowSpec.model_validate({"source": "main", "sink": SINK, **f}) for f in FLOWS]
    arrow, _ = ArrowEpochs.for_flows(spark, schema, flows, False)
    reader = epoch_range_reader(
        local_stack.kafka_bootstrap, source, schema, _whole_topic_plan(local_stack.kafka_bootstrap, topic), 2
    )
    _, spark_tables = _spark_path(spark, reader, flows, False)
    checkpoint = CheckpointAt(f"file://{tmp_path}/ckpt", "job", "main", ConnectionSettings())
    owners = []
    for index, flow in enumerate(flows):
        sink = TaskPartWriter(f"file://{tmp_path}/{flow.name}", ConnectionSettings(), "parquet", 1, 1, OWNER_LABEL)
        owners.append(
            OwnerTask(
                checkpoint,
                snapshot_id_for(1, 1),
                1,
                SpanOwners(2, 128, 8),
                OwnerFlow(flow.name, arrow.flows[index], arrow.schemas[index], sink, ()),
            )
            if flow.state
            else None
        )
    writers = [
        None if f.state else TaskPartWriter(f"file://{tmp_path}/rows", ConnectionSettings(), "parquet", 1, 1, "r")
        for f in flows
    ]
    read = OwnerEpochs(arrow, 2).read(spark, reader, writers, None, owners)

    snapshots = SnapshotStore.open(checkpoint.store, "job", "main", ConnectionSettings())
    references = 0
    for flow, want, got in zip(flows, spark_tables, read.flows):
        if not flow.state:
            assert isinstance(got, WrittenParts) and got.rows == want.num_rows
            references += len(got.files)
            continue
        assert isinstance(got, OwnedFlow) and len(got.owners) == 2, flow.name
        references += len(got.files) + len(got.sink) + len(got.owners)
        state = pa.concat_tables([decode_state_file(d)[0] for d in read_state_files(snapshots, list(got.files))])
        parts = _written_rows(tmp_path, flow.name, WrittenParts(got.sink))
        assert got.keys == got.rows == state.num_rows == want.num_rows, flow.name
        assert _rows(state.cast(want.schema), _order(flow)) == _rows(want, _order(flow)), flow.name
        assert _rows(parts, _order(flow)) == _rows(want, _order(flow)), flow.name
    # measured: what the driver received for this epoch of 4,000 records
    print(f"owner path: {read.result_bytes} bytes of task results for {references} references")
    assert 0 < read.result_bytes < 600 * references


@pytest.mark.parametrize("tolerant", [False, True])
def test_the_schemas_built_in_python_equal_sparks_analysis(spark, tolerant):
    """The Arrow path takes its result schemas from Python (no Spark SQL session state on a short
    run): they must be what Spark's analysis of the Spark path's queries gives, for every flow
    shape, the bad records, and the session's Arrow string types."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from pipeline_lib.execution.engine.arrow_fit import large_var_types, python_schemas

    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes") == "true"
    assert large_var_types(spark) == large
    schema = source_schema(spark, _source("any"), tolerant=tolerant)
    flows = [FlowSpec.model_validate({"source": "main", "sink": SINK, **f}) for f in FLOWS]
    built = python_schemas(schema, flows, tolerant)
    assert built is not None
    df = spark.createDataFrame([], schema)
    good = df.drop("_error", "_raw") if tolerant else df
    analysed = [partials_frame(good, f.state.aggregate) if f.state else good for f in flows]
    for flow, mine, theirs in zip(flows, built[0], analysed):
        assert mine == theirs.schema, flow.name
    assert built[1] == (bad_records_frame(df).schema if tolerant else None)
    arrow, _ = ArrowEpochs.for_flows(spark, schema, flows, tolerant)
    assert arrow is not None
    assert arrow.schemas == [to_arrow_schema(a.schema, timezone="UTC", prefers_large_types=large) for a in analysed]


def test_python_workers_load_the_installed_pyspark_not_spark_s_zip(spark):
    # The session's daemon (spark.python.daemon.module) puts Spark's source-only zips last, so
    # workers load PySpark with its cached bytecode instead of compiling it from the zip.
    def pyspark_of_worker(_: object) -> list[str]:  # nested: pickled by value, this module is not on the worker
        import pyspark as loaded

        return [loaded.__file__]

    [loaded] = spark.sparkContext.parallelize([0], 1).mapPartitions(pyspark_of_worker).collect()
    assert ".zip" not in loaded and loaded == pyspark.__file__, loaded
