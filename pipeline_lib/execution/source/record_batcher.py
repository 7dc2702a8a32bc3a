"""Records of one Kafka partition (ColumnBatch es) → Arrow record batches of a source's schema.

What a Spark task of the Kafka source hands to Spark (kafka_source.KafkaRangeReader): the user
fields decoded from each value (record_decoding), then the record's metadata, then, for a
tolerant source (on_error dead_letter | skip), why a record is bad and its raw value. A bad
record raises a RecordError naming topic, partition and offset, or becomes an error row.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.types import StringType, StructType

from pipeline_lib.errors import RecordError
from pipeline_lib.execution.source.error_rows import error_row
from pipeline_lib.execution.source.kafka_batches import ColumnBatch
from pipeline_lib.execution.source.record_decoding import (
    BRACKET_FREE_BYTES,
    MAX_EPOCH_SECONDS,
    MIN_EPOCH_SECONDS,
    TIMESTAMP_RANGE,
    FastJsonDecoder,
    StringRecordDecoder,
)

# The record's metadata after its fields (spec.models.METADATA_COLUMNS): where it was read, its
# timestamp (in milliseconds, and as a timestamp, null for a v0 message, which has none), its key
# (see key_encoding) and its headers in order (a key may repeat).
METADATA_DDL = (
    "_topic string, _partition int, _offset long, _timestamp_ms long, _timestamp timestamp, "
    "_key string, _headers array<struct<key: string, value: binary>>"
)
KEY_ENCODINGS = ("utf8", "base64", "none")
ERROR_DDL = "_error string, _raw binary"  # only with on_error: dead_letter | skip
# The record timestamps Spark holds (0001-01-01 to 9999-12-31 UTC), in milliseconds. Kafka keeps
# whatever a producer sets; Spark's own Kafka source fails the query on one whose microseconds
# overflow a long, so one outside this range is a bad record (on_error), never a wrapped time.
MIN_TIMESTAMP_MS = MIN_EPOCH_SECONDS * 1000
MAX_TIMESTAMP_MS = MAX_EPOCH_SECONDS * 1000


class RecordBatcher:
    """Records of one Kafka partition (ColumnBatch es) → Arrow record batches of the reader's schema.

    Gives exactly what PySpark makes of the same records as Python rows (user fields, then the
    metadata of METADATA_DDL, then _error/_raw when tolerant): the same Arrow
    schema (the one the worker checks a batch against), PySpark's own per-type value converters
    for the types that need one, and ``RecordBatch.from_arrays`` over the same Python values,
    without a Python row per record. When no record needs a closer look (all values present,
    short, valid for msgspec), a poll's values are decoded in one pass; otherwise record by record,
    where the first bad one raises or becomes an error row.
    """

    def __init__(
        self,
        schema: StructType,
        fmt: str,
        fields: list[tuple[str, str]],
        tolerant: bool,
        max_record_bytes: int,
        topic: str,
        partition: int,
        key_encoding: str = "utf8",
    ):
        from pyspark.sql.conversion import LocalDataToArrowConversion
        from pyspark.sql.pandas.types import to_arrow_schema

        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        # A string column only ever holds str or None here, for which PySpark's converter is the identity.
        self.converters = [
            None
            if isinstance(f.dataType, StringType)
            else LocalDataToArrowConversion._create_converter(f.dataType, f.nullable, none_on_identity=True)
            for f in schema.fields
        ]
        self.topic, self.partition = topic, partition
        self.tolerant, self.max_record_bytes = tolerant, max_record_bytes
        if key_encoding not in KEY_ENCODINGS:
            raise ValueError(f"key_encoding {key_encoding!r} is not one of {KEY_ENCODINGS}")
        self.key_encoding = key_encoding
        self.headers_type = self.arrow_schema.field("_headers").type
        self.decode_all = None
        if fmt == "json":
            json_decoder = FastJsonDecoder(fields)
            self.decode_all = json_decoder.decode_all
            self.decode = lambda offset, key, value: json_decoder.decode(topic, partition, offset, value)
            self.width, self.needs_keys = len(fields), False
        else:
            string_decoder = StringRecordDecoder()
            self.decode = lambda offset, key, value: string_decoder.decode_kv(topic, partition, offset, key, value)
            self.width, self.needs_keys = 2, True
        # guard: error-row-null-in-not-null-field
        self.error_row = error_row(schema.fields[: self.width])  # what a bad record's fields hold

    def build(self, chunks: Sequence[ColumnBatch]) -> pa.RecordBatch:
        """Raises the first bad record's RecordError unless tolerant (then it is an error row)."""
        topic, partition, limit = self.topic, self.partition, self.max_record_bytes
        chunks = list(chunks) or [ColumnBatch.empty()]
        offsets = np.concatenate([c.offsets for c in chunks])
        stamps = np.concatenate([c.timestamps for c in chunks])
        values = [v for c in chunks for v in c.values()]
        keys = [k for c in chunks for k in c.keys()] if self.needs_keys else [None] * len(values)
        sizes = np.concatenate([c.sizes() for c in chunks])
        batch_errors = [c.error for c in chunks for _ in range(len(c))] if any(c.error for c in chunks) else None
        stamps_held = ((stamps >= MIN_TIMESTAMP_MS) & (stamps < MAX_TIMESTAMP_MS)).all()
        rows = (
            self._all_rows(chunks, values)  # guard: record-timestamp-fast-path-unchecked
            if not (sizes > limit).any() and batch_errors is None and stamps_held
            else None
        )
        errors: list = [None] * len(values)
        raws: list = [None] * len(values)
        if rows is None:  # record by record: the first bad one raises, or becomes an error row
            rows = self._rows_one_by_one(offsets, stamps, keys, values, sizes, errors, raws, batch_errors)
        n = len(offsets)
        record_keys = self._record_keys(chunks, offsets, values, rows, errors, raws)
        columns: list[Any] = self._user_columns(rows, offsets, values, errors, raws)
        columns += [
            pa.repeat(topic, n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            offsets,
            stamps,
            _timestamps(stamps),
            record_keys,
            self._headers(chunks, n),
        ]
        if self.tolerant:
            columns += [self._arrow(len(columns), errors), self._arrow(len(columns) + 1, raws)]
        return pa.RecordBatch.from_arrays(columns, schema=self.arrow_schema)

    def _arrow(self, i: int, column: list) -> pa.Array:
        """Column ``i`` of the schema from Python values, through PySpark's converter for its type."""
        convert = self.converters[i]
        return pa.array(column if convert is None else [convert(v) for v in column], self.arrow_schema.field(i).type)

    def _user_columns(
        self, rows: list[tuple], offsets: np.ndarray, values: list, errors: list, raws: list
    ) -> list[pa.Array]:
        """The schema's own columns. A value PySpark's converter or Arrow refuses (a map where an
        array belongs, an integer past an array<int>'s range, a null in a NOT NULL field...) makes
        its record a bad record naming topic, partition, offset and field, like any value the
        decoder refuses: raised, or (tolerant) an error row; never an exception that fails the read."""
        try:  # guard: batcher-unconvertible-fails-read
            return self._arrays(rows)
        except Exception:  # find the records at fault, one by one
            pass
        empty = self.error_row
        for i, row in enumerate(rows):
            fault = self._unconvertible(row)
            if fault is None:
                continue
            error = RecordError(self.topic, self.partition, int(offsets[i]), fault)
            if not self.tolerant:
                raise error from None
            rows[i] = empty
            if errors[i] is None:
                errors[i], raws[i] = error.reason, values[i]
        return self._arrays(rows)

    def _arrays(self, rows: list[tuple]) -> list[pa.Array]:
        columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(self.width)]
        return [self._arrow(i, column) for i, column in enumerate(columns)]

    def _unconvertible(self, row: tuple) -> str | None:
        """Why a row's value cannot be held by its column (naming the field), or None."""
        for i, v in enumerate(row):
            if v is None and not self.arrow_schema.field(i).nullable:
                return f"field {self.arrow_schema.field(i).name!r} is NOT NULL but the record has no value for it"
            try:
                self._arrow(i, [v])
            except Exception as exc:
                return f"field {self.arrow_schema.field(i).name!r}: {type(exc).__name__}: {exc}"
        return None

    def _record_keys(
        self, chunks: Sequence[ColumnBatch], offsets: np.ndarray, values: list, rows: list, errors: list, raws: list
    ) -> pa.Array:
        """The _key column. Under utf8, a key that is not UTF-8 is a bad record: it raises, or (tolerant)
        its row becomes an error row, unless its value already made it one."""
        if self.key_encoding == "none":
            return pa.nulls(len(offsets), pa.string())
        keys = pa.concat_arrays([_key_bytes(c) for c in chunks]) if chunks else pa.array([], pa.large_binary())
        if self.key_encoding == "base64":
            return pa.array(
                [None if k is None else base64.b64encode(k).decode("ascii") for k in keys.to_pylist()], pa.string()
            )
        try:
            return keys.cast(pa.string())  # checks every key is UTF-8, in one pass
        except pa.ArrowInvalid:
            pass
        decoded: list[str | None] = []
        empty = self.error_row
        for i, key in enumerate(keys.to_pylist()):
            try:
                decoded.append(None if key is None else key.decode("utf-8"))
            except UnicodeDecodeError as exc:
                error = RecordError(
                    self.topic,
                    self.partition,
                    int(offsets[i]),
                    f"key is not UTF-8 ({exc.reason} at byte {exc.start}): set the source's "
                    "key_encoding to base64 (or none) to read binary keys",
                )
                if not self.tolerant:
                    raise error from None
                decoded.append(None)
                if errors[i] is None:
                    rows[i], errors[i], raws[i] = empty, error.reason, values[i]
        return pa.array(decoded, pa.string())

    def _headers(self, chunks: Sequence[ColumnBatch], n: int) -> pa.Array:
        """The _headers column: a list of (key, value) per record; header keys are decoded as UTF-8
        (Kafka's clients write them from strings), an undecodable byte as U+FFFD."""
        if not any(len(c.with_headers()) for c in chunks):  # the common case: no record has headers
            return pa.ListArray.from_arrays(
                pa.array(np.zeros(n + 1, np.int32)), pa.array([], self.headers_type.value_type), type=self.headers_type
            )
        per_record = [h for c in chunks for h in c.headers()]
        return pa.array(
            [[{"key": k.decode("utf-8", "replace"), "value": v} for k, v in headers] for headers in per_record],
            self.headers_type,
        )

    def _all_rows(self, chunks: Sequence[ColumnBatch], values: list) -> list[tuple] | None:
        """Every row in one go when no record needs a closer look, else None."""
        if self.decode_all is None or not all(
            len(c) == 0 or (c.value_lengths.min() >= 0 and c.value_lengths.max() <= BRACKET_FREE_BYTES) for c in chunks
        ):
            return None
        return self.decode_all(values, all(c.data.isascii() for c in chunks))

    def _rows_one_by_one(
        self,
        offsets: np.ndarray,
        stamps: np.ndarray,
        keys: list,
        values: list,
        sizes: np.ndarray,
        errors: list,
        raws: list,
        batch_errors: list[str | None] | None = None,
    ) -> list[tuple]:
        """``batch_errors``: per row, why the batch it stands for could not be decoded (see
        kafka_batches.undecodable), or None for a record."""
        topic, partition, limit, decode = self.topic, self.partition, self.max_record_bytes, self.decode
        tolerant, empty = self.tolerant, self.error_row
        rows = []
        records = zip(offsets.tolist(), stamps.tolist(), keys, values, sizes.tolist())
        for i, (offset, stamp, key, value, size) in enumerate(records):
            try:
                batch_error = batch_errors[i] if batch_errors is not None else None
                if batch_error is not None:
                    raise RecordError(topic, partition, offset, batch_error)
                if not MIN_TIMESTAMP_MS <= stamp < MAX_TIMESTAMP_MS:  # guard: record-timestamp-range-unchecked
                    raise RecordError(
                        topic, partition, offset, f"record timestamp {stamp} ms is out of range ({TIMESTAMP_RANGE})"
                    )
                if size > limit:
                    raise RecordError(
                        topic, partition, offset, f"record of {size} bytes exceeds max_record_bytes {limit}"
                    )
                rows.append(decode(offset, key, value))
            except RecordError as exc:
                if not tolerant:
                    raise
                rows.append(empty)
                errors[i], raws[i] = exc.reason, value
        return rows


def _key_bytes(batch: ColumnBatch) -> pa.Array:
    """The batch's keys as one binary array (null for a null key), gathered with NumPy from the
    shared buffer rather than sliced one by one."""
    lengths = np.maximum(batch.key_lengths, 0)
    offsets = np.zeros(len(batch) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gather = np.repeat(batch.key_starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    data = np.frombuffer(batch.data, np.uint8)[gather]
    valid = pa.py_buffer(np.packbits(batch.key_lengths >= 0, bitorder="little"))  # Arrow's validity bitmap
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(batch),
        [valid, pa.py_buffer(offsets), pa.py_buffer(data)],
        null_count=int((batch.key_lengths < 0).sum()),
    )


def _timestamps(stamps: np.ndarray) -> pa.Array:
    """Milliseconds as Spark's timestamps (microseconds, UTC); a v0 message's NO_TIMESTAMP (-1) is null,
    and so is a timestamp past 9999 (a bad record's: RecordBatcher), never left to wrap round in ``* 1000``."""
    held = (stamps >= 0) & (stamps < MAX_TIMESTAMP_MS)
    # guard: record-timestamp-unheld-shown
    return pa.array(np.where(held, stamps, 0) * 1000, pa.timestamp("us", tz="UTC"), mask=~held)
