"""Airflow plugin: the "Pipelines" page (jobs, pipelines, status, lag, snapshots, restore).

Thin on purpose; the page is ``pipeline_lib.orchestration.ui_app``."""

from airflow.plugins_manager import AirflowPlugin

from pipeline_lib.orchestration.ui_app import create_app


class PipelineLibPlugin(AirflowPlugin):
    name = "pipeline_lib"
    fastapi_apps = [{"app": create_app(), "url_prefix": "/pipeline-lib", "name": "pipeline-lib"}]
    external_views = [{
        "name": "Pipelines",
        "href": "/pipeline-lib/",
        "destination": "nav",
        "url_route": "pipelines",
    }]
