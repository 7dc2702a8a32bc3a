"""The executor-local state cache: decoded state files on the executor's disk, so the owner tasks
of steady epochs neither re-read nor re-decode from S3 the state they rewrite.

An entry holds the rows of one state file (a span's byte range in a pack) as an Arrow IPC file
named by that byte range's SHA-256, the checksum the manifest records: a hit can never be stale,
since other content has another name. Entries live under the executor's Spark local directory
(``SPARK_LOCAL_DIRS``, which Spark hands every Python worker), so the Python workers of one
executor share them and they go when the executor does. An entry is written under a temporary
name and renamed (a killed worker leaves no half entry), read memory-mapped (no copy, and an
entry evicted meanwhile stays readable), and evicted least recently used past ``max_bytes``
(recency is the file's modification time, refreshed on a hit). Losing any of it costs an S3
read: an unreadable entry is a miss.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline_lib.checkpoint.state_files import KEY_GROUP_COLUMN

CACHE_DIR = "pipeline-lib-state"
SUFFIX = ".arrow"
STALE_TEMPORARY_S = 600  # a temporary entry this old was left by a killed worker


@dataclass
class StateCache:
    """Decoded state files by SHA-256 under ``root``, at most ``max_bytes`` of them after a ``trim``."""

    root: Path
    max_bytes: int

    @classmethod
    def in_executor(cls, max_bytes: int) -> StateCache | None:
        """The cache of the executor this Python worker serves (None when disabled by a
        ``max_bytes`` of 0, or outside a Spark worker, where no local directory is given)."""
        local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
        if max_bytes <= 0 or not local_dirs:  # guard: cache-on-at-zero-bound
            return None
        return cls(Path(local_dirs.split(",")[0]) / CACHE_DIR, max_bytes)

    def _path(self, sha256: str) -> Path:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):  # guard: cache-any-name
            raise ValueError(f"not a SHA-256 in hex: {sha256!r}")
        return self.root / f"{sha256}{SUFFIX}"

    def get(self, sha256: str) -> tuple[pa.Table, np.ndarray] | None:
        """The rows and key groups of the state file whose bytes hash to ``sha256``, or None."""
        path = self._path(sha256)
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
            key_groups = table.column(KEY_GROUP_COLUMN).to_numpy()
            os.utime(path)  # recently used: the last to go in a trim  # guard: cache-hit-not-recent
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException, KeyError):  # damaged: a miss, and gone for the next reader
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return table.drop_columns([KEY_GROUP_COLUMN]), key_groups

    def put(self, sha256: str, table: pa.Table, key_groups: np.ndarray) -> None:
        """Keep the rows of the state file whose bytes hash to ``sha256``; a full disk or any
        other failure to write only loses the entry."""
        path = self._path(sha256)
        if path.exists():
            return
        with_groups = table.add_column(
            0, pa.field(KEY_GROUP_COLUMN, pa.int32()), [pa.array(key_groups, type=pa.int32())]
        )
        temporary = self.root / f".{sha256}.{uuid.uuid4().hex}.tmp"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with pa.OSFile(str(temporary), "wb") as sink, pa.ipc.new_file(sink, with_groups.schema) as writer:
                writer.write_table(with_groups)
            os.replace(temporary, path)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink()

    def trim(self) -> None:
        """Evict the least recently used entries until the cache holds at most ``max_bytes``."""
        entries, stale_before = [], time.time_ns() - STALE_TEMPORARY_S * 10**9
        with contextlib.suppress(FileNotFoundError), os.scandir(self.root) as found:
            for entry in found:
                with contextlib.suppress(FileNotFoundError):
                    info = entry.stat()
                    if entry.name.endswith(SUFFIX):
                        entries.append((info.st_mtime_ns, info.st_size, entry.path))
                    # guard: cache-trim-deletes-fresh-temporaries
                    elif entry.name.endswith(".tmp") and info.st_mtime_ns < stale_before:
                        os.unlink(entry.path)
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):  # guard: cache-evicts-newest-first
            if total <= self.max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            total -= size
