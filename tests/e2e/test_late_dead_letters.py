"""``on_late: dead_letter`` under SIGKILL: the real `pipeline-lib run`, broker, S3 server and Spark.

The clicks of tests/e2e/test_windows.py (one partition, every 17th record 10 minutes late) in
tumbling 1-minute windows with a 2-minute watermark; the run is killed in epoch 3, then run again.
The dead letters then hold each late record exactly once, named by topic, partition and offset,
with the reason an independent plain-Python computation gives; they are exactly the records the
snapshots count as late, and the windows are still written once with their exact values. On the
Arrow path (no transforms) and on the Spark SQL path (a filter that keeps every record).
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.table_reader import read_append_rows
from pipeline_lib.storage import open_store
from pipeline_lib.testing import Record, run_on_records
from tests.support import run_cli, write_spec
from tests.windows_checks import PER_EPOCH, check_windows, clicks_spec, one_partition_clicks
from tests.windows_reference import MINUTE, _ms, click_events

EVENTS = 1_200  # 6 epochs of 200 records


@pytest.fixture(scope="module")
def late_clicks(local_stack):
    """(topic, events): one partition of clicks, produced once for the module."""
    return one_partition_clicks(local_stack.kafka_bootstrap, "late-letters-e2e", EVENTS, seed=35)


def _iso(ms: int) -> str:
    text = dt.datetime.fromtimestamp(ms // 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{ms % 1000:03d}Z" if ms % 1000 else f"{text}Z"


def expected_letters(topic: str, flow: str, events: list[dict], per_epoch: int = PER_EPOCH) -> dict[tuple, str]:
    """Plain Python: (topic, partition, offset) -> reason of every late record, epoch by epoch
    against the watermark the epoch started with (tumbling 1-minute windows, 2-minute delay)."""
    out: dict[tuple, str] = {}
    top = None
    for first in range(0, len(events), per_epoch):
        watermark = None if top is None else top - 2 * MINUTE
        for offset in range(first, min(first + per_epoch, len(events))):
            ms = _ms(events[offset]["ts"])
            start = ms - ms % MINUTE
            if watermark is not None and start + MINUTE <= watermark:
                out[(topic, 0, offset)] = (
                    f"late for flow {flow}: event time {_iso(ms)} is behind the watermark {_iso(watermark)}; "
                    f"its window [{_iso(start)}, {_iso(start + MINUTE)}) already closed"
                )
            top = ms if top is None else max(top, ms)
    return out


@pytest.mark.full  # two runs of a real Spark job: over the 15 s make test allows a scenario
@pytest.mark.parametrize("locations", ["s3"], indirect=True)
@pytest.mark.parametrize(
    ("path", "fault"),
    [("arrow", "mid_snapshot_write@3"), ("spark", "after_manifest@3")],
)
def test_late_records_land_in_the_dead_letters_exactly_once_across_a_sigkill(
    stack_env, tmp_path, late_clicks, locations, path, fault
):
    topic, events = late_clicks
    name, sink, store = locations
    dead = f"s3://results/{name}-dead"
    spec = clicks_spec(
        name, topic, sink, store, {"size": "1 minute"}, {"on_error": "dead_letter", "dead_letter": {"path": dead}}
    )
    spec["state"]["aggregate"]["on_late"] = "dead_letter"
    if path == "spark":
        spec["transforms"] = [{"filter": "ms > 0"}]  # every click: only the path changes
    written = write_spec(tmp_path, spec)
    fault_log = tmp_path / "faults.log"
    crashed = run_cli(
        ["run", str(written), "--until-caught-up"],
        {**stack_env, "PIPELINE_FAULT_POINTS": fault, "PIPELINE_FAULT_LOG": str(fault_log)},
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert f"FAULT INJECTED: {fault.split('@')[0]} epoch=3" in fault_log.read_text()
    restored = run_cli(["run", str(written), "--until-caught-up"], stack_env)
    assert restored.returncode == 0, restored.stderr[-3000:]
    assert ("Spark SQL path" in restored.stderr) == (path == "spark")

    letters = read_append_rows(open_store(f"{dead}/main", ConnectionSettings.from_env(stack_env)))
    got = [(r["topic"], r["partition"], r["offset"]) for r in letters]
    assert len(got) == len(set(got)), "a late record dead-lettered twice"
    want = expected_letters(topic, name, events)  # the single-flow form: the flow is named as the job
    assert {(r["topic"], r["partition"], r["offset"]): r["error"] for r in letters} == want
    assert all(r["raw_base64"] is None and r["raw_bytes"] is None for r in letters)
    check_windows(stack_env, events, locations, MINUTE, MINUTE)  # late ones counted: as many as the letters
    if path == "arrow":  # a lost late-letter part: verify names it, repair writes the same bytes back
        dead_store = open_store(f"{dead}/main", ConnectionSettings.from_env(stack_env))
        marker = json.loads(dead_store.get("epoch=4/_SUCCESS"))
        [lost] = [f["key"] for f in marker["files"] if "/part-l" in f["key"]][:1]
        original = dead_store.get(lost)
        dead_store.delete(lost)
        found = run_cli(["verify", str(written), "--json"], stack_env)
        assert found.returncode == 1, found.stdout + found.stderr[-2000:]
        assert ("dead letters", "LOST") in [(f["what"], f["status"]) for f in json.loads(found.stdout)]
        repaired = run_cli(["repair", str(written), "--json"], stack_env)
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr[-3000:]
        assert {o["part"]: o["status"] for o in json.loads(repaired.stdout)} == {lost: "restored"}
        assert dead_store.get(lost) == original


@pytest.mark.full  # a Spark session of its own: over the 15 s make test allows
@pytest.mark.parametrize("transforms", [[], [{"filter": "ms > 0"}]], ids=["arrow", "spark-sql"])
def test_run_on_records_writes_the_late_records_to_its_dead_letters(tmp_path, transforms):
    """pipeline_lib.testing runs a spec's late records to its dead letters as a run does."""
    events = click_events(400, seed=36)
    spec = clicks_spec("clicks", "clicks", "s3://results/c", "s3://checkpoints/c", {"size": "1 minute"}, per_epoch=100)
    spec.update(on_error="dead_letter", dead_letter={"path": "s3://results/dead"}, transforms=transforms)
    spec["state"]["aggregate"]["on_late"] = "dead_letter"
    run = run_on_records(spec, [Record(e) for e in events], workdir=tmp_path)
    letters = {(r["topic"], r["partition"], r["offset"]): r["error"] for r in run.dead_letters}
    assert letters == expected_letters("clicks", "clicks", events, per_epoch=100) and len(letters) >= 10
    assert run.bad_records == 0 and len(run.dead_letters) == len(letters)
