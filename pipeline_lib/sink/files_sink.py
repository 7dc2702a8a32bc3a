"""The files sink: one directory per epoch, made visible by its ``_SUCCESS`` marker.

    PATH/epoch=<n>/part-00000.jsonl ... then PATH/epoch=<n>/_SUCCESS

Readers take an epoch iff its ``_SUCCESS`` exists. A replayed epoch reads the same planned
input from the same base snapshot, so its output is the same; if the marker already records
this plan's digest the epoch is not written again, otherwise the old directory is cleared
(marker first) and rewritten.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from pipeline_lib.checkpoint.manifest import FileRef, Frozen, SinkCommit, sha256_hex
from pipeline_lib.errors import NotFound
from pipeline_lib.faults import fault_point
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
MARKER = "_SUCCESS"


class SuccessMarker(Frozen):
    epoch: int
    digest: str
    files: list[FileRef]


def _json_default(value):
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def encode_part(table: pa.Table, fmt: str) -> bytes:
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()
    lines = (json.dumps(row, default=_json_default, ensure_ascii=False, separators=(",", ":")) for row in table.to_pylist())
    return "".join(line + "\n" for line in lines).encode("utf-8")


class FilesSink:
    def __init__(self, store: ObjectStore, fmt: str):
        self.store = store
        self.format = fmt
        self.location = store.describe()

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        return f"epoch={epoch}/"

    def marker_key(self, epoch: int) -> str:
        return f"{self.epoch_dir(epoch)}{MARKER}"

    def _existing(self, epoch: int) -> SuccessMarker | None:
        try:
            return SuccessMarker.model_validate_json(self.store.get(self.marker_key(epoch)))
        except NotFound:
            return None
        except ValidationError:
            log.warning("unreadable %s in epoch %d of %s; rewriting the epoch", MARKER, epoch, self.location)
            return None

    def _commit(self, epoch: int, files: list[FileRef]) -> SinkCommit:
        return SinkCommit(location=self.location, epoch=epoch, marker=self.marker_key(epoch), files=files)

    def write_epoch(self, epoch: int, digest: str, parts: list[pa.Table]) -> SinkCommit:
        existing = self._existing(epoch)
        if existing is not None and existing.digest == digest:
            log.info("epoch %d output already committed by an earlier attempt; reusing it", epoch)
            return self._commit(epoch, existing.files)
        prefix = self.epoch_dir(epoch)
        self.store.delete(self.marker_key(epoch))  # hide the old epoch before touching its parts
        self.store.delete_many(self.store.list(prefix))
        files: list[FileRef] = []
        for i, table in enumerate(parts):
            if table.num_rows == 0:
                continue
            data = encode_part(table, self.format)
            key = f"{prefix}part-{i:05d}.{self.format}"
            self.store.put(key, data)
            files.append(FileRef(key=key, rows=table.num_rows, bytes=len(data), sha256=sha256_hex(data)))
            fault_point("mid_sink_write", epoch)
        fault_point("after_sink_files", epoch)
        marker = SuccessMarker(epoch=epoch, digest=digest, files=files)
        self.store.put(self.marker_key(epoch), marker.model_dump_json(indent=1).encode())
        fault_point("after_sink_success", epoch)
        return self._commit(epoch, files)
