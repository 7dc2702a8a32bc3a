"""What a Python worker imports to run an epoch's read task is on epoch 1's critical path: every
worker unpickles its task at once, before it reads a record. The task carries plain values made
of the spec on the driver (engine.worker_epoch), so unpickling and running it loads neither the
spec's pydantic models nor pydantic. (pandas it does load: pyarrow imports it at the first
``pa.array``, whatever that is given, to ask whether it is a pandas object.)"""

from __future__ import annotations

import json
import subprocess
import sys

from pyspark import cloudpickle
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.execution.engine.arrow_fit import python_schemas
from pipeline_lib.execution.engine.flow_partials import FlowInWorker
from pipeline_lib.execution.engine.worker_epoch import EpochInWorker
from pipeline_lib.execution.source.epoch_reader import range_reader
from pipeline_lib.execution.source.record_batcher import METADATA_DDL
from pipeline_lib.execution.source.schema_types import python_schema
from pipeline_lib.execution.source.subtask_start import source_start
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.spec.loader import parse_spec

# Run in a fresh interpreter: the modules a PySpark worker has before its first task (the daemon's
# and the worker's own), then the pickled task, run on a few decoded records as a read would.
WORKER = """
import sys
import pyspark.daemon, pyspark.worker
before = set(sys.modules)
from pyspark import cloudpickle
task = cloudpickle.loads(sys.stdin.buffer.read())
from pipeline_lib.execution.source.kafka_batches import decode_batch
from pipeline_lib.execution.source.record_batcher import RecordBatcher
from pipeline_lib.kafka_adapter import DefaultRecordBatch
reader, flow = task.__self__.reader, task.__self__.flows[0]
batcher = RecordBatcher(reader.schema, reader.format, reader.fields, reader.tolerant, reader.max_record_bytes, "t", 0)
batch = decode_batch(DefaultRecordBatch(bytes.fromhex(sys.argv[1])))
import pyarrow as pa
partials = flow.partials(pa.Table.from_batches([batcher.build([batch])]))
from pipeline_lib.execution.engine.worker_epoch import ipc_pieces
pieces = list(ipc_pieces(partials))
loaded = sorted(set(sys.modules) - before)
print(json.dumps({"rows": partials.num_rows, "pieces": len(pieces), "loaded": loaded}))
""".replace("import sys\n", "import json, sys\n", 1)


def _read_task() -> EpochInWorker:
    """The bench's spend job (JSON payments, sum and count per user), as the driver builds its task."""
    spec = parse_spec(spend_job_spec("spend", "payments", "s3://out/spend", "s3://state/spend", fmt="parquet"))
    source, flows = spec.source.kafka, spec.all_flows()
    schema = python_schema(f"{source.schema_}, {METADATA_DDL}")
    assert schema is not None
    built = python_schemas(schema, flows, False)
    assert built is not None
    reader = range_reader("127.0.0.1:9", source, schema, [[("payments", 0, 0, 3)]], epoch=1)
    return EpochInWorker(
        reader,
        tuple(FlowInWorker.of(f.state.aggregate if f.state else None) for f in flows),
        (None,),
        tuple(to_arrow_schema(s, timezone="UTC") for s in built[0]),
        start=source_start("127.0.0.1:9", "payments", 2, 10.0),
    )


def _batch() -> bytes:
    from tests.unit.test_kafka_batches import build

    values = [json.dumps({"user": u, "amount": a}).encode() for u, a in (("a", 1), ("b", 2), ("a", 3))]
    return build([(i, 1_700_000_000_000, None, v, []) for i, v in enumerate(values)])


def test_a_read_task_loads_no_spec_model_and_no_pydantic_in_its_worker():
    blob = cloudpickle.dumps(_read_task().rdd_partition)
    done = subprocess.run([sys.executable, "-c", WORKER, _batch().hex()], input=blob, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = json.loads(done.stdout)
    assert out["rows"] == 2 and out["pieces"] == 1
    assert "pipeline_lib.execution.engine.worker_epoch" in out["loaded"]
    heavy = [
        m
        for m in out["loaded"]
        if m.split(".")[0] in ("pydantic", "pydantic_core") or m.startswith("pipeline_lib.spec")
    ]
    assert heavy == []


def test_the_workers_window_columns_are_the_specs():
    from pipeline_lib.execution.engine.event_windows import WINDOW_END, WINDOW_START
    from pipeline_lib.spec.window_spec import WINDOW_COLUMNS

    assert (WINDOW_START, WINDOW_END) == WINDOW_COLUMNS
