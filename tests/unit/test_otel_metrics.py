"""Run metrics over OpenTelemetry, received by a real OTLP/HTTP receiver on 127.0.0.1 that parses
each export with opentelemetry-proto, as a collector does: names, kinds, attributes and values."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.runtime.job_runner import JobSummary, PipelineOutcome
from pipeline_lib.metrics import METRICS
from tests.unit.test_metrics import REPORT

pytestmark = pytest.mark.unit
pytest.importorskip("opentelemetry.sdk.metrics")
metrics_service = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")


@pytest.fixture
def collector():
    """An OTLP/HTTP receiver: every POST to /v1/metrics, parsed, in ``server.requests``."""
    requests: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = metrics_service.ExportMetricsServiceRequest()
            request.ParseFromString(body)
            requests.append((self.path, self.headers["Content-Type"], request))
            answer = metrics_service.ExportMetricsServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.requests = requests
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def points(requests) -> dict[tuple[str, tuple], tuple[str, float]]:
    """(metric, sorted attributes) -> (kind, value: a sum's or gauge's value, a histogram's sum)."""
    found = {}
    for _path, _type, request in requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        attrs = tuple(sorted((a.key, a.value.string_value) for a in point.attributes))
                        value = (
                            point.sum
                            if kind == "histogram"
                            else (point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)
                        )
                        found[(metric.name, attrs)] = (kind, value)
    return found


def test_a_run_s_metrics_reach_an_otlp_collector_with_attributes(collector):
    from pipeline_lib.otel_metrics import OtelRunMetrics

    endpoint = f"http://127.0.0.1:{collector.server_address[1]}"
    metrics = OtelRunMetrics.from_env(
        "spend per user", {"PIPELINE_OTEL_ENDPOINT": endpoint, "PIPELINE_OTEL_INTERVAL_MS": "3600000"}
    )
    assert metrics is not None
    metrics.epoch(REPORT)
    assert collector.requests == []  # exported in the background or at the end, never inside an epoch
    metrics.run(
        JobSummary(
            "spend per user",
            [
                PipelineOutcome("main", "RAN", attempt=2, restored_from="0000000003-a1", restore_seconds=1.5),
                PipelineOutcome("refunds", "FAILED", attempt=4, reason="fenced", fenced=True),
            ],
        )
    )

    assert {(path, kind) for path, kind, _ in collector.requests} == {("/v1/metrics", "application/x-protobuf")}
    resource = {a.key: a.value.string_value for a in collector.requests[0][2].resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "pipeline-lib" and resource["job"] == "spend per user"
    main = (("job", "spend per user"), ("pipeline", "main"))

    def phase(name: str) -> tuple:
        return tuple(sorted((*main, ("phase", name))))

    got = points(collector.requests)
    assert got == {
        ("pipeline_lib.records", main): ("sum", 20_000),
        ("pipeline_lib.records_per_second", main): ("gauge", 40_000),
        ("pipeline_lib.lag", main): ("gauge", 60_000),
        ("pipeline_lib.epoch_duration", main): ("histogram", 500.0),
        ("pipeline_lib.phase", phase("spark")): ("histogram", 250.0),
        ("pipeline_lib.phase", phase("commit")): ("histogram", 12.5),
        ("pipeline_lib.state_keys", main): ("gauge", 5_000),
        ("pipeline_lib.state_bytes", main): ("gauge", 90_000),
        ("pipeline_lib.state_bytes_written", main): ("sum", 4_500),
        ("pipeline_lib.rows_written", main): ("sum", 4_980),
        ("pipeline_lib.bad_records", main): ("sum", 2),
        ("pipeline_lib.late_records", main): ("sum", 0),
        ("pipeline_lib.parallelism", main): ("gauge", 2),
        ("pipeline_lib.autoscale_events", main): ("sum", 1),
        ("pipeline_lib.autoscale_capped", main): ("sum", 1),
        ("pipeline_lib.restore_duration", main): ("histogram", 1500.0),
        ("pipeline_lib.fenced", (("job", "spend per user"), ("pipeline", "refunds"))): ("sum", 1),
    }
    assert {name.split(".")[1] for name, _ in got} == {name.split(".")[0] for name in METRICS}
    metrics.close()  # again: nothing more, no error
    assert len(collector.requests) == 1


def test_a_collector_that_is_down_does_not_fail_the_run(collector):
    from pipeline_lib.otel_metrics import EXPORT_TIMEOUT_S, OtelRunMetrics

    port = collector.server_address[1]
    collector.shutdown()
    collector.server_close()  # nothing listens there any more
    metrics = OtelRunMetrics("job", f"http://127.0.0.1:{port}", interval_ms=3_600_000)
    started = time.monotonic()
    metrics.epoch(REPORT)
    assert time.monotonic() - started < 0.5  # an epoch never waits for the collector
    metrics.run(JobSummary("job", []))  # logs the failed export, raises nothing
    assert time.monotonic() - started < EXPORT_TIMEOUT_S + 2  # the last export gives up in its timeout


def test_without_an_endpoint_there_are_no_otel_metrics():
    from pipeline_lib.otel_metrics import OtelRunMetrics

    assert OtelRunMetrics.from_env("job", {"PIPELINE_OTEL_INTERVAL_MS": "1000"}) is None


def test_an_endpoint_without_the_sdk_is_a_clear_error(monkeypatch):
    import sys

    from pipeline_lib.otel_metrics import OtelRunMetrics

    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.metrics", None)  # as if the extra were not installed
    with pytest.raises(PipelineError, match=r"PIPELINE_OTEL_ENDPOINT is set .* pip install 'pipeline-lib\[otel\]'"):
        OtelRunMetrics.from_env("job", {"PIPELINE_OTEL_ENDPOINT": "http://127.0.0.1:4318"})
