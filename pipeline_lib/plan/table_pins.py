"""The version of a joined table that an epoch reads, saved in the epoch's plan.

A replay (after a crash) or a repair reads the plan again, so it joins with the very files the
first run joined with; a table changed since is taken by the next epoch that is planned anew.
Pure data: taking a pin is execution.engine.table_pinning's job, reading one table_join's.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, ConfigDict, Field


class PinnedFile(BaseModel):
    """One data file of the table: its key under the table's location, its size, and for a
    Parquet folder its version token (the S3 ETag; a local file's mtime, size and SHA-256), which
    a read checks. Files of a Delta version are immutable: the version pins them."""

    model_config = ConfigDict(frozen=True)

    key: str
    size: int = Field(ge=0)
    version: str | None = None


class TablePin(BaseModel):
    """A table as one epoch joins it: ``files`` in key order, and a Delta table's ``version``."""

    model_config = ConfigDict(frozen=True)

    location: str
    format: str
    version: int | None = None
    files: list[PinnedFile]

    @property
    def bytes(self) -> int:
        """The files' total size: Spark's rule for broadcasting a side of a join reads this."""
        return sum(f.size for f in self.files)

    def digest(self) -> str:
        """Identifies the rows the pin stands for (a schema cache's key)."""
        return hashlib.sha256(json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        """For logs: the location and version or file count, never a credential."""
        what = f"version {self.version}" if self.version is not None else f"{len(self.files)} files"
        return f"{self.location} ({what}, {self.bytes} bytes)"
