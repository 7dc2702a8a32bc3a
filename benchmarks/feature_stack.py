"""The embedded stack a feature benchmark runs both engines on (benchmarks/windows.py, joins.py,
process_bench.py, stream_joins.py): one topic of events, our job timed to its end, then Spark's
anchor on the same topic, and the stack stopped whatever happens."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.anchor_run import run_anchor
from benchmarks.delta_steady import run_ours
from benchmarks.our_job import child_env
from benchmarks.restore_completed import timed_run
from pipeline_lib.localstack import StackInfo, start_stack, stop_stack
from pipeline_lib.samples import create_topic, produce_json
from pipeline_lib.settings import ConnectionSettings

PARTITIONS = 2  # every feature benchmark's topic: both engines read it with local[2]


@dataclass(frozen=True)
class BenchStack:
    """A started stack: its folder, its servers, the children's environment and the settings
    that open its buckets."""

    root: Path
    info: StackInfo
    env: dict[str, str]
    settings: ConnectionSettings

    def topic(self, name: str, events: list[dict], key_field: str | None = "user") -> None:
        """Create ``name`` and produce ``events`` to it as JSON."""
        create_topic(self.info.kafka_bootstrap, name, PARTITIONS)
        produce_json(self.info.kafka_bootstrap, name, events, key_field=key_field)

    def run_ours(self, job: dict[str, Any]) -> float:
        """Whole-process seconds of `pipeline-lib run --until-caught-up` of ``job``."""
        return timed_run(self._spec(job), self.env, "--until-caught-up")

    def run_ours_by_epoch(self, job: dict[str, Any]) -> tuple[float, list[dict]]:
        """``run_ours`` with ``--timings``: its seconds and each epoch's records and seconds
        (benchmarks/delta_steady.py), for a steady rate beside the end-to-end one."""
        return run_ours(self._spec(job), self.env)

    def _spec(self, job: dict[str, Any]) -> Path:
        spec = self.root / "job.yaml"
        spec.write_text(yaml.safe_dump(job))
        return spec

    def run_spark(
        self, module: str, name: str, topic: str, per_epoch: int, parallelism: int, extra: tuple[str, ...] = ()
    ) -> float:
        """Whole-process seconds of Spark's anchor ``benchmarks.<module>`` (benchmarks/anchor_run.py)."""
        return run_anchor(
            module, name, self.info.kafka_bootstrap, topic, per_epoch, parallelism, self.root, self.env, extra
        )


@contextmanager
def feature_stack(prefix: str) -> Iterator[BenchStack]:
    """An embedded stack (broker in memory) in a temporary folder, stopped on the way out."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root = Path(tmp)
        info = start_stack(root / "stack", broker_storage="memory")
        try:
            env = child_env(info)
            yield BenchStack(root, info, env, ConnectionSettings.from_env(env))
        finally:
            stop_stack(root / "stack")
