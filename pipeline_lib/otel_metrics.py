"""Run metrics over OpenTelemetry (OTLP/HTTP), beside StatsD (metrics.py), for a collector that
also receives Airflow's own metrics (``[metrics] otel_on``).

With ``PIPELINE_OTEL_ENDPOINT`` set (the collector's OTLP/HTTP base URL, ``http://host:4318``),
``pipeline-lib run`` records the metrics of metrics.METRICS under ``<prefix>.<metric>``, with the
job, pipeline and phase as attributes rather than in the name (OTLP has attributes, StatsD has
not): counters for counts, gauges, and histograms of milliseconds for timings. They are exported
in the background every ``PIPELINE_OTEL_INTERVAL_MS`` (60 s, Airflow's ``otel_interval_milliseconds``
default) and once more when the run ends, so a collector that is slow or down never holds an
epoch up; the last export waits at most the exporter's timeout.

The OpenTelemetry SDK and its OTLP/HTTP exporter are an extra (``pip install 'pipeline-lib[otel]'``;
Airflow installs them too), imported only when the endpoint is set.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pipeline_lib.errors import PipelineError
from pipeline_lib.metrics import DEFAULT_PREFIX, METRICS

if TYPE_CHECKING:
    from pipeline_lib.execution.runtime.job_runner import JobSummary
    from pipeline_lib.execution.runtime.runner_types import EpochReport

ENV_OTEL_ENDPOINT = "PIPELINE_OTEL_ENDPOINT"
ENV_OTEL_INTERVAL_MS = "PIPELINE_OTEL_INTERVAL_MS"
ENV_OTEL_PREFIX = "PIPELINE_OTEL_PREFIX"
DEFAULT_INTERVAL_MS = 60_000
EXPORT_TIMEOUT_S = 5.0


class OtelRunMetrics:
    """Records a run's metrics and exports them to one OTLP/HTTP collector."""

    def __init__(self, job: str, endpoint: str, interval_ms: int = DEFAULT_INTERVAL_MS, prefix: str = DEFAULT_PREFIX):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource

        exporter = OTLPMetricExporter(endpoint=f"{endpoint.rstrip('/')}/v1/metrics", timeout=EXPORT_TIMEOUT_S)
        self._reader = PeriodicExportingMetricReader(
            exporter, export_interval_millis=interval_ms, export_timeout_millis=EXPORT_TIMEOUT_S * 1000
        )
        # A provider of its own, not the process-wide one: a hook's instrumentation keeps its own.
        self._provider = MeterProvider(
            metric_readers=[self._reader], resource=Resource.create({"service.name": "pipeline-lib", "job": job})
        )
        meter = self._provider.get_meter("pipeline_lib")
        self.job, self._closed = job, False
        self._instruments: dict[str, Any] = {}
        for name, (kind, description) in METRICS.items():
            metric = f"{prefix}.{name.split('.')[0]}"
            if kind == "count":
                self._instruments[name] = meter.create_counter(metric, description=description)
            elif kind == "gauge":
                self._instruments[name] = meter.create_gauge(metric, description=description)
            else:
                self._instruments[name] = meter.create_histogram(metric, unit="ms", description=description)

    @classmethod
    def from_env(cls, job: str, env: Mapping[str, str] | None = None) -> OtelRunMetrics | None:
        """The run's OpenTelemetry metrics when ``PIPELINE_OTEL_ENDPOINT`` is set, else None."""
        env = os.environ if env is None else env
        endpoint = env.get(ENV_OTEL_ENDPOINT, "").strip()
        if not endpoint:
            return None
        try:
            return cls(
                job,
                endpoint,
                int(env.get(ENV_OTEL_INTERVAL_MS, "") or DEFAULT_INTERVAL_MS),
                env.get(ENV_OTEL_PREFIX, "").strip() or DEFAULT_PREFIX,
            )
        except ImportError as exc:
            raise PipelineError(
                f"{ENV_OTEL_ENDPOINT} is set but the OpenTelemetry SDK is not installed "
                f"({exc.name}): pip install 'pipeline-lib[otel]'"
            ) from None

    def _record(self, name: str, value: float, **attributes: str) -> None:
        instrument = self._instruments[name]
        attrs = {"job": self.job, **attributes}
        if hasattr(instrument, "add"):
            instrument.add(value, attrs)
        elif hasattr(instrument, "set"):
            instrument.set(value, attrs)
        else:
            instrument.record(value, attrs)

    def epoch(self, report: EpochReport) -> None:
        """One committed epoch."""
        p = report.pipeline
        self._record("records", report.records, pipeline=p)
        self._record("records_per_second", round(report.records / report.seconds) if report.seconds else 0, pipeline=p)
        self._record("lag", report.lag, pipeline=p)
        self._record("epoch_duration", report.seconds * 1000, pipeline=p)
        for phase, seconds in report.phases.items():
            self._record("phase.<phase>", seconds * 1000, pipeline=p, phase=phase)
        self._record("state_keys", report.keys, pipeline=p)
        self._record("state_bytes", report.state_bytes, pipeline=p)
        self._record("state_bytes_written", report.state_bytes_written, pipeline=p)
        self._record("rows_written", report.rows_written, pipeline=p)
        self._record("bad_records", report.bad_records, pipeline=p)
        self._record("late_records", report.late_records, pipeline=p)
        self._record("parallelism", report.parallelism, pipeline=p)
        if report.scaled_to is not None:
            self._record("autoscale_events", 1, pipeline=p)
        if report.autoscale_capped:
            self._record("autoscale_capped", 1, pipeline=p)

    def run(self, summary: JobSummary) -> None:
        """Once a run ends: each pipeline's restore time and fenced attempts, then the last export."""
        for outcome in summary.pipelines:
            if outcome.restore_seconds is not None:
                self._record("restore_duration", outcome.restore_seconds * 1000, pipeline=outcome.name)
            if outcome.fenced:
                self._record("fenced", 1, pipeline=outcome.name)
        self.close()

    def close(self) -> None:
        """Export what is recorded and stop the background export (idempotent)."""
        if not self._closed:
            self._closed = True
            self._provider.shutdown(timeout_millis=EXPORT_TIMEOUT_S * 1000)
