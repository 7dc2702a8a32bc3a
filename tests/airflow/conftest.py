"""The Airflow tier's one deployment, shared by tests/airflow/test_airflow*.py.

Starting Airflow with every job and DAG of the tier takes minutes, so the ``airflow`` fixture is
session-scoped: its test files share one deployment, in file order (test_airflow.py's runs first,
then the Pipelines page, then users' DAGs, as the page tests read what the runs left). A session
fixture would outlive the tier and load the machine during every later tier, so the deployment is
stopped right after the last selected test that uses it (the fixture's own teardown then finds it
stopped: ``AirflowServer.stop`` is idempotent).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.airflow.airflow_jobs import deployed_airflow
from tests.airflow.deployment import AirflowServer

_RUNNING: list[AirflowServer] = []  # the deployment while it runs


@pytest.fixture(scope="session")
def airflow(local_stack, payments, tmp_path_factory) -> Iterator[AirflowServer]:
    with deployed_airflow(local_stack, payments, tmp_path_factory.mktemp("airflow")) as server:
        _RUNNING.append(server)
        yield server


@pytest.hookimpl(trylast=True)  # after the test's own fixtures are torn down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the deployment once no test left in the session uses it."""
    if not _RUNNING:
        return
    items = item.session.items
    later = items[items.index(item) + 1 :]
    if not any("airflow" in getattr(other, "fixturenames", ()) for other in later):
        _RUNNING.pop().stop()
