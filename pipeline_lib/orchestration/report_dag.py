"""A DAG downstream of a job: it runs when a flow's sink gets new committed epochs.

The example of what the sink Assets are for (orchestration.assets): scheduled on the sink's
Asset, it reads the flow's committed table (only epochs whose ``_SUCCESS`` exists, only the parts
each lists) and reports its size and the epochs the triggering event announced. A user's own
downstream DAG schedules on ``sink_asset(...)`` the same way and reads the table the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from pipeline_lib.orchestration.assets import sink_assets
from pipeline_lib.spec import load_spec

log = logging.getLogger(__name__)


def report_dag(dag_id: str, spec_path: Path, flow: str | None = None) -> DAG:
    """A DAG scheduled on ``flow``'s sink of the job at ``spec_path`` (its only flow by default)."""
    spec = load_spec(spec_path)
    assets = sink_assets(spec)
    name = flow or next(iter(assets))
    with DAG(
        dag_id=dag_id,
        schedule=[assets[name]],
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        catchup=False,
        is_paused_upon_creation=False,
        tags=["pipeline-lib", f"job:{spec.name}"],
        doc_md=f"Runs when flow **{name}** of job **{spec.name}** commits new epochs to "
        f"`{assets[name].uri}`, and reads its committed table.",
    ) as dag:

        @task(task_id="read_committed")
        def read_committed() -> dict[str, Any]:
            from pipeline_lib.orchestration.airflow_connections import airflow_settings
            from pipeline_lib.sink.output_mode import key_columns, output_mode
            from pipeline_lib.sink.published_files_sink import read_location
            from pipeline_lib.sink.table_reader import committed_epochs, read_append_rows, read_upsert_table
            from pipeline_lib.storage import open_store

            current = load_spec(spec_path)
            chosen = next(f for f in current.all_flows() if f.name == name)
            store = open_store(read_location(chosen), airflow_settings(current.airflow.connections))
            upsert = output_mode(chosen) == "upsert"
            rows = len(read_upsert_table(store, key_columns(chosen))) if upsert else len(read_append_rows(store))
            events = get_current_context()["triggering_asset_events"].get(assets[name], [])
            announced = [e.extra for e in events]
            log.info(
                "flow %s of job %s: %d rows in %d committed epochs; triggered by %s",
                name,
                current.name,
                rows,
                len(committed_epochs(store)),
                announced,
            )
            return {"rows": rows, "epochs": committed_epochs(store)[-1:], "events": announced}

        read_committed()
    return dag
