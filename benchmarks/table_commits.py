"""The table sinks' driver step per epoch, Iceberg against Delta, on the same epochs of one
running aggregate (an upsert of the keys each epoch changed) and of one stateless flow (an append
of the executors' parts), on local tables: the commit only, no Spark, no broker.

    pipeline-lib bench tables [--epochs 20] [--keys 100000] [--changed 2000] [--parts 4]

Spark Structured Streaming writing Iceberg is not compared: no iceberg-spark-runtime jar for
Spark 4.x is among the packages this project installs from (see docs/iceberg.md). Printed: the
median seconds per epoch of each sink and mode, their ratio, and whether both tables end equal
to the plain-Python answer. The upsert runs a second Iceberg table as well, ``iceberg-driver``:
one created without the bucket layout (as tables of earlier releases were), which the sink still
rewrites with pyiceberg on the driver; the Iceberg sink's own tables are rewritten by merge tasks
(in process here, as the Delta sink's, see sink/iceberg_merge.py).
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_sink import DeltaSink
from pipeline_lib.sink.files_sink import FilesSink
from pipeline_lib.sink.iceberg_catalog import file_uri
from pipeline_lib.sink.iceberg_sink import TABLE_PROPERTIES, IcebergSink
from pipeline_lib.spec.iceberg_spec import IcebergSinkSpec
from pipeline_lib.storage import open_store

Sink = DeltaSink | IcebergSink


def _sinks(root: Path, mode: str) -> dict[str, Sink]:
    settings = ConnectionSettings()
    key = ("user",) if mode == "upsert" else ()
    delta_path = f"file://{root}/{mode}/delta"
    delta = DeltaSink(
        FilesSink(open_store(f"{delta_path}/_pipeline_parts", settings), "parquet"),
        delta_path,
        settings,
        "bench/main/f",
        mode,  # type: ignore[arg-type]
        key,
    )
    spec = IcebergSinkSpec.model_validate(
        {"table": f"bench.{mode}", "catalog": {"uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}/wh"}}
    )
    staging = FilesSink(open_store(spec.parts_location, settings), "parquet")
    iceberg = IcebergSink(staging, spec, settings, "bench/main/f", mode, key)  # type: ignore[arg-type]
    if mode != "upsert":
        return {"delta": delta, "iceberg": iceberg}
    old = IcebergSinkSpec.model_validate({**spec.model_dump(), "table": "bench.upsert_driver"})
    old_staging = FilesSink(open_store(old.parts_location, settings), "parquet")
    driver = IcebergSink(old_staging, old, settings, "bench/main/f", mode, key)  # type: ignore[arg-type]
    driver.catalog.create_namespace_if_not_exists("bench")
    schema = pa.schema([("user", pa.string()), ("total", pa.int64())])
    driver.catalog.create_table(old.table, schema, location=file_uri(old.location), properties=TABLE_PROPERTIES)
    return {"delta": delta, "iceberg": iceberg, "iceberg-driver": driver}


def _epoch(rng: random.Random, keys: int, changed: int, parts: int, epoch: int) -> list[pa.Table]:
    users = rng.sample(range(keys), changed)
    size = -(-changed // parts)
    return [
        pa.table(
            {
                "user": pa.array([f"u{u:07d}" for u in users[i : i + size]], pa.string()),
                "total": pa.array([u * epoch for u in users[i : i + size]], pa.int64()),
            }
        )
        for i in range(0, changed, size)
    ]


def _rows(name: str, sink: Sink) -> list[tuple]:
    if name == "delta":
        table = DeltaTable(sink.uri).to_pyarrow_table()  # type: ignore[union-attr]
    else:
        opened = sink.open()
        assert opened is not None
        table = opened.scan().to_arrow()  # type: ignore[union-attr]
    return sorted(zip(table.column("user").to_pylist(), table.column("total").to_pylist(), strict=True))


def tables_bench(epochs: int, keys: int, changed: int, parts: int) -> int:
    """Run both sinks over the same epochs; print the medians and the ratio. 0 when equal."""
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-tables-") as tmp:
        for mode in ("upsert", "append"):
            sinks = _sinks(Path(tmp), mode)
            seconds: dict[str, list[float]] = {name: [] for name in sinks}
            want: dict[str, int] = {}
            appended: list[tuple] = []
            for epoch in range(1, epochs + 1):
                data = _epoch(random.Random(epoch), keys, changed, parts, epoch)
                for part in data:
                    for u, t in zip(part.column("user").to_pylist(), part.column("total").to_pylist(), strict=True):
                        want[u] = t
                        appended.append((u, t))
                for name, sink in sinks.items():
                    start = time.perf_counter()
                    sink.write_epoch(epoch, f"d{epoch}", data, attempt=1)
                    seconds[name].append(time.perf_counter() - start)
            expected = sorted(want.items()) if mode == "upsert" else sorted(appended)
            medians = {name: statistics.median(s) for name, s in seconds.items()}
            equal = all(_rows(name, sink) == expected for name, sink in sinks.items())
            ok &= equal
            print(
                f"{mode}: {epochs} epochs of {changed} rows in {parts} parts (keys {keys}); median s/epoch "
                f"iceberg {medians['iceberg']:.3f}, delta {medians['delta']:.3f}, "
                f"iceberg/delta {medians['iceberg'] / medians['delta']:.2f}; all tables exact: {equal}"
            )
            if "iceberg-driver" in medians:
                print(
                    f"{mode}: iceberg with the rewrite on the driver {medians['iceberg-driver']:.3f} s/epoch, "
                    f"driver/merge tasks {medians['iceberg-driver'] / medians['iceberg']:.2f}"
                )
    return 0 if ok else 1
