"""Connection settings, read from the environment and never from a spec file.

Secrets are ``SecretStr`` so that a repr, a log line or a pydantic dump cannot leak them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, SecretStr

from pipeline_lib.errors import ConfigError
from pipeline_lib.logs import scrubbable
from pipeline_lib.secret_check import PASSWORD_HOWTO, PLACEHOLDER

ENV_KAFKA_BOOTSTRAP = "PIPELINE_KAFKA_BOOTSTRAP"
ENV_S3_ENDPOINT = "PIPELINE_S3_ENDPOINT"
ENV_S3_ACCESS_KEY = "PIPELINE_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY = "PIPELINE_S3_SECRET_KEY"
ENV_S3_REGION = "PIPELINE_S3_REGION"
ENV_SPARK_MASTER = "PIPELINE_SPARK_MASTER"


class ConnectionSettings(BaseModel, frozen=True):
    """Where the broker and the object store are, and how to log in to the latter."""

    kafka_bootstrap: str | None = None
    s3_endpoint: str | None = None
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    s3_region: str = "us-east-1"
    spark_master: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConnectionSettings:
        """Read the PIPELINE_* variables (``env`` for tests); blank values count as unset."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        access, secret = get(ENV_S3_ACCESS_KEY), get(ENV_S3_SECRET_KEY)
        return cls(
            kafka_bootstrap=get(ENV_KAFKA_BOOTSTRAP),
            s3_endpoint=get(ENV_S3_ENDPOINT),
            s3_access_key=SecretStr(access) if access else None,
            s3_secret_key=SecretStr(secret) if secret else None,
            s3_region=get(ENV_S3_REGION) or "us-east-1",
            spark_master=get(ENV_SPARK_MASTER),
        )

    def require_kafka(self) -> str:
        """The bootstrap servers, or a ConfigError that says which variable to set."""
        if not self.kafka_bootstrap:
            raise ConfigError(f"{ENV_KAFKA_BOOTSTRAP} is not set (e.g. 127.0.0.1:9092)")
        return self.kafka_bootstrap

    def require_s3(self) -> tuple[str, str, str]:
        """Endpoint, access key and secret key, or a ConfigError naming what is missing or is a
        placeholder (a job must not run with a secret key everyone can read in .env.example)."""
        missing = [
            name
            for name, value in (
                (ENV_S3_ENDPOINT, self.s3_endpoint),
                (ENV_S3_ACCESS_KEY, self.s3_access_key),
                (ENV_S3_SECRET_KEY, self.s3_secret_key),
            )
            if not value
        ]
        if missing:
            raise ConfigError("an s3:// location needs " + ", ".join(missing) + " in the environment")
        assert self.s3_endpoint and self.s3_access_key and self.s3_secret_key
        if PLACEHOLDER.search(self.s3_secret_key.get_secret_value()):  # .env.example's public value
            raise ConfigError(f"{ENV_S3_SECRET_KEY} is a placeholder (a change-me value from .env.example): set the "
                              f"S3 user's real secret key; generate one with {PASSWORD_HOWTO}")
        return (
            self.s3_endpoint,
            self.s3_access_key.get_secret_value(),
            self.s3_secret_key.get_secret_value(),
        )

    def secrets(self) -> list[str]:
        """Secret values to scrub from text before it is logged or stored: only those long enough
        to be worth hiding (see logs.MIN_SECRET_LENGTH), so every scrubber masks the same values."""
        return scrubbable([s.get_secret_value() for s in (self.s3_access_key, self.s3_secret_key) if s])
