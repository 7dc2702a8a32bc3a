"""The files sink: one directory per epoch, made visible by its ``_SUCCESS`` marker.

    PATH/epoch=<n>/part-00000-a<attempt>.jsonl ... then PATH/epoch=<n>/_SUCCESS

Readers take an epoch iff its ``_SUCCESS`` exists, and read only the part files it lists. A
replayed epoch reads the same planned input from the same base snapshot, so its output is the
same: if the marker already records this plan's digest, the epoch is not written again.

Part files carry the writing attempt in their name and are never overwritten or deleted while
an epoch is open, and the marker is written by compare-and-swap. So two attempts alive at once
(a zombie and its successor) cannot damage each other's output: the second marker write fails
and that attempt is fenced. Parts of older attempts are removed once a newer attempt committed.
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
from pipeline_lib.errors import FencedError
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

    def _existing(self, epoch: int) -> tuple[SuccessMarker | None, str | None]:
        """The epoch's marker (None if absent or unreadable) and its version token."""
        found = self.store.get_versioned(self.marker_key(epoch))
        if found is None:
            return None, None
        try:
            return SuccessMarker.model_validate_json(found[0]), found[1]
        except ValidationError:
            log.warning("unreadable %s in epoch %d of %s; rewriting the epoch", MARKER, epoch, self.location)
            return None, found[1]

    def _commit(self, epoch: int, files: list[FileRef]) -> SinkCommit:
        return SinkCommit(location=self.location, epoch=epoch, marker=self.marker_key(epoch), files=files)

    def write_epoch(self, epoch: int, digest: str, parts: list[pa.Table], attempt: int) -> SinkCommit:
        existing, version = self._existing(epoch)
        if existing is not None and existing.digest == digest:
            log.info("epoch %d output already committed by an earlier attempt; reusing it", epoch)
            return self._commit(epoch, existing.files)
        prefix = self.epoch_dir(epoch)
        files: list[FileRef] = []
        for i, table in enumerate(parts):
            if table.num_rows == 0:
                continue
            data = encode_part(table, self.format)
            key = f"{prefix}part-{i:05d}-a{attempt}.{self.format}"
            self.store.put(key, data)
            files.append(FileRef(key=key, rows=table.num_rows, bytes=len(data), sha256=sha256_hex(data)))
            fault_point("mid_sink_write", epoch)
        fault_point("after_sink_files", epoch)
        marker = SuccessMarker(epoch=epoch, digest=digest, files=files)
        if self.store.put_if(self.marker_key(epoch), marker.model_dump_json(indent=1).encode(), version) is None:
            raise FencedError(
                f"epoch {epoch} of {self.location} was committed by another attempt while attempt {attempt} "
                "wrote it; this runner is fenced and stops"
            )
        fault_point("after_sink_success", epoch)
        return self._commit(epoch, files)

    def remove_stale_parts(self, commit: SinkCommit, attempt: int) -> None:
        """After ``attempt`` committed ``commit``: delete the epoch's parts that older attempts
        left behind. Parts of newer attempts are never touched (this runner may be the old one)."""
        listed = {f.key for f in commit.files}
        stale = []
        for key in self.store.list(self.epoch_dir(commit.epoch)):
            name = key.rsplit("/", 1)[-1]
            if key in listed or not name.startswith("part-"):
                continue
            writer = name.rsplit("-a", 1)[-1].split(".", 1)[0]
            if not writer.isdigit() or int(writer) < attempt:
                stale.append(key)
        self.store.delete_many(stale)
