"""What one throughput benchmark run measures, and the parsing of its list-valued options.

One dataclass rather than loose arguments, because ``report.json`` records it whole (every field
but ``stack``) next to the figures it produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.localstack import StackInfo

INCREMENTAL_KINDS = ("key_groups", "users")  # the small incremental runs: see events.incremental_batches


@dataclass
class BenchConfig:
    """Sizes and knobs of one benchmark run, recorded in the report so that numbers can be reproduced."""

    events: int = 1_000_000
    keys: int = 100_000
    per_epoch: int = 100_000
    restore_keys: list[int] = field(default_factory=lambda: [10_000, 100_000, 1_000_000])
    partitions: int = 4
    parallelism: int = 2  # ours: parallelism = local[N]; Structured Streaming: local[N], N shuffle partitions
    incremental_share: float = 0.05
    incremental: tuple[str, ...] = INCREMENTAL_KINDS  # which small incremental runs
    recovery: bool = True
    short_events: int = 50_000  # the short scheduled run's backlog (short_runs.py); 0: not measured
    seed: int = 2026
    out: Path = Path("results/bench")
    broker: str = "kafka"  # of the stack the bench starts: Apache Kafka, or tansu (the embedded default)
    stack: StackInfo | None = None  # use a running stack (tests); otherwise start one and stop it

    def recorded(self) -> dict[str, object]:
        """The settings as report.json records them (paths as text, no stack)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self).items() if k != "stack"}


def parse_keys(text: str) -> list[int]:
    """``10000,100_000`` -> [10000, 100000]; ValueError names a bad item."""
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def parse_kinds(text: str) -> tuple[str, ...]:
    """``key_groups,users`` -> the incremental runs to make (``none``: no run); ValueError names
    an unknown kind."""
    kinds = tuple(x.strip() for x in text.split(",") if x.strip() and x.strip() != "none")
    unknown = sorted(set(kinds) - set(INCREMENTAL_KINDS))
    if unknown:
        raise ValueError(f"unknown incremental kind(s) {unknown}; choose from {INCREMENTAL_KINDS}")
    return kinds
