"""Refuse a bad request to run a job before Airflow creates a run, in plain words.

Airflow validates a trigger's ``conf`` against each param's JSON schema alone: its refusals quote
the schema ("does not match '^(latest|none|…'"), and what needs the job (a stall time above the
lease, a snapshot id the pipeline still retains) is only checked by ``check_params``, after a run
exists and turns red. This ASGI middleware, mounted on the api-server by the plugin, applies the
job's own checks to ``POST …/dags/pipeline__<job>/dagRuns`` (the REST API and the trigger form)
and answers 400 naming the field. It speaks only to a caller Airflow would let trigger that DAG:
anyone else's request passes through untouched, for Airflow to refuse.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)
TRIGGER_PATH = re.compile(r"/api/v2/dags/(pipeline__[^/]+)/dagRuns/?$")
Checker = Callable[[str, dict[str, Any]], str | None]  # (dag id, conf) -> why it is refused, or None
Authorizer = Callable[[dict[str, Any], str], Awaitable[bool]]  # (ASGI scope, dag id) -> may trigger


def check_conf(dag_id: str, conf: dict[str, Any]) -> str | None:
    """The job's checks of a trigger's conf (the form's fields against the spec as it is now, and a
    snapshot id against what the pipeline retains, read with the page's key); None when it passes
    or when the job is not one of the specs folder's."""
    from pipeline_lib.errors import SpecError
    from pipeline_lib.orchestration.job_specs import job_dag_id, load_spec_folder
    from pipeline_lib.orchestration.launch_request import LaunchRequest, check_restore_target
    from pipeline_lib.orchestration.ui_app import _settings, default_specs_dir

    spec = next((s for s in load_spec_folder(default_specs_dir()).specs.values() if job_dag_id(s.name) == dag_id), None)
    if spec is None:
        return None
    try:
        request = LaunchRequest.from_conf(conf, spec)
    except SpecError as exc:
        return str(exc)
    try:
        check_restore_target(spec, request, _settings(spec.airflow.connections))
    except SpecError as exc:
        return str(exc)
    except Exception as exc:  # the store cannot be read from here: check_params decides
        log.warning("could not check the restore target of %s: %s", dag_id, exc)
    return None


async def may_trigger(scope: dict[str, Any], dag_id: str) -> bool:
    """Whether the request's user (bearer token, else the UI's session cookie) may trigger ``dag_id``."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    token = None
    if headers.get("authorization", "").lower().startswith("bearer "):
        token = headers["authorization"][7:].strip()
    else:
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE_NAME_JWT_TOKEN:
                token = value
    if not token:
        return False
    try:
        manager = get_auth_manager()
        user = await manager.get_user_from_token(token)
        return bool(
            manager.is_authorized_dag(
                method="POST", access_entity=DagAccessEntity.RUN, details=DagDetails(id=dag_id), user=user
            )
        )
    except Exception:
        return False


class TriggerCheck:
    """ASGI middleware: the job's checks before Airflow's trigger endpoint (see the module)."""

    def __init__(self, app, checker: Checker = check_conf, authorizer: Authorizer = may_trigger):
        self.app, self.checker, self.authorizer = app, checker, authorizer

    async def __call__(self, scope, receive, send) -> None:
        """Check a trigger of a job's DAG (its body read once, then replayed to Airflow); pass anything else."""
        match = TRIGGER_PATH.search(scope.get("path", "")) if scope.get("type") == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False) and message.get("type") == "http.request"
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        why = await self._refusal(scope, match.group(1), body)
        if why is None:
            await self.app(scope, replay, send)
            return
        payload = json.dumps({"detail": why}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _refusal(self, scope, dag_id: str, body: bytes) -> str | None:
        try:
            conf = json.loads(body or b"{}").get("conf") or {}
        except (ValueError, AttributeError):
            return None  # not JSON: Airflow answers it
        if not isinstance(conf, dict) or not await self.authorizer(scope, dag_id):
            return None
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(self.checker, dag_id, conf)
