"""The Airflow 3 REST API as the tests use it: a bearer token from the simple auth manager, raw
authenticated requests, DAGs, runs, task instances, task logs and XComs.

``AirflowRestApi`` is a mixin of ``AirflowServer`` (deployment.py), which provides the address,
the home folder (the simple auth manager writes its generated passwords there), the HTTP session
and two hooks: every wait calls ``_check_alive()`` each round, so that a dead deployment fails at
once, and failures carry ``logs_tail()``.

This module holds no project-specific logic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

FINAL_RUN_STATES = frozenset({"success", "failed"})


class AirflowHarnessError(RuntimeError):
    """The Airflow processes did not start, died, or did not reach an expected state in time."""


class AirflowApiError(RuntimeError):
    """A REST call answered with an unexpected HTTP status. Carries the response."""

    def __init__(self, message: str, response: requests.Response):
        super().__init__(message)
        self.response = response
        self.status_code = response.status_code
        self.body = response.text

    def json(self) -> Any:
        return self.response.json()


def _seg(value: str) -> str:
    """URL-encode one path segment (run ids contain ':' and '+')."""
    return quote(str(value), safe="")


class AirflowRestApi:
    """The REST calls of a running deployment (see the module's docstring)."""

    # Provided by the class this is mixed into.
    base_url: str
    home: Path
    all_admins: bool
    request_timeout: float
    username: str
    passwords_file: Path
    _session: requests.Session
    _token: str | None

    def _check_alive(self) -> None:
        """Raise AirflowHarnessError when the deployment has died (the waits call it each round)."""

    def logs_tail(self, lines: int = 40, first: str | None = None) -> str:
        """The last lines of the deployment's logs, for failure messages."""
        return ""

    def run_logs_tail(self, dag_id: str, run_id: str, lines: int = 120) -> str:
        """The last lines of each task log of one run, for failure messages."""
        return ""

    # ---------------------------------------------------------------- auth and raw REST
    def token(self, refresh: bool = False) -> str:
        """A bearer token. With the simple auth manager: POST /auth/token with the generated
        password; in all-admins mode GET /auth/token (no credentials, anonymous admin)."""
        if self._token and not refresh:
            return self._token
        if self.all_admins:
            r = self._session.get(f"{self.base_url}/auth/token", timeout=self.request_timeout)
        else:
            r = self._session.post(
                f"{self.base_url}/auth/token", json=self.credentials(self.username), timeout=self.request_timeout
            )
        if r.status_code not in (200, 201):
            raise AirflowApiError(f"/auth/token answered {r.status_code}: {r.text}", r)
        self._token = r.json()["access_token"]
        return self._token

    def credentials(self, username: str = "admin", timeout: float = 30.0) -> dict[str, str]:
        """The simple auth manager's password of ``username`` (generated, or from the configured file)."""
        path = self.passwords_file
        deadline = time.monotonic() + timeout
        while True:
            try:
                passwords = json.loads(path.read_text())
                return {"username": username, "password": passwords[username]}
            except (OSError, ValueError, KeyError) as exc:
                if time.monotonic() > deadline:
                    raise AirflowHarnessError(f"no password for {username!r} in {path}\n{self.logs_tail()}") from exc
                time.sleep(0.3)

    def request(
        self, method: str, path: str, *, expect: Iterable[int] | None = (200,), **kwargs: Any
    ) -> requests.Response:
        """An authenticated request to ``base_url + path``; raises AirflowApiError on a status not
        in ``expect`` (``expect=None``: return any response)."""
        kwargs.setdefault("timeout", self.request_timeout)
        url = f"{self.base_url}{path}"
        extra_headers = kwargs.pop("headers", None) or {}
        for attempt in (1, 2):  # one retry with a fresh token after a 401
            token = self.token(refresh=attempt == 2)
            headers = {**extra_headers, "Authorization": f"Bearer {token}"}
            r = self._session.request(method, url, headers=headers, **kwargs)
            if r.status_code != 401:
                break
        if expect is not None and r.status_code not in set(expect):
            raise AirflowApiError(f"{method} {path} answered {r.status_code}: {r.text[:2000]}", r)
        return r

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs).json()

    # ---------------------------------------------------------------- DAGs and runs
    def import_errors(self) -> list[dict[str, Any]]:
        return self.get("/api/v2/importErrors", params={"limit": 100})["import_errors"]

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        r = self.request("GET", f"/api/v2/dags/{_seg(dag_id)}", expect=(200, 404))
        return r.json() if r.status_code == 200 else None

    def wait_for_dag(self, dag_id: str, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the dag-processor has parsed ``dag_id`` and the API knows it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            dag = self.dag(dag_id)
            if dag is not None:
                return dag
            time.sleep(0.5)
        try:
            errors = json.dumps(self.import_errors(), indent=1)
        except Exception as e:  # diagnostics only
            errors = f"<cannot list import errors: {e}>"
        raise AirflowHarnessError(
            f"DAG {dag_id!r} not visible after {timeout:.0f}s. Import errors: {errors}\n{self.logs_tail()}"
        )

    def set_paused(self, dag_id: str, paused: bool) -> dict[str, Any]:
        return self.request("PATCH", f"/api/v2/dags/{_seg(dag_id)}", json={"is_paused": paused}).json()

    def unpause(self, dag_id: str) -> dict[str, Any]:
        return self.set_paused(dag_id, False)

    def pause(self, dag_id: str) -> dict[str, Any]:
        return self.set_paused(dag_id, True)

    def trigger_response(self, dag_id: str, conf: Mapping[str, Any] | None = None, **body: Any) -> requests.Response:
        """``POST /api/v2/dags/{dag_id}/dagRuns``; the raw response, whatever its status."""
        payload = {"logical_date": None, "conf": dict(conf or {}), **body}
        return self.request("POST", f"/api/v2/dags/{_seg(dag_id)}/dagRuns", json=payload, expect=None)

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None, **body: Any) -> str:
        """Trigger a run and return its run_id; AirflowApiError (``.status_code``, ``.body``,
        ``.response``) when the API does not answer 200, e.g. 400 for conf that fails the Params.
        A 500 "Database error" (SQLite locked by the scheduler; the insert rolled back) is tried
        again, three times at most."""
        r = self.trigger_response(dag_id, conf, **body)
        for wait in (1.0, 2.0, 4.0):  # the test deployment's SQLite: a write that met a lock is rolled back
            if r.status_code != 500 or "Database error" not in r.text:
                break
            time.sleep(wait)
            r = self.trigger_response(dag_id, conf, **body)
        if r.status_code != 200:
            raise AirflowApiError(f"trigger {dag_id} answered {r.status_code}: {r.text[:2000]}", r)
        return r.json()["dag_run_id"]

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self.get(f"/api/v2/dags/{_seg(dag_id)}/dagRuns/{_seg(run_id)}")

    def dag_runs(self, dag_id: str) -> list[dict[str, Any]]:
        """All runs of ``dag_id``, oldest first."""
        runs: list[dict[str, Any]] = []
        while True:
            page = self.get(
                f"/api/v2/dags/{_seg(dag_id)}/dagRuns", params={"limit": 100, "offset": len(runs), "order_by": "id"}
            )
            runs.extend(page["dag_runs"])
            if not page["dag_runs"] or len(runs) >= page["total_entries"]:
                return runs

    def wait_for_run(
        self, dag_id: str, run_id: str, states: Iterable[str] = FINAL_RUN_STATES, timeout: float = 180.0
    ) -> str:
        """Wait until the run is in one of ``states``; returns that state."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            self._check_alive()
            state = self.dag_run(dag_id, run_id)["state"]
            if state in wanted:
                return state
            time.sleep(0.5)
        try:
            tis = [(t["task_id"], t["map_index"], t["state"]) for t in self.task_instances(dag_id, run_id)]
        except Exception as e:  # diagnostics only
            tis = [f"<cannot list task instances: {e}>"]
        raise AirflowHarnessError(
            f"run {run_id} of {dag_id} is {state!r}, not in {sorted(wanted)}, after {timeout:.0f}s; "
            f"tasks: {tis}\n{self.run_logs_tail(dag_id, run_id)}\n{self.logs_tail()}"
        )

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.get(
                f"/api/v2/dags/{_seg(dag_id)}/dagRuns/{_seg(run_id)}/taskInstances",
                params={"limit": 100, "offset": len(out)},
            )
            out.extend(page["task_instances"])
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out

    def task_log_events(
        self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1
    ) -> list[Any]:
        """The structured log records of one task try (dicts with ``event``, ``timestamp``,
        ``level``... or plain strings for unparsable lines)."""
        path = (
            f"/api/v2/dags/{_seg(dag_id)}/dagRuns/{_seg(run_id)}/taskInstances/{_seg(task_id)}/logs/{int(try_number)}"
        )
        body = self.get(
            path, params={"full_content": "true", "map_index": map_index}, headers={"Accept": "application/json"}
        )
        return body["content"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1, map_index: int = -1) -> str:
        """The task log as text, one line per record: ``timestamp [level] event key=value...``."""
        lines = []
        for rec in self.task_log_events(dag_id, run_id, task_id, try_number, map_index):
            if not isinstance(rec, dict):
                lines.append(str(rec))
                continue
            rec = dict(rec)
            head = " ".join(
                str(x) for x in (rec.pop("timestamp", None), f"[{rec.pop('level')}]" if rec.get("level") else None) if x
            )
            event = rec.pop("event", "")
            rec.pop("level", None)
            extra = " ".join(f"{k}={v}" for k, v in rec.items())
            lines.append(" ".join(x for x in (head, str(event), extra) if x))
        return "\n".join(lines)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        """The XCom value as the task pushed it (JSON-decoded)."""
        path = (
            f"/api/v2/dags/{_seg(dag_id)}/dagRuns/{_seg(run_id)}/taskInstances/{_seg(task_id)}/xcomEntries/{_seg(key)}"
        )
        value = self.get(path, params={"map_index": map_index, "deserialize": "true"})["value"]
        if isinstance(value, str):
            try:
                return json.loads(value)
            except ValueError:
                return value
        return value
