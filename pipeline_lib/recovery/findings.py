"""What ``verify`` reports of each object it checks: a sink's epoch, a table, a snapshot."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pipeline_lib.checkpoint.manifest import FileRef, sha256_hex
from pipeline_lib.errors import NotFound
from pipeline_lib.storage import ObjectStore

OK, LOST, DAMAGED = "ok", "LOST", "DAMAGED"


@dataclass(frozen=True)
class Finding:
    """One checked object: a sink's epoch, or a retained snapshot; ``detail`` says what is wrong."""

    pipeline: str
    what: str  # "flow <name>", "dead letters", "snapshot"
    epoch: int
    status: str  # ok | LOST | DAMAGED
    detail: str = ""
    snapshot: str | None = None

    def to_dict(self) -> dict:
        """For ``--json``."""
        return asdict(self)


def check_part(store: ObjectStore, ref: FileRef) -> tuple[str, str] | None:
    """(status, detail) of a damaged or lost part, None when it is intact."""
    try:
        data = store.get(ref.key)
    except NotFound:
        return LOST, f"part {ref.key} is missing"
    if len(data) != ref.bytes:
        return DAMAGED, f"part {ref.key} has {len(data)} bytes, its marker says {ref.bytes}"
    if sha256_hex(data) != ref.sha256:
        return DAMAGED, f"part {ref.key} does not match its checksum"
    return None


__all__ = ["DAMAGED", "LOST", "OK", "Finding", "check_part"]
