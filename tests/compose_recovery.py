"""The second half of both compose scenarios (in containers and natively): once the killed run is
LOST, `pipeline_recovery` relaunches it, the relaunch restores from the snapshot recovery chose,
and the result table equals plain Python's."""

from __future__ import annotations

import time
from typing import Any

from pipeline_lib.samples import spend_per_user
from pipeline_lib.settings import ConnectionSettings
from tests.support import result_table


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
    """The job's table, read with the stack's own S3 settings, is plain Python's spend per user."""
    env = {
        "PIPELINE_S3_ENDPOINT": settings.s3_endpoint,
        "PIPELINE_S3_ACCESS_KEY": settings.s3_access_key.get_secret_value(),
        "PIPELINE_S3_SECRET_KEY": settings.s3_secret_key.get_secret_value(),
        "PIPELINE_S3_REGION": settings.s3_region,
    }
    assert result_table(env, sink) == spend_per_user(events)
