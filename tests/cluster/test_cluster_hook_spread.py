"""An I/O-bound ``python:`` hook at parallelism 2 on a standalone cluster of two one-core workers:
each epoch's read stage, which the hook's mapInArrow runs in, has one Spark task per subtask, and
once both executors are registered the two tasks run on different executors side by side (their
run intervals overlap), so a second subtask adds a second waiting task, not a second turn of one.

What is observed is Spark's own event log (``spark.eventLog.enabled``): every task's executor and
its launch and finish times; what is asserted is placement and order, never a duration. It pins
what issue 39's investigation found (docs/autoscaling.md, "Why a second subtask helps"): a
coalesce, a repartition to one, or tasks held on one executor by locality would fail it."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from benchmarks.slow_records import COST_ENV
from pipeline_lib.samples import spend_per_user
from tests.cluster.test_cluster_exactly_once import EPOCHS, _job
from tests.support import result_table, run_cli

pytestmark = [pytest.mark.cluster, pytest.mark.full]

HOOK = "benchmarks.slow_records:wait_per_record"


def events_of(log_dir: Path) -> list[dict]:
    """The events of the one application whose (uncompressed, unrolled) event log is in ``log_dir``."""
    logs = [p for p in log_dir.iterdir() if p.is_file()]
    assert len(logs) == 1, logs
    return [json.loads(line) for line in logs[0].read_text().splitlines() if line.strip()]


def hook_stages(events: list[dict]) -> dict[int, list[dict]]:
    """The ``Task Info`` of every task of the stages that run the epoch's read and the hook: two
    MapInArrow plan nodes (the read's own and the hook's) in one stage, by stage id."""
    hooked = set()
    for e in events:
        if e["Event"] == "SparkListenerStageSubmitted":
            scopes = {rdd.get("Scope") for rdd in e["Stage Info"]["RDD Info"]}
            if len({s for s in scopes if s and '"MapInArrow"' in s}) >= 2:
                hooked.add(e["Stage Info"]["Stage ID"])
    tasks: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e["Event"] == "SparkListenerTaskEnd" and e["Stage ID"] in hooked:
            tasks[e["Stage ID"]].append(e["Task Info"])
    return dict(tasks)


def test_the_hook_s_tasks_of_an_epoch_run_one_per_subtask_on_both_executors_side_by_side(
    cluster, cluster_env, local_stack, tmp_path, cluster_payments
):
    """4 epochs of 3,000 records at parallelism 2, each record waiting 1 ms in the hook: every read
    stage has 2 tasks, and each launched after both executors registered ran on two executors
    with overlapping run intervals; the output is exact."""
    events_dir = tmp_path / "events"
    events_dir.mkdir()
    conf = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{events_dir}",
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }
    name, sink, _store, spec = _job(
        tmp_path, cluster_payments, parallelism=2, spark={"conf": conf}, extra={"transforms": [{"python": HOOK}]}
    )
    result = run_cli(["run", str(spec)], {**cluster_env, COST_ENV: "1"}, timeout=900)
    (tmp_path / "run.stderr").write_text(result.stderr)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_table(cluster_env, sink) == spend_per_user(cluster_payments[1])

    events = events_of(events_dir)
    added = [e["Timestamp"] for e in events if e["Event"] == "SparkListenerExecutorAdded"]
    assert len(added) >= 2, added
    both_up = sorted(added)[1]
    stages = hook_stages(events)
    assert len(stages) == EPOCHS, {s: len(t) for s, t in stages.items()}  # one read stage per epoch
    assert all(len(tasks) == 2 for tasks in stages.values()), {s: len(t) for s, t in stages.items()}
    spread = {s: tasks for s, tasks in stages.items() if min(t["Launch Time"] for t in tasks) >= both_up}
    assert len(spread) >= 3, f"{len(spread)} of {len(stages)} read stages launched after both executors were up"
    for stage, (a, b) in spread.items():
        assert a["Executor ID"] != b["Executor ID"], (stage, a, b)
        assert a["Launch Time"] < b["Finish Time"] and b["Launch Time"] < a["Finish Time"], (stage, a, b)
