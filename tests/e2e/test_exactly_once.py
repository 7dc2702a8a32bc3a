"""Exactly-once under SIGKILL: the real `pipeline-lib run`, real broker, S3 server and Spark.

Each test kills the run's whole process group at one point of an epoch, runs it again, and
checks the final table against a plain-Python computation over the produced events, then every
epoch's committed output against the records read back from Kafka (tests/changelog.py): nearly
every key is rewritten every epoch, so the final table alone would hide a wrong crashed epoch.
"""

from __future__ import annotations

import pytest

from benchmarks.our_job import parse_epoch_line
from pipeline_lib.samples import spend_per_user
from tests.changelog import assert_every_epoch_exact
from tests.support import result_table, run_cli, spend_spec, write_spec

# 24k events at 4k per epoch = 6 epochs; kill during epoch 3. `make test` runs three points (in
# the read, mid-snapshot, after the head move); the others (marked full) are crashed at by other
# tests too (two crashes in a row, fencing, crash shapes), and all eight run
# in `make full`.
KILL_POINTS = [
    "during_read@3",
    pytest.param("after_read@3", marks=pytest.mark.full),
    pytest.param("mid_sink_write@3", marks=pytest.mark.full),
    pytest.param("after_sink_files@3", marks=pytest.mark.full),  # fencing and crash_shapes crash there too
    pytest.param("after_sink_success@3", marks=pytest.mark.full),
    "mid_snapshot_write@3",
    pytest.param("after_manifest@3", marks=pytest.mark.full),
    "after_head_move@3",
]


def _every_epoch_exact(stack_env, local_stack, locations, bootstrap: str | None = None) -> int:
    name, sink, store = locations
    return len(assert_every_epoch_exact(stack_env, name, sink, store, bootstrap or local_stack.kafka_bootstrap))


def _kill_and_restore(
    stack_env,
    local_stack,
    tmp_path,
    payments,
    locations,
    fault: str,
    extra: dict | None = None,
    bootstrap: str | None = None,
):
    """``bootstrap``: another broker than the stack's (the real Apache Kafka), holding ``payments`` too."""
    topic, events = payments
    if bootstrap is not None:
        stack_env = {**stack_env, "PIPELINE_KAFKA_BOOTSTRAP": bootstrap}
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, extra=extra))
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(spec), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    owners = bool(extra and extra.get("keyed_state") == "owners")
    restored = run_cli(["run", str(spec), "--until-caught-up", *(["--timings"] if owners else [])], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    # exactness first, every epoch against plain Python: on the owner path a state cache serving
    # a stale span shows as wrong aggregates here, whatever the counters below say
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert _every_epoch_exact(stack_env, local_stack, locations, bootstrap) == 6
    if owners:
        assert "with keyed state on owner tasks" in crashed.stderr + restored.stderr
        reads = [
            (e["state_files_cached"], e["state_files_fetched"])
            for e in map(parse_epoch_line, restored.stderr.splitlines())
            if e is not None and "state_files_cached" in e
        ]
        # the restore's verification job filled the executor cache, so its first epoch reads no state
        # from S3; the next find what the epoch before wrote there
        assert len(reads) > 1 and reads[0] == (reads[0][0], 0) and reads[0][0] > 0, reads
        assert all(cached > 0 for cached, _ in reads[1:]), reads
        assert "read 0 bytes of state on the driver" in restored.stderr
    return restored


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize("fault", KILL_POINTS)
def test_sigkill_at_each_point_then_restore_is_exact(stack_env, local_stack, tmp_path, payments, locations, fault):
    _kill_and_restore(stack_env, local_stack, tmp_path, payments, locations, fault)


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "fault", [pytest.param("after_sink_success@3", marks=pytest.mark.full), "mid_snapshot_write@3"]
)
def test_keyed_state_on_owner_tasks_survives_a_sigkill_exactly(
    stack_env, local_stack, tmp_path, payments, locations, fault
):
    """The same on the owner path, which local mode takes only when asked (keyed_state: owners):
    owner tasks wrote the epoch's sink parts and state packs; the driver committed their references.
    (Every test of tests/cluster takes the owner path too: `auto` on a cluster.)"""
    _kill_and_restore(stack_env, local_stack, tmp_path, payments, locations, fault, extra={"keyed_state": "owners"})


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "fault",
    [
        "mid_snapshot_write@3",
        pytest.param("during_read@3", marks=pytest.mark.full),
        pytest.param("after_head_move@3", marks=pytest.mark.full),
    ],
)
def test_on_apache_kafka_a_sigkill_then_restore_is_exact(
    stack_env, local_stack, tmp_path, apache_kafka, apache_kafka_payments, locations, fault
):
    """The same on the real Apache Kafka broker (the S3 server of the embedded stack)."""
    _kill_and_restore(
        stack_env, local_stack, tmp_path, apache_kafka_payments, locations, fault, bootstrap=apache_kafka.bootstrap
    )


@pytest.mark.parametrize("locations", ["file"], indirect=True)
# The commit protocol's unit tests (tests/unit/test_commit_protocol_*.py) run on the local store:
# `make test` leaves this run of the whole job on it to `make full`.
@pytest.mark.full
@pytest.mark.parametrize("fault", ["after_sink_success@3", "after_manifest@3"])
def test_local_directory_store_has_the_same_semantics(stack_env, local_stack, tmp_path, payments, locations, fault):
    _kill_and_restore(stack_env, local_stack, tmp_path, payments, locations, fault)


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_external_sigkill_mid_run_then_restore_is_exact(stack_env, local_stack, tmp_path, payments, locations):
    """A kill from outside, at whatever moment the next epoch has reached."""
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store, per_epoch=3_000))
    crashed = run_cli(["run", str(spec)], stack_env, kill_when="epoch 2 committed", kill_delay=0.7)
    assert crashed.returncode == -9
    restored = run_cli(["run", str(spec)], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert _every_epoch_exact(stack_env, local_stack, locations) == 8


@pytest.mark.full  # make test: one kill at each sampled point; two in a row are in the sinks' full matrices too
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_two_crashes_in_a_row_and_a_rerun_with_nothing_new(stack_env, local_stack, tmp_path, payments, locations):
    topic, events = payments
    name, sink, store = locations
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store))
    for fault in ("after_sink_success@2", "after_manifest@4"):
        assert run_cli(["run", str(spec)], {**stack_env, "PIPELINE_FAULT_POINTS": fault}).returncode == -9
    assert run_cli(["run", str(spec)], stack_env).returncode == 0
    again = run_cli(["run", str(spec)], stack_env)
    assert again.returncode == 0 and "0 epoch(s)" in again.stderr
    assert result_table(stack_env, sink) == spend_per_user(events)
    assert _every_epoch_exact(stack_env, local_stack, locations) == 6
