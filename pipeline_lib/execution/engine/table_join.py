"""A stream-static join on the Spark SQL path: the epoch's rows joined with the pinned version of
a table (plan.table_pins), read on the executors.

The table becomes a DataFrame whose tasks each read pinned files straight from the store with the
job's S3 settings (pickled into the task, never in Spark conf or the plan), checking each file's
version token or size against the pin: a file changed under a replayed plan fails the epoch
rather than joining other rows. Spark joins it with its own rules: broadcast when the pinned
files are within ``spark.sql.autoBroadcastJoinThreshold`` (Spark reads file sizes the same way),
else a shuffle join, so a large table never passes through the driver. Each Python worker keeps
the files it read, by pinned version, for the next epochs (``_FILES``).
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from pipeline_lib.errors import PipelineError, TransformError
from pipeline_lib.execution.engine.table_pinning import pin_table
from pipeline_lib.plan.table_pins import PinnedFile, TablePin
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.join_spec import JoinSpec
from pipeline_lib.storage import open_store

CACHE_BYTES = 256 * 1024 * 1024  # what one Python worker keeps of joined tables' files
_FILES: OrderedDict[tuple, pa.Table] = OrderedDict()
_LOCK = threading.Lock()


def read_pinned_file(pin: TablePin, file: PinnedFile, settings: ConnectionSettings) -> pa.Table:
    """One pinned file's rows, from this worker's cache or the store; PipelineError naming the
    table and the file if the store holds another version of it than the pin."""
    cache_key = (pin.location, pin.version, file.key, file.size, file.version)
    with _LOCK:
        if cache_key in _FILES:
            _FILES.move_to_end(cache_key)
            return _FILES[cache_key]
    got = open_store(pin.location, settings).get_versioned(file.key)
    data, version = got if got is not None else (b"", None)
    # guard: join-reads-unpinned-version
    if got is None or len(data) != file.size or (file.version is not None and version != file.version):
        raise PipelineError(
            f"join table {pin.location}: file {file.key} is gone or changed since the epoch's plan pinned it "
            f"({file.size} bytes, version {file.version or pin.version}); the epoch cannot join the rows it "
            "joined before (keep a table's files until no plan pins them: write new files, or Delta versions)"
        )
    try:
        table = pq.read_table(io.BytesIO(data))
    except pa.ArrowInvalid as exc:
        raise PipelineError(f"join table {pin.location}: file {file.key} is not Parquet ({exc})") from None
    with _LOCK:
        _FILES[cache_key] = table
        while sum(t.nbytes for t in _FILES.values()) > CACHE_BYTES and len(_FILES) > 1:
            _FILES.popitem(last=False)
    return table


@dataclass(frozen=True)
class PinnedFilesRead:
    """The ``mapInArrow`` function of a pinned table's DataFrame: each input row is a file's index
    in the pin; its rows come out in the frame's schema (a file without a column of it fails,
    naming the file)."""

    pin: TablePin
    settings: ConnectionSettings
    schema: pa.Schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The rows of each file the task's batches name."""
        for batch in batches:
            for index in batch.column(0).to_pylist():
                file = self.pin.files[index]
                table = read_pinned_file(self.pin, file, self.settings)
                missing = [n for n in self.schema.names if n not in table.column_names]
                if missing:
                    raise PipelineError(f"join table {self.pin.location}: file {file.key} has no column {missing}")
                yield from table.select(self.schema.names).cast(self.schema).to_batches()


def table_frame(spark, pin: TablePin, settings: ConnectionSettings) -> DataFrame:
    """The pinned table as a DataFrame read by the executors; its schema is that of the
    smallest file (read on the driver, once per worker cache)."""
    smallest = min(pin.files, key=lambda f: f.size)
    spark_schema = from_arrow_schema(read_pinned_file(pin, smallest, settings).schema)
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    arrow_schema = to_arrow_schema(spark_schema, timezone="UTC", prefers_large_types=large)
    slices = max(1, min(len(pin.files), spark.sparkContext.defaultParallelism))
    indexes = spark.range(0, len(pin.files), 1, slices).select(F.col("id").cast("int").alias("file"))
    return indexes.mapInArrow(PinnedFilesRead(pin, settings, arrow_schema), spark_schema)


@dataclass(frozen=True)
class StaticTables:
    """What a join transform needs: the job's settings and the epoch plan's pins by location
    (None: pin the table now, for analysing a query at start-up, where no rows are joined)."""

    settings: ConnectionSettings
    pins: Mapping[str, TablePin] | None = None

    def pin(self, join: JoinSpec, where: str) -> TablePin:
        """The version this epoch joins."""
        if self.pins is None:
            return pin_table(join, self.settings)
        pin = self.pins.get(join.location)
        if pin is None:
            raise TransformError(f"{where}: the epoch's plan pins no version of join table {join.location}")
        return pin


def join_table(df: DataFrame, join: JoinSpec, tables: StaticTables | None, where: str) -> DataFrame:
    """``df`` joined with the pinned table; a column of both besides ``on`` is refused, naming it."""
    if tables is None:
        raise TransformError(f"{where}: a join needs the job's connection settings here")
    pin = tables.pin(join, where)
    right = table_frame(df.sparkSession, pin, tables.settings)
    clash = sorted((set(df.columns) & set(right.columns)) - set(join.on))
    if clash:
        raise TransformError(
            f"{where}: columns {clash} are in both the rows and join table {join.location}; "
            "select them away before the join"
        )
    threshold = df.sparkSession._jsparkSession.sessionState().conf().autoBroadcastJoinThreshold()
    if 0 <= pin.bytes <= threshold:
        right = F.broadcast(right)
    return df.join(right, on=list(join.on), how=join.how)
