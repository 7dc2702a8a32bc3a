"""The files sink: one directory per epoch, made visible by its ``_SUCCESS`` marker.

    PATH/epoch=<n>/part-00000-a<attempt>.jsonl ... then PATH/epoch=<n>/_SUCCESS

Readers take an epoch iff its ``_SUCCESS`` exists, and read only the part files it lists. A
replayed epoch reads the same planned input from the same base snapshot, so its output is the
same: if the marker already records this plan's digest, the epoch is not written again.

Part files carry the writing attempt in their name and are never overwritten or deleted while
an epoch is open. The marker records the attempt that wrote it and is written by compare-and-swap
from the version read before the parts: an attempt that finds a newer attempt's marker is fenced
at once, and one whose marker changed while it wrote parts loses the swap and is fenced. So a
zombie can never replace the marker of the attempt that fenced it. Clean-up deletes only parts
of older attempts that the marker in place does not list.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import logging
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, ValidationError

from pipeline_lib.checkpoint.manifest import FileRef, Frozen, SinkCommit, sha256_hex
from pipeline_lib.errors import FencedError, NotFound
from pipeline_lib.faults import fault_point
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)
MARKER = "_SUCCESS"


class SuccessMarker(Frozen):
    """An epoch's ``_SUCCESS``: the plan digest, the part files readers may read, and the writing attempt."""

    epoch: int
    digest: str
    files: list[FileRef]
    attempt: int = Field(ge=0)  # the attempt that wrote it

    def writer(self) -> int:
        """The attempt that wrote this marker: a newer one fences every older attempt's writes."""
        return self.attempt


def _writer_of(key: str) -> int | None:
    """The attempt in a part file's name (``part-00003-a7.jsonl`` -> 7), None if it has none."""
    name = key.rsplit("/", 1)[-1]
    if not name.startswith("part-"):
        return None
    writer = name.rsplit("-a", 1)[-1].split(".", 1)[0]
    return int(writer) if writer.isascii() and writer.isdigit() else None


def json_default(value):
    """How a row's value that JSON has no type for is written (the JSON Lines parts, Kafka records)."""
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def encode_part(table: pa.Table, fmt: str) -> bytes:
    """A part file's bytes: zstd Parquet, or JSON Lines (one compact object per row)."""
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        return buf.getvalue()
    lines = (
        json.dumps(row, default=json_default, ensure_ascii=False, separators=(",", ":")) for row in table.to_pylist()
    )
    return "".join(line + "\n" for line in lines).encode("utf-8")


