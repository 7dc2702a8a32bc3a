"""Session windows' ``on_late: dead_letter`` under SIGKILL: the real `pipeline-lib run`, broker,
S3 server and Spark.

The clicks of tests/e2e/test_windows.py (one partition, every 17th record 10 minutes late) in
session windows of an 8-second gap (a page's clicks are about 7.5 s apart, so sessions close all
along the run and the very late records join none) with a 2-minute watermark. The run is killed
at a named fault point of epoch 3, then run again. On each of the four paths, the merge on the
driver (``keyed_state: driver``) or on the key's owner task (``keyed_state: owners``, restored at
another parallelism) times the Arrow path (no transforms) or the Spark SQL path (a filter that
keeps every record), each at its own fault point: the dead letters then hold each late record
exactly once, named by topic, partition and offset, with the reason a plain-Python computation
gives (tests/session_late_reference.py, independent of the library); the windows are
written once with their exact values, the snapshots count as many late records as there are
letters, and ``verify`` finds nothing.
"""

from __future__ import annotations

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store
from tests.session_late_reference import session_letters
from tests.support import run_cli, write_spec
from tests.windows_checks import PER_EPOCH, check_windows, clicks_spec, one_partition_clicks
from tests.windows_reference import MINUTE

EVENTS = 1_200  # 6 epochs of 200 records, 5 minutes of event time each
GAP_MS = 8_000
DELAY_MS = 2 * MINUTE
SQL = [{"filter": "ms > 0"}]  # every click has ms >= 1: the Spark SQL path, the same answer
OWNERS = {"keyed_state": "owners", "parallelism": 2}
ON_OWNERS = "with keyed state on owner tasks"
LONG = 900  # s: a run of a few epochs on a loaded 2-core machine


@pytest.fixture(scope="module")
def session_clicks(local_stack):
    """(topic, events): one partition of clicks, produced once for the module."""
    return one_partition_clicks(local_stack.kafka_bootstrap, "session-late-e2e", EVENTS, seed=35)


@pytest.mark.full  # two runs of a real Spark job, and verify: over the 15 s make test allows a scenario
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    ("keyed", "transforms", "fault"),
    [
        ("driver", [], "mid_snapshot_write@3"),
        ("driver", SQL, "after_manifest@3"),
        ("owners", [], "after_owner_files@3"),
        ("owners", SQL, "after_sink_success@3"),
    ],
    ids=["driver-arrow", "driver-spark-sql", "owners-arrow", "owners-spark-sql"],
)
def test_session_late_records_land_in_the_dead_letters_exactly_once_across_a_sigkill(
    stack_env, tmp_path, session_clicks, locations, keyed, transforms, fault
):
    topic, events = session_clicks
    name, sink, store = locations
    dead = f"s3://results/{name}-dead"
    extra = {"on_error": "dead_letter", "dead_letter": {"path": dead}, "transforms": transforms}
    if keyed == "owners":
        extra.update(OWNERS)
    spec = clicks_spec(name, topic, sink, store, {"gap": "8 seconds"}, extra)
    spec["state"]["aggregate"]["on_late"] = "dead_letter"
    written = write_spec(tmp_path, spec)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(written), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
        timeout=LONG,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    assert (ON_OWNERS in crashed.stderr) == (keyed == "owners")
    again = ["--parallelism", "3"] if keyed == "owners" else []  # owners: other key groups per task
    restored = run_cli(["run", str(written), "--until-caught-up", *again], stack_env, timeout=LONG)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert "restored from" in restored.stderr
    assert ("Spark SQL path" in restored.stderr) == bool(transforms)

    letters = read_append_rows(open_store(f"{dead}/main", ConnectionSettings.from_env(stack_env)))
    got = [(r["topic"], r["partition"], r["offset"]) for r in letters]
    assert len(got) == len(set(got)), "a late record dead-lettered twice"
    want = session_letters(topic, name, events, GAP_MS, DELAY_MS, PER_EPOCH)  # the flow is named as the job
    assert len(want) >= 10
    assert {(r["topic"], r["partition"], r["offset"]): r["error"] for r in letters} == want
    assert all(r["raw_base64"] is None and r["raw_bytes"] is None for r in letters)
    check_windows(stack_env, events, locations, MINUTE, MINUTE, gap_ms=GAP_MS)  # late ones: as many as the letters

    clean = run_cli(["verify", str(written), "--json"], stack_env, timeout=LONG)
    assert clean.returncode == 0, clean.stdout + clean.stderr[-2000:]
