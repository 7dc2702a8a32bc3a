"""Run metrics over StatsD, the protocol Airflow itself emits its metrics with.

With ``PIPELINE_STATSD_HOST`` set, ``pipeline-lib run`` sends per pipeline and epoch the records,
records per second, lag, the epoch's duration and phases, the state's keys and bytes (whole and
written this epoch), rows written and bad records; per run, each pipeline's restore time and a
count of fenced attempts. Names are dotted like Airflow's (StatsD has no tags):
``<prefix>.<job>.<pipeline>.<metric>``. UDP, fire and forget: a metrics server that is down never
slows or fails a run. The ``statsd`` package (the client Airflow uses) does the sending.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from statsd import StatsClient

if TYPE_CHECKING:
    from pipeline_lib.execution.runtime.job_runner import JobSummary
    from pipeline_lib.execution.runtime.runner_types import EpochReport

ENV_STATSD_HOST = "PIPELINE_STATSD_HOST"
ENV_STATSD_PORT = "PIPELINE_STATSD_PORT"
ENV_STATSD_PREFIX = "PIPELINE_STATSD_PREFIX"
DEFAULT_PREFIX = "pipeline_lib"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # StatsD separates with '.', ':', '|' and '@'

# The metrics, for the docs and the test: name -> (StatsD type, what it is).
METRICS = {
    "records": ("count", "records read by a committed epoch"),
    "records_per_second": ("gauge", "records of the epoch over its wall time"),
    "lag": ("gauge", "records waiting in the topic after the epoch"),
    "epoch_duration": ("timing", "the epoch's wall time, ms"),
    "phase.<phase>": ("timing", "each phase of the epoch (spark, merge, sink, state, commit, cleanup), ms"),
    "state_keys": ("gauge", "keys in the keyed state after the epoch"),
    "state_bytes": ("gauge", "bytes of every state file the epoch's snapshot references"),
    "state_bytes_written": ("count", "state bytes the epoch wrote (its incremental snapshot)"),
    "rows_written": ("count", "sink rows the epoch wrote"),
    "bad_records": ("count", "bad records the epoch dead-lettered or skipped"),
    "late_records": (
        "count",
        "records the epoch dropped as late: their event-time windows were closed, or a stream "
        "join's rows behind its watermark or without an event time",
    ),
    "restore_duration": ("timing", "restoring the pipeline's snapshot at start-up, ms"),
    "fenced": ("count", "attempts that stopped because a newer one owns the pipeline"),
    "parallelism": ("gauge", "the subtasks the epoch ran with (autoscale changes it between epochs)"),
    "autoscale_events": ("count", "changes of the parallelism the autoscaler decided after the epoch"),
    "autoscale_capped": ("count", "scale-ups that stayed or fell short because Spark offered no more cores"),
}


def _name(part: str) -> str:
    return _UNSAFE.sub("_", part)


class RunMetrics:
    """Sends a run's metrics to one StatsD server."""

    def __init__(self, job: str, host: str, port: int = 8125, prefix: str = DEFAULT_PREFIX):
        self._client = StatsClient(host, port, prefix=f"{prefix}.{_name(job)}")

    @classmethod
    def from_env(cls, job: str, env: Mapping[str, str] | None = None) -> RunMetrics | None:
        """The run's metrics when ``PIPELINE_STATSD_HOST`` is set, else None."""
        env = os.environ if env is None else env
        host = env.get(ENV_STATSD_HOST, "").strip()
        if not host:
            return None
        return cls(
            job,
            host,
            int(env.get(ENV_STATSD_PORT, "") or 8125),
            env.get(ENV_STATSD_PREFIX, "").strip() or DEFAULT_PREFIX,
        )

    def epoch(self, report: EpochReport) -> None:
        """One committed epoch."""
        p = _name(report.pipeline)
        with self._client.pipeline() as batch:  # one UDP packet (or a few) per epoch
            batch.incr(f"{p}.records", report.records)
            batch.gauge(f"{p}.records_per_second", round(report.records / report.seconds) if report.seconds else 0)
            batch.gauge(f"{p}.lag", report.lag)
            batch.timing(f"{p}.epoch_duration", report.seconds * 1000)
            for phase, seconds in report.phases.items():
                batch.timing(f"{p}.phase.{_name(phase)}", seconds * 1000)
            batch.gauge(f"{p}.state_keys", report.keys)
            batch.gauge(f"{p}.state_bytes", report.state_bytes)
            batch.incr(f"{p}.state_bytes_written", report.state_bytes_written)
            batch.incr(f"{p}.rows_written", report.rows_written)
            batch.incr(f"{p}.bad_records", report.bad_records)
            batch.incr(f"{p}.late_records", report.late_records)
            batch.gauge(f"{p}.parallelism", report.parallelism)
            if report.scaled_to is not None:
                batch.incr(f"{p}.autoscale_events")
            if report.autoscale_capped:
                batch.incr(f"{p}.autoscale_capped")

    def run(self, summary: JobSummary) -> None:
        """Once a run ends: each pipeline's restore time and fenced attempts."""
        with self._client.pipeline() as batch:
            for outcome in summary.pipelines:
                p = _name(outcome.name)
                if outcome.restore_seconds is not None:
                    batch.timing(f"{p}.restore_duration", outcome.restore_seconds * 1000)
                if outcome.fenced:
                    batch.incr(f"{p}.fenced")
