"""Fixtures of the docker compose stack's static checks (tests/unit/test_compose*.py): the compose
file parsed once per module, raw and with .env.example's values substituted as compose would."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.compose_checks import COMPOSE_FILE, ENV_EXAMPLE
from tests.compose_file import deep_interpolate, parse_env_file


@pytest.fixture(scope="module")
def compose_text() -> str:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    return COMPOSE_FILE.read_text()


@pytest.fixture(scope="module")
def raw_compose(compose_text: str) -> dict[str, Any]:
    data = yaml.safe_load(compose_text)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), (
        "docker-compose.yml: no 'services' mapping"
    )
    return data


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    assert ENV_EXAMPLE.is_file(), f"{ENV_EXAMPLE} is missing"
    return parse_env_file(ENV_EXAMPLE)


@pytest.fixture(scope="module")
def services(raw_compose: dict[str, Any], env_example: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The services with every ${VAR} substituted from .env.example, as docker compose would."""
    return deep_interpolate(raw_compose["services"], env_example)


@pytest.fixture(scope="module")
def raw_services(raw_compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return raw_compose["services"]