class FilesSink:
    """Writes each epoch's output as part files plus a marker written by compare-and-swap (see above)."""

    def __init__(self, store: ObjectStore, fmt: str):
        self.store = store
        self.format = fmt
        self.location = store.describe()

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        """The folder of ``epoch``'s parts and marker."""
        return f"epoch={epoch}/"

    def marker_key(self, epoch: int) -> str:
        """The key of ``epoch``'s ``_SUCCESS`` marker."""
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

    def _parts_intact(self, marker: SuccessMarker) -> bool:
        """Every part the marker lists is there with its recorded size (a reused marker whose
        part was lost would commit a snapshot that restore refuses)."""
        for ref in marker.files:
            try:
                if self.store.size(ref.key) != ref.bytes:
                    return False
            except NotFound:
                return False
        return True

    def _commit(self, epoch: int, files: list[FileRef]) -> SinkCommit:
        return SinkCommit(location=self.location, epoch=epoch, marker=self.marker_key(epoch), files=files)

    def write_epoch(
        self, epoch: int, digest: str, parts: list[pa.Table], attempt: int, written: Sequence[FileRef] = ()
    ) -> SinkCommit:
        """Write the parts and commit the marker for ``attempt``, listing ``written`` (parts the
        epoch's Spark tasks wrote themselves, see task_parts) before them; an epoch already
        committed with this digest is reused. FencedError if a newer attempt owns the epoch."""
        existing, version = self._existing(epoch)
        if existing is not None and existing.writer() > attempt:  # guard: marker-ignores-newer-attempt
            raise FencedError(
                f"epoch {epoch} of {self.location} was committed by attempt {existing.writer()}, newer than "
                f"attempt {attempt}; this runner is fenced and stops"
            )
        if existing is not None and existing.digest == digest:  # guard: marker-reused-for-any-digest
            if self._parts_intact(existing):  # guard: marker-reused-with-lost-parts
                log.info("epoch %d output already committed by an earlier attempt; reusing it", epoch)
                return self._commit(epoch, existing.files)
            log.warning(
                "epoch %d of %s: a part its %s lists is missing or cut short; writing the epoch again",
                epoch,
                self.location,
                MARKER,
            )
        prefix = self.epoch_dir(epoch)
        files: list[FileRef] = list(written)
        for i, table in enumerate(parts):
            if table.num_rows == 0:
                continue
            data = encode_part(table, self.format)
            key = f"{prefix}part-{i:05d}-a{attempt}.{self.format}"
            self.store.put(key, data)
            files.append(FileRef(key=key, rows=table.num_rows, bytes=len(data), sha256=sha256_hex(data)))
            fault_point("mid_sink_write", epoch)
        fault_point("after_sink_files", epoch)
        marker = SuccessMarker(epoch=epoch, digest=digest, files=files, attempt=attempt)
        # guard: marker-cas-plain-put
        if self.store.put_if(self.marker_key(epoch), marker.model_dump_json(indent=1).encode(), version) is None:
            raise FencedError(
                f"epoch {epoch} of {self.location} was committed by another attempt while attempt {attempt} "
                "wrote it; this runner is fenced and stops"
            )
        fault_point("after_sink_success", epoch)
        return self._commit(epoch, files)

    def committed_epochs(self) -> list[int]:
        """Epochs whose ``_SUCCESS`` marker exists, ascending."""
        found = []
        for key in self.store.list("epoch="):
            head, _, name = key.partition("/")
            if name == MARKER and head[len("epoch=") :].isascii() and head[len("epoch=") :].isdigit():
                found.append(int(head[len("epoch=") :]))
        return sorted(found)

    def retract_all(self, attempt: int, committed_through: int = 0) -> int:
        """Start the output over: every epoch's marker becomes an empty marker of ``attempt``,
        so readers see nothing of an abandoned run, and its parts are deleted. An empty marker
        rather than none, so a zombie of that run still finds a newer attempt's marker and is
        fenced; a marker of a newer attempt fences this one. The epoch after the last one known
        (``committed_through`` or the last marker) gets an empty marker too: a zombie past its
        head check writes at most that epoch, and must find it taken. Returns the epochs
        retracted."""
        existing_epochs = self.committed_epochs()
        epochs = sorted({*existing_epochs, max([committed_through, *existing_epochs]) + 1})
        for epoch in epochs:
            existing, version = self._existing(epoch)
            if existing is not None and existing.writer() > attempt:  # guard: retract-ignores-newer-marker
                raise FencedError(
                    f"epoch {epoch} of {self.location} was committed by attempt {existing.writer()}, "
                    f"newer than attempt {attempt}; this runner is fenced and stops"
                )
            empty = SuccessMarker(epoch=epoch, digest="", files=[], attempt=attempt)
            # guard: retract-marker-plain-put
            if self.store.put_if(self.marker_key(epoch), empty.model_dump_json(indent=1).encode(), version) is None:
                raise FencedError(
                    f"epoch {epoch} of {self.location} changed while attempt {attempt} retracted it; "
                    "this runner is fenced and stops"
                )
            self.remove_stale_parts(self._commit(epoch, []), attempt)
        return len(existing_epochs)

    def remove_stale_parts(self, commit: SinkCommit, attempt: int) -> None:
        """After ``attempt`` committed ``commit``: delete the epoch's parts that older attempts
        left behind, and those of this attempt that the marker does not list (a failed or
        speculative task attempt's, or a whole read's when an earlier marker was reused).
        Parts of newer attempts, and every part that the marker in place lists, are
        never touched (this runner may be the old one); a marker that is neither this attempt's nor
        the one it reused means a newer attempt owns the epoch, and nothing is deleted."""
        current, _ = self._existing(commit.epoch)
        if current is None or current.writer() > attempt:  # guard: stale-parts-ignores-newer-marker
            return
        # guard: stale-parts-ignores-marker-in-place
        listed = {f.key for f in commit.files} | {f.key for f in current.files}
        stale = []
        for key in self.store.list(self.epoch_dir(commit.epoch)):
            if key in listed or not key.rsplit("/", 1)[-1].startswith("part-"):  # guard: stale-parts-deletes-non-parts
                continue
            writer = _writer_of(key)
            # guard: stale-parts-deletes-newer-attempts, stale-parts-keeps-own-orphans
            if writer is None or writer <= attempt:  # this attempt's own unlisted parts: a failed task attempt's
                stale.append(key)
        self.store.delete_many(stale)
