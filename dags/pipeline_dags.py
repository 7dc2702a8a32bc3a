"""Airflow DAGs of pipeline-lib: ``pipeline__<job>`` for every job spec in ``dags/pipelines/``,
and ``pipeline_recovery``. The logic lives in ``pipeline_lib.orchestration.dag_factory``."""

from pathlib import Path

from pipeline_lib.orchestration.dag_factory import build_dags

globals().update(build_dags(Path(__file__).resolve().parent / "pipelines"))
