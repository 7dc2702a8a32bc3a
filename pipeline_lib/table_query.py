"""``python -m pipeline_lib.table_query SPEC``: a flow's Delta table queried with DuckDB.

What a team downstream of a job runs to read its Delta sink without pipeline_lib's own reader:
delta-rs reads the table's log (the data files of the last committed version, nothing staged by
an epoch in flight) and DuckDB runs the SQL over those files. DuckDB's own ``delta`` extension
would do both, but it is downloaded at ``INSTALL`` time from DuckDB's site, which these machines
do not reach; the rows are the same, since both follow the table's log.

The S3 settings are the spec's Airflow connections when their ``AIRFLOW_CONN_<ID>`` variables
(JSON form) are set, as in the compose stack's scheduler, else the ``PIPELINE_S3_*`` variables:
the secret key reaches delta-rs's storage options only, never the output or argv.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

from pipeline_lib.errors import PipelineError
from pipeline_lib.orchestration.connections import settings_from_connections
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.delta_table import storage_options, table_uri
from pipeline_lib.sink.output_mode import key_columns
from pipeline_lib.spec import load_spec
from pipeline_lib.spec.models import FlowSpec, JobSpec

TABLE = "t"  # the name the SQL reads the table by


def env_connection(conn_id: str, env: dict[str, str] | None = None) -> SimpleNamespace | None:
    """The Airflow connection ``conn_id`` from its ``AIRFLOW_CONN_<ID>`` variable (JSON form), or None."""
    name = f"AIRFLOW_CONN_{conn_id.upper()}"
    raw = (os.environ if env is None else env).get(name)
    if not raw:
        return None
    try:
        fields = json.loads(raw)
    except ValueError:
        raise PipelineError(f"{name} is not an Airflow connection in JSON form") from None
    if not isinstance(fields, dict):
        raise PipelineError(f"{name} is not an Airflow connection in JSON form")
    keys = ("host", "port", "login", "password", "extra")
    return SimpleNamespace(**{k: fields.get(k) for k in keys})


def job_settings(spec: JobSpec, env: dict[str, str] | None = None) -> ConnectionSettings:
    """The spec's S3 connection from the environment, the ``PIPELINE_*`` variables as fallback
    (the Kafka and Spark connections are not read: the query needs neither)."""
    s3 = spec.airflow.connections.s3
    return settings_from_connections(
        lambda conn_id: env_connection(conn_id, env) if conn_id == s3 else None, env=env, ids=spec.airflow.connections
    )


def delta_flow(spec: JobSpec, name: str | None) -> FlowSpec:
    """The flow ``name`` (the only Delta one by default), refused unless its sink is a Delta table."""
    deltas = [f for f in spec.all_flows() if f.sink.delta is not None]
    if name is not None:
        chosen = [f for f in spec.all_flows() if f.name == name]
        if not chosen:
            raise PipelineError(f"job {spec.name} has no flow {name!r}")
        if chosen[0].sink.delta is None:
            raise PipelineError(f"flow {name!r} of job {spec.name} does not write a Delta table (sink.delta)")
        return chosen[0]
    if len(deltas) != 1:
        names = ", ".join(f.name for f in deltas) or "none"
        raise PipelineError(f"job {spec.name} has {len(deltas)} Delta sinks ({names}): name one with --flow")
    return deltas[0]


def query(flow: FlowSpec, settings: ConnectionSettings, sql: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``sql`` (default: every row, ordered by the key columns) over the flow's table."""
    import duckdb
    from deltalake import DeltaTable

    assert flow.sink.delta is not None
    path = flow.sink.delta.path
    dataset = DeltaTable(table_uri(path), storage_options=storage_options(path, settings)).to_pyarrow_dataset()
    order = ", ".join(f'"{c}"' for c in key_columns(flow))
    sql = sql or f"SELECT * FROM {TABLE}" + (f" ORDER BY {order}" if order else "")
    with duckdb.connect() as con:
        con.register(TABLE, dataset)
        relation = con.sql(sql)
        columns = relation.columns
        return [dict(zip(columns, row, strict=True)) for row in relation.fetchall()]


def main(argv: list[str] | None = None) -> int:
    """Print the query's rows as JSON lines on stdout, their count on stderr; 2 on a bad spec or flow."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline_lib.table_query", description="Query a flow's Delta table with DuckDB."
    )
    parser.add_argument("spec", help="the job's spec (YAML)")
    parser.add_argument("--flow", help="the flow whose Delta sink is read (default: the job's only one)")
    parser.add_argument("--sql", help=f"DuckDB SQL over the table, named {TABLE} (default: every row, by key)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        flow = delta_flow(spec, args.flow)
        rows = query(flow, job_settings(spec), args.sql)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for row in rows:
        print(json.dumps(row, default=str))
    print(f"{len(rows)} rows (DuckDB over the Delta table of flow {flow.name})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
