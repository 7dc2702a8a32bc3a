"""Refuse empty, placeholder or weak secrets before a deployment starts.

.env.example's values are public: a stack that runs with them lets anyone who reaches the
api-server sign admin or task tokens (JWT secret, API secret key), decrypt connection passwords
(Fernet key) and read the pipeline's S3 password. The Airflow image's entrypoint and the
airflow-init service run ``python -m pipeline_lib.secret_check`` first, and a job refuses a
placeholder S3 secret key (``settings.require_s3``). Messages name the variable and how to
generate a value, never the value itself. The embedded stack generates random keys, so local
runs and tests need nothing.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from pipeline_lib.logs import MIN_SECRET_LENGTH

# What .env.example's values look like ("change-me-...", "...-dev-only-..."), and their kin.
PLACEHOLDER = re.compile(r"change[-_ ]?me|replace[-_ ]?me|placeholder|dev[-_ ]only", re.IGNORECASE)
TOKEN_HOWTO = 'python -c "import secrets; print(secrets.token_urlsafe(64))"'
PASSWORD_HOWTO = 'python -c "import secrets; print(secrets.token_urlsafe(24))"'
FERNET_HOWTO = 'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
TOKEN_MIN_LENGTH = 32  # a signing key: 256 bits of token_urlsafe text is 43 characters


@dataclass(frozen=True)
class Secret:
    """One secret a deployment reads from its environment, and what makes a value acceptable."""

    name: str  # the environment variable
    how_to: str  # the command that generates a good value
    min_length: int = MIN_SECRET_LENGTH  # below this the log scrubber would not mask it either
    required: bool = False  # an Airflow service cannot run safely without it
    fernet: bool = False  # must also be a valid Fernet key


# The Airflow services' secrets (docker-compose.yml passes each from .env), and the passwords the
# one-shot services and the job see.
SECRETS = (
    Secret("AIRFLOW__CORE__FERNET_KEY", FERNET_HOWTO, required=True, fernet=True),
    Secret("AIRFLOW__API_AUTH__JWT_SECRET", TOKEN_HOWTO, TOKEN_MIN_LENGTH, required=True),
    Secret("AIRFLOW__API__SECRET_KEY", TOKEN_HOWTO, TOKEN_MIN_LENGTH, required=True),
    Secret("AIRFLOW_ADMIN_PASSWORD", PASSWORD_HOWTO),
    Secret("PIPELINE_S3_SECRET_KEY", PASSWORD_HOWTO),
    Secret("PIPELINE_S3_UI_SECRET_KEY", PASSWORD_HOWTO),
    Secret("MINIO_ROOT_PASSWORD", PASSWORD_HOWTO),
    Secret("SPARK_AUTH_SECRET", TOKEN_HOWTO, 32),  # Spark RPC authentication and encryption (compose)
)
DB_URL = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"


def weakness(value: str | None, min_length: int = MIN_SECRET_LENGTH) -> str | None:
    """Why ``value`` is not a usable secret (empty, a placeholder, too short), or None. The
    answer never quotes the value."""
    if not value or not value.strip():
        return "is empty"
    if PLACEHOLDER.search(value):
        return "is a placeholder (a change-me value from .env.example)"
    if len(value) < min_length:
        return f"is too short ({len(value)} characters; at least {min_length})"
    return None


def _fernet_problem(value: str) -> str | None:
    try:
        from cryptography.fernet import Fernet
    except ImportError:  # Airflow depends on cryptography; without it there is nothing to check against
        return None
    try:
        Fernet(value)
    except ValueError:
        return "is not a valid Fernet key"
    return None


def _url_password(url: str) -> str | None:
    try:
        password = urlsplit(url).password
    except ValueError:
        return None
    return unquote(password) if password is not None else None


def _connection_password(value: str) -> str | None:
    """The password of an ``AIRFLOW_CONN_*`` value, JSON or URI form."""
    if value.lstrip().startswith("{"):
        try:
            password = json.loads(value).get("password")
        except (ValueError, AttributeError):
            return None
        return str(password) if password else None
    return _url_password(value)


def deployment_problems(env: Mapping[str, str]) -> list[str]:
    """Every problem with the secrets in ``env``, one line each naming the variable and how to
    generate a value. Required secrets must be present; the others are checked when set."""
    problems = []
    for secret in SECRETS:
        value = env.get(secret.name)
        if value is None and not secret.required:
            continue
        why = weakness(value, secret.min_length)
        if why is None and secret.fernet:
            why = _fernet_problem(value or "")
        if why is not None:
            problems.append(f"{secret.name} {why}: generate one with {secret.how_to}")
    if (url := env.get(DB_URL)) and (password := _url_password(url)) is not None:
        if why := weakness(password):
            problems.append(
                f"the password in {DB_URL} (POSTGRES_PASSWORD in .env) {why}: generate one with {PASSWORD_HOWTO}"
            )
    for name in sorted(env):
        if name.startswith("AIRFLOW_CONN_") and (password := _connection_password(env[name])) is not None:
            if why := weakness(password):
                problems.append(f"the password of {name} {why}: generate one with {PASSWORD_HOWTO}")
    return problems


def main(env: Mapping[str, str] | None = None) -> int:
    """Print each problem to stderr and return 1, or return 0: the exit status of a start-up check."""
    problems = deployment_problems(os.environ if env is None else env)
    for problem in problems:
        print(f"refusing to start: {problem}", file=sys.stderr)
    if problems:
        print("Set real values in .env (see .env.example), then start the stack again.", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
