"""What a run imports before it starts Spark is on every run's start-up: a library only some
sinks need loads when a spec names such a sink, not with the runner (sink.sinks)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
import pipeline_lib.api.run, pipeline_lib.cli, pipeline_lib.execution.runtime.job_runner
from pipeline_lib.sink.sinks import flow_sink
print(",".join(sorted(m for m in ("pyiceberg", "confluent_kafka", "fastavro") if m in sys.modules)) or "none")
"""


def test_the_runner_imports_neither_pyiceberg_nor_the_kafka_sink_s_clients_for_a_job_without_such_sinks():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "none"
