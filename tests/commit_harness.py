"""The commit protocol's unit harness: a runner without Spark, committing on local directories.

The runner's real restorer, planner and commit (tests.runner_fakes) commit epochs on real
local-directory stores; only Spark is left out (each epoch's partial aggregates are handed in
as its read would bring them). Shared by the commit protocol's test files and the unit tests that
need committed epochs (lineage, verification, repair, the Airflow page), so that they all commit
the same spend job the same way.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline_lib.checkpoint import layout
from pipeline_lib.checkpoint.manifest import HistoryEntry
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.execution.runtime.runner_types import EpochRead, RunOptions
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import parse_spec
from tests.runner_fakes import TestRunner
from tests.support import dead_letters_written
from tests.watched_store import Watched

SETTINGS = ConnectionSettings()
TOPIC = "payments"


def job_spec(root, *, retain: int = 10, per_file: int | None = None, dead_letters: bool = False):
    extra = {"on_error": "dead_letter", "dead_letter": {"path": f"file://{root}/dlq"}} if dead_letters else None
    spec = spend_job_spec("job", TOPIC, f"file://{root}/out", f"file://{root}/ckpt", retain=retain, extra=extra)
    if per_file is not None:
        spec["checkpoint"]["key_groups_per_state_file"] = per_file
    return parse_spec(spec)


def new_attempt(spec, restore: str = "latest", tap: type[Watched] = Watched) -> TestRunner:
    """A runner's collaborators for the job's one pipeline that restored ``restore`` and claimed a
    new attempt, as ``restore`` and ``schedule`` leave them before Spark starts."""
    runner = TestRunner(spec, RunOptions(restore=restore), SETTINGS, tap=tap)
    runner.restore()
    runner.claim()
    return runner


def watch(runner: TestRunner, log: list, after=None) -> None:
    runner.watch(log, after)


def partials(amounts: dict[str, int]) -> pa.Table:
    """An epoch's partial aggregate of the spend job (user, total, n), as Spark hands it over."""
    return pa.table(
        {
            "user": list(amounts),
            "total": pa.array(list(amounts.values()), pa.int64()),
            "n": pa.array([1] * len(amounts), pa.int64()),
        }
    )


def bad_records(count: int) -> pa.Table:
    return pa.table(
        {
            "topic": [TOPIC] * count,
            "partition": [0] * count,
            "offset": list(range(count)),
            "error": ["not JSON"] * count,
            "raw_base64": ["eA=="] * count,
        }
    )


def epoch_read(
    runner: TestRunner, amounts: dict[str, int], history: list[HistoryEntry], bad: pa.Table | None = None
) -> EpochRead:
    """The epoch after ``history``, planned as the runner plans it (saving the plan), and what its
    Spark read would bring: every flow gets ``amounts`` as partial aggregates."""
    epoch = history[0].epoch + 1 if history else 1
    base = history[0].snapshot_id if history else None
    positions = {0: (epoch - 1) * 10, 1: (epoch - 1) * 10}
    plan = runner.plan(epoch, base, positions, {0: epoch * 10, 1: epoch * 10}, None)
    return EpochRead(
        plan,
        dead_letters_written(runner, epoch, bad) if bad is not None else None,
        {flow.spec.name: partials(amounts) for flow in runner.flows},
    )


def commit_epoch(
    runner: TestRunner,
    amounts: dict[str, int],
    history: list[HistoryEntry],
    head_version: str | None,
    bad: pa.Table | None = None,
):
    read = epoch_read(runner, amounts, history, bad)
    manifest, head, version = runner.run_epoch(read, history, head_version)
    return manifest, head, version


def run_epochs(runner, batches, history=(), version=None):
    history = list(history)
    for amounts in batches:
        _, head, version = commit_epoch(runner, amounts, history, version)
        history = head.history
    return history, version


def head_bytes(snapshots: SnapshotStore) -> bytes:
    return snapshots.store.get(layout.HEAD_KEY)
