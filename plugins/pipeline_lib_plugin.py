"""Airflow plugin: the "Pipelines" page (jobs, pipelines, status, lag, snapshots, restore), and the
check that refuses a bad trigger of a job's DAG in plain words before a run exists.

Thin on purpose; the page is ``pipeline_lib.orchestration.ui_app``, the check
``pipeline_lib.orchestration.trigger_check``."""

from airflow.plugins_manager import AirflowPlugin

from pipeline_lib.orchestration.trigger_check import TriggerCheck
from pipeline_lib.orchestration.ui_app import create_app


class PipelineLibPlugin(AirflowPlugin):
    name = "pipeline_lib"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/pipeline-lib", "name": "pipeline-lib"}]
    fastapi_root_middlewares = [
        {"middleware": TriggerCheck, "args": [], "kwargs": {}, "name": "pipeline-lib trigger check"}
    ]
    external_views = [
        {
            "name": "Pipelines",
            "href": "/pipeline-lib/",
            "destination": "nav",
            "url_route": "pipelines",
        }
    ]
