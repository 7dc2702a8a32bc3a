"""The second half of both compose scenarios (in containers and natively): once the killed run is
LOST, `pipeline_recovery` relaunches it, the relaunch restores from the snapshot recovery chose,
and the job's Delta table equals plain Python's, read by delta-rs here and by DuckDB inside the stack."""

from __future__ import annotations

import json
import time
from typing import Any

from deltalake import DeltaTable

from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri


def relaunched_by_recovery(
    airflow: Any, dag: str, job: str, recovery_timeout: float, run_timeout: float
) -> dict[str, Any]:
    """Trigger `pipeline_recovery` for ``job``: it must relaunch the LOST run, which must then
    succeed, restored from the snapshot the recovery named. Returns the relaunch's run id and pipeline summary."""
    recovery = airflow.trigger("pipeline_recovery", {"jobs": [job]})
    assert airflow.wait_for_run("pipeline_recovery", recovery, timeout=recovery_timeout) == "success"
    [decision] = airflow.xcom("pipeline_recovery", recovery, "assess")
    assert decision["verdict"] == "relaunch" and decision["observed"] == "LOST", decision
    relaunch = decision["trigger_run_id"]
    started = time.monotonic()
    assert airflow.wait_for_run(dag, relaunch, timeout=run_timeout) == "success"
    summary = airflow.xcom(dag, relaunch, "run_job")["pipelines"][0]
    print(f"the relaunch, restored from {summary['restored_from']}, to its end: {time.monotonic() - started:.1f} s")
    assert summary["restored_from"] == decision["restore_from"] and summary["restored_from"]
    return relaunch, summary


def assert_exact_spend(settings: ConnectionSettings, sink: str, events: list[dict[str, Any]]) -> None:
    """The job's Delta table, read by delta-rs with the stack's own S3 settings (the job's key), is
    plain Python's spend per user: one row per user, every event counted once."""
    table = DeltaTable(table_uri(sink), storage_options=storage_options(sink, settings)).to_pandas()
    rows = table[["user", "total", "n"]].astype(object).to_dict("records")
    assert len(rows) == len({r["user"] for r in rows}), "a user has two rows"
    assert {r["user"]: r for r in rows} == spend_per_user(events)


def assert_queried_spend(output: str, events: list[dict[str, Any]]) -> None:
    """``python -m pipeline_lib.table_query``'s JSON lines (DuckDB over the job's Delta table, run
    inside the stack) are plain Python's spend per user, ordered by user."""
    rows = [json.loads(line) for line in output.splitlines() if line.strip()]
    assert [r["user"] for r in rows] == sorted(r["user"] for r in rows), "not ordered by the key"
    assert {r["user"]: {k: r[k] for k in ("user", "total", "n")} for r in rows} == spend_per_user(events)
    assert len(rows) == len(spend_per_user(events))
