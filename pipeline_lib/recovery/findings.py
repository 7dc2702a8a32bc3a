"""What ``verify`` reports of each object it checks: a sink's epoch, a table, a snapshot."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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


__all__ = ["DAMAGED", "LOST", "OK", "Finding"]
