"""The CLI's stack commands (`pipeline-lib stack up|status|env|down`) as a user calls them: a
stack of the test's own, started and stopped by the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import run_cli


def test_stack_commands_as_a_user_calls_them(tmp_path, stack_env):
    data = tmp_path / "stack"
    up = run_cli(["stack", "up", "--dir", str(data), "--broker-storage", "memory"], stack_env, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        assert set(exports) == {
            "PIPELINE_KAFKA_BOOTSTRAP",
            "PIPELINE_S3_ENDPOINT",
            "PIPELINE_S3_ACCESS_KEY",
            "PIPELINE_S3_SECRET_KEY",
        }
        assert exports["PIPELINE_KAFKA_BOOTSTRAP"].startswith("127.0.0.1:")
        status = json.loads(run_cli(["stack", "status", "--dir", str(data)], stack_env).stdout)
        assert status["broker"]["alive"] and status["s3"]["alive"]
        assert exports["PIPELINE_S3_SECRET_KEY"] not in json.dumps(status)
        assert run_cli(["stack", "env", "--dir", str(data)], stack_env).stdout == up.stdout
    finally:
        down = run_cli(["stack", "down", "--dir", str(data)], stack_env, timeout=120)
    assert down.returncode == 0 and "stack stopped" in down.stderr
    status = json.loads(run_cli(["stack", "status", "--dir", str(data)], stack_env).stdout)
    assert not status["running"]


def test_a_stack_on_apache_kafka_starts_and_stops_by_pid(tmp_path, stack_env):
    """`stack up --broker kafka`: the real broker in place of Tansu (the benchmark smoke test runs
    every engine on such a stack)."""
    data, broker_pid = tmp_path / "stack", None
    up = run_cli(["stack", "up", "--dir", str(data), "--broker", "kafka"], stack_env, timeout=300)
    try:
        assert up.returncode == 0, up.stderr
        assert "kafka broker pid" in up.stderr
        status = json.loads(run_cli(["stack", "status", "--dir", str(data)], stack_env).stdout)
        assert status["broker"]["kind"] == "kafka" and status["broker"]["alive"] and status["s3"]["alive"]
        broker_pid = status["broker"]["pid"]
        assert "kafka.Kafka" in Path(f"/proc/{broker_pid}/cmdline").read_bytes().decode().replace("\0", " ")
        exports = dict(line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines())
        assert exports["PIPELINE_KAFKA_BOOTSTRAP"] == status["broker"]["bootstrap"]
        refused = run_cli(["stack", "up", "--dir", str(tmp_path / "other"), "--broker", "redpanda"], stack_env)
        assert refused.returncode != 0 and "unknown broker 'redpanda'; choose one of tansu, kafka" in refused.stderr
    finally:
        down = run_cli(["stack", "down", "--dir", str(data)], stack_env, timeout=120)
    assert down.returncode == 0 and "stack stopped" in down.stderr
    assert broker_pid is not None and _gone(broker_pid)


def _gone(pid: int) -> bool:
    """No such process, or a zombie its new parent has not reaped yet (the CLI that started it exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
