"""Who may see the Pipelines page, checked by Airflow's real login and auth manager (the simple
auth manager, Airflow's default, with real signed tokens): no user, no page; each user sees only
the jobs whose DAG Airflow lets them read; a plugin whose login check cannot be imported refuses
every request instead of serving it public; no OpenAPI docs answer; no other origin may frame it."""

from __future__ import annotations

import sys

import pytest
import yaml
from fastapi.testclient import TestClient

from pipeline_lib.orchestration.ui_app import create_app
from pipeline_lib.samples import spend_job_spec
from pipeline_lib.settings import ConnectionSettings

SETTINGS = ConnectionSettings()
ROUTES = ["/", "/api/overview"]


def _specs(tmp_path, *jobs: str):
    specs = tmp_path / "pipelines"
    specs.mkdir()
    for job in jobs:
        spec = spend_job_spec(job, "payments", f"file://{tmp_path}/out-{job}", f"file://{tmp_path}/ckpt")
        (specs / f"{job}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    (specs / "broken.yaml").write_text("name: [")
    return specs


@pytest.fixture
def auth_manager(monkeypatch):
    """Airflow's configured auth manager (the simple one), initialised as the api-server does; the
    metadata DB (SQLite in the session's AIRFLOW_HOME) gets the revoked-token table a token check reads."""
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-test-only-secret-for-signing-tokens-" + "x" * 32)
    from airflow import settings
    from airflow.api_fastapi.app import init_auth_manager, purge_cached_app
    from airflow.models.revoked_token import RevokedToken

    RevokedToken.__table__.create(settings.engine, checkfirst=True)

    purge_cached_app()
    yield init_auth_manager()
    purge_cached_app()


def _bearer(auth_manager, role: str | None, teams: list[str] | None = None) -> dict:
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    token = auth_manager.generate_jwt(SimpleAuthManagerUser(username=f"u-{role}", role=role, teams=teams))
    return {"Authorization": f"Bearer {token}"}


def test_without_a_signed_in_user_every_route_is_refused(tmp_path, auth_manager):
    client = TestClient(create_app(_specs(tmp_path, "spend"), settings_factory=lambda _ids: SETTINGS))
    for route in ROUTES:
        answer = client.get(route, params={"lag": "false"})
        assert answer.status_code == 401, route
        assert "spend" not in answer.text
    assert client.get("/", params={"lag": "false"}, headers={"Authorization": "Bearer forged"}).status_code == 403


def test_each_user_sees_only_the_jobs_airflow_lets_them_read(tmp_path, auth_manager):
    client = TestClient(create_app(_specs(tmp_path, "spend", "other"), settings_factory=lambda _ids: SETTINGS))

    viewer = client.get("/api/overview", params={"lag": "false"}, headers=_bearer(auth_manager, "VIEWER")).json()
    assert sorted(job["name"] for job in viewer["jobs"]) == ["other", "spend"]
    assert list(viewer["spec_errors"]) == ["broken.yaml"]

    nobody = _bearer(auth_manager, None)  # signed in, but Airflow lets this user read no DAG
    overview = client.get("/api/overview", params={"lag": "false"}, headers=nobody).json()
    assert overview["jobs"] == [] and overview["spec_errors"] == {}
    page = client.get("/", params={"lag": "false"}, headers=nobody)
    assert page.status_code == 200 and "pipeline__spend" not in page.text and "broken.yaml" not in page.text


def test_the_app_is_closed_when_airflow_login_cannot_be_imported(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "airflow.api_fastapi.core_api.security", None)  # import raises ImportError
    client = TestClient(create_app(_specs(tmp_path, "spend"), settings_factory=lambda _ids: SETTINGS))
    for route in ROUTES:
        answer = client.get(route, params={"lag": "false"})
        assert answer.status_code == 503, route
        assert "spend" not in answer.text and "closed" in answer.text


@pytest.mark.parametrize("authenticated", [True, False])
def test_no_openapi_docs_answer(tmp_path, authenticated):
    client = TestClient(
        create_app(_specs(tmp_path), settings_factory=lambda _ids: SETTINGS, authenticated=authenticated)
    )
    for route in ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"]:
        assert client.get(route).status_code == 404, route


def test_no_other_origin_may_frame_the_page_or_the_api(tmp_path, auth_manager):
    client = TestClient(create_app(_specs(tmp_path, "spend"), settings_factory=lambda _ids: SETTINGS))
    viewer = _bearer(auth_manager, "VIEWER")
    for answer in [client.get(r, params={"lag": "false"}, headers=viewer) for r in ROUTES] + [client.get("/")]:
        assert answer.headers["Content-Security-Policy"] == "frame-ancestors 'self'"
