"""An Airflow DAG downstream of the example job: runs when ``spend-per-user`` commits new epochs to its sink,
and reads the committed table (see ``pipeline_lib.orchestration.report_dag``)."""

from pathlib import Path

from pipeline_lib.orchestration.report_dag import report_dag

dag = report_dag("spend_per_user_report", Path(__file__).resolve().parent / "pipelines" / "spend-per-user.yaml")
