"""The "Pipelines" page of the Airflow UI: a small FastAPI app the plugin mounts in the api-server.

Read-only except through Airflow itself: the page's restore buttons call Airflow's own REST API
(``POST /api/v2/dags/{dag_id}/dagRuns``) with the signed-in user's session, so Airflow's
permissions decide who may restore, not this plugin. Airflow's auth manager also decides which
jobs a user sees: those whose DAG they may read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request, status
from fastapi.responses import HTMLResponse, JSONResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.orchestration.job_specs import RECOVERY_DAG_ID
from pipeline_lib.orchestration.overview import VIEW_BUDGET_S, Opener, Overview, build_overview
from pipeline_lib.orchestration.restore_questions import restore_question
from pipeline_lib.orchestration.view_cache import ViewCache
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import AirflowConnectionsSpec, JobSpec

Readable = Callable[[set[str]], set[str]]  # the DAG ids of those given that the request's user may read
TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")), autoescape=select_autoescape(["html"])
)
STATUS_COLOURS = {
    "RUNNING": "#1a7f37",
    "SCHEDULING": "#9a6700",
    "STOPPED": "#0969da",
    "COMPLETED": "#6e7781",
    "FAILED": "#cf222e",
    "LOST": "#bc4c00",
    "STALLED": "#bc4c00",
    "NEW": "#8c959f",
    "UNKNOWN": "#8c959f",
}
REFRESH_SECONDS = 10  # the page re-reads the overview this often (a form in progress is kept)
CACHE_SECONDS = 5.0  # views this close together share one read of the stores and the broker


def default_specs_dir() -> Path:
    """``dags/pipelines`` under Airflow's DAGs folder."""
    from airflow.configuration import conf

    return Path(os.path.expanduser(conf.get("core", "dags_folder"))) / "pipelines"


def _settings(ids: AirflowConnectionsSpec):
    """The connections ``ids`` (read through the api-server's own secrets backends), env fallback.
    S3 through ``<ids.s3>_ui`` (``pipeline_s3_ui``) when it is defined: the page only reads, and the
    api-server that serves it should hold no key that can write a snapshot (docker-compose.yml gives
    it only that one)."""
    from airflow.models.connection import Connection

    from pipeline_lib.orchestration.connections import page_settings_from_connections

    def lookup(conn_id: str):
        try:
            return Connection.get_connection_from_secrets(conn_id)
        except Exception:  # not defined: the PIPELINE_* variables apply
            return None

    return page_settings_from_connections(lookup, ids=ids)


def airflow_access():
    """Airflow's own check of the request's user (its session cookie or bearer token), as a FastAPI
    dependency that gives the DAG ids of ``dag_ids`` that user may read, asked of Airflow's auth
    manager. None when Airflow's auth cannot be imported: the app then closes (fail closed)."""
    try:
        from airflow.api_fastapi.app import get_auth_manager
        from airflow.api_fastapi.core_api.security import get_user
    except ImportError:
        return None

    def readable(user: object = Depends(get_user)) -> Readable:
        return lambda dag_ids: get_auth_manager().filter_authorized_dag_ids(dag_ids=dag_ids, user=user, method="GET")

    return readable


def closed() -> Readable:
    """Every request of an app whose login check could not be loaded: refused, never served public."""
    raise HTTPException(
        status.HTTP_503_SERVICE_UNAVAILABLE, "the Pipelines page is closed: Airflow's login check cannot be loaded"
    )


def everything() -> Readable:
    """Every DAG readable: the page without Airflow's login (tests of the page itself)."""
    return lambda dag_ids: dag_ids


def create_app(
    specs_dir: Path | None = None,
    settings_factory=_settings,
    authenticated: bool = True,
    cache_s: float = CACHE_SECONDS,
    budget_s: float = VIEW_BUDGET_S,
    open_snapshots: Opener = SnapshotStore.open,
) -> FastAPI:
    """The UI plugin's FastAPI app; ``authenticated=False`` serves it without Airflow's login (tests).

    Views share one build of the data for ``cache_s`` seconds (then filtered per user), each build
    bounded by ``budget_s``; ``open_snapshots`` opens a pipeline's checkpoint store.

    No OpenAPI docs: they would answer without login and load scripts from a CDN into Airflow's
    origin. Every response forbids framing by another origin; Airflow's own iframe is same-origin."""
    access = (airflow_access() or closed) if authenticated else everything
    app = FastAPI(title="pipeline-lib", docs_url=None, redoc_url=None, openapi_url=None)
    app.middleware("http")(frame_ancestors_self)
    readable_dep = Depends(access)
    cache: ViewCache[Overview] = ViewCache(cache_s)

    async def overview(readable: Readable, lag: bool = True) -> Overview:
        def build() -> Overview:
            read: dict[AirflowConnectionsSpec, ConnectionSettings] = {}  # jobs that share connections share a read

            def settings_of(spec: JobSpec) -> ConnectionSettings:
                ids = spec.airflow.connections
                if ids not in read:
                    read[ids] = settings_factory(ids)
                return read[ids]

            return build_overview(
                specs_dir or default_specs_dir(), settings_of, lag=lag, budget_s=budget_s, open_snapshots=open_snapshots
            )

        # the auth manager may ask the metadata DB: not on the event loop
        return await run_in_threadpool(visible, await cache.get(lag, build), readable)

    @app.get("/", response_class=HTMLResponse)
    async def page(
        request: Request, readable: Readable = readable_dep, lag: bool = True, job: str | None = None
    ) -> HTMLResponse:
        html = TEMPLATES.get_template("pipelines.html").render(
            overview=await overview(readable, lag),
            chosen_job=job,
            colours=STATUS_COLOURS,
            refresh_seconds=REFRESH_SECONDS,
            restore_question=restore_question,
            airflow_root=request.scope.get("root_path", "").rsplit("/pipeline-lib", 1)[0],
        )
        return HTMLResponse(html)

    @app.get("/api/overview")
    async def overview_json(readable: Readable = readable_dep, lag: bool = True) -> JSONResponse:
        return JSONResponse((await overview(readable, lag)).to_dict())

    return app


def visible(overview: Overview, readable: Readable) -> Overview:
    """The jobs whose DAG the user may read. Spec errors (file names and messages) belong to no
    readable job, so they go only to a user who may read ``pipeline_recovery``, which acts on every job."""
    allowed = readable({job.dag_id for job in overview.jobs} | {RECOVERY_DAG_ID})
    jobs = [job for job in overview.jobs if job.dag_id in allowed]
    errors = overview.spec_errors if RECOVERY_DAG_ID in allowed else {}
    return replace(overview, jobs=jobs, spec_errors=errors)


async def frame_ancestors_self(request: Request, call_next):
    """``Content-Security-Policy: frame-ancestors 'self'`` on every response: only Airflow's own
    UI (same origin) may show the page in a frame, so another site cannot overlay its buttons."""
    response = await call_next(request)
    response.headers["Content-Security-Policy"] = "frame-ancestors 'self'"
    return response
