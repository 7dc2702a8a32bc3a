"""Connection settings, read from the environment and never from a spec file.

Secrets are ``SecretStr`` so that a repr, a log line or a pydantic dump cannot leak them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, SecretStr

from pipeline_lib.errors import ConfigError
from pipeline_lib.kafka_connection import PROTOCOLS, SASL_MECHANISMS, KafkaConnection
from pipeline_lib.logs import scrubbable
from pipeline_lib.secret_check import PASSWORD_HOWTO, PLACEHOLDER

ENV_KAFKA_BOOTSTRAP = "PIPELINE_KAFKA_BOOTSTRAP"
ENV_KAFKA_SECURITY_PROTOCOL = "PIPELINE_KAFKA_SECURITY_PROTOCOL"
ENV_KAFKA_SASL_MECHANISM = "PIPELINE_KAFKA_SASL_MECHANISM"
ENV_KAFKA_SASL_USERNAME = "PIPELINE_KAFKA_SASL_USERNAME"
ENV_KAFKA_SASL_PASSWORD = "PIPELINE_KAFKA_SASL_PASSWORD"
ENV_KAFKA_SSL_CAFILE = "PIPELINE_KAFKA_SSL_CAFILE"
# Set only for a cluster that needs them: a PLAINTEXT cluster must leave them unset.
KAFKA_SECURED_ONLY = (ENV_KAFKA_SASL_MECHANISM, ENV_KAFKA_SASL_USERNAME, ENV_KAFKA_SASL_PASSWORD, ENV_KAFKA_SSL_CAFILE)
ENV_S3_ENDPOINT = "PIPELINE_S3_ENDPOINT"
ENV_S3_ACCESS_KEY = "PIPELINE_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY = "PIPELINE_S3_SECRET_KEY"
ENV_S3_REGION = "PIPELINE_S3_REGION"
ENV_SPARK_MASTER = "PIPELINE_SPARK_MASTER"


class ConnectionSettings(BaseModel, frozen=True):
    """Where the broker and the object store are, and how to log in to them."""

    kafka_bootstrap: str | None = None
    kafka_security_protocol: str | None = None  # PLAINTEXT when unset
    kafka_sasl_mechanism: str | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: str | None = None  # a PEM file; unset: the system's trusted CAs
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
        password = env.get(ENV_KAFKA_SASL_PASSWORD) or None  # a password is taken as it is, spaces too
        return cls(
            kafka_bootstrap=get(ENV_KAFKA_BOOTSTRAP),
            kafka_security_protocol=get(ENV_KAFKA_SECURITY_PROTOCOL),
            kafka_sasl_mechanism=get(ENV_KAFKA_SASL_MECHANISM),
            kafka_sasl_username=get(ENV_KAFKA_SASL_USERNAME),
            kafka_sasl_password=SecretStr(password) if password else None,
            kafka_ssl_cafile=get(ENV_KAFKA_SSL_CAFILE),
            s3_endpoint=get(ENV_S3_ENDPOINT),
            s3_access_key=SecretStr(access) if access else None,
            s3_secret_key=SecretStr(secret) if secret else None,
            s3_region=get(ENV_S3_REGION) or "us-east-1",
            spark_master=get(ENV_SPARK_MASTER),
        )

    def require_kafka(self) -> KafkaConnection:
        """The cluster to connect to, or a ConfigError naming the variable that is missing or
        wrong: the bootstrap servers, then the security settings (kafka_security)."""
        if not self.kafka_bootstrap:
            raise ConfigError(f"{ENV_KAFKA_BOOTSTRAP} is not set (e.g. 127.0.0.1:9092)")
        for server in self.kafka_bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(f"{ENV_KAFKA_BOOTSTRAP}: {server.strip()!r} is not host:port")
        return self.kafka_security(self.kafka_bootstrap)

    def kafka_security(self, bootstrap: str) -> KafkaConnection:
        """``bootstrap`` with the security settings, checked: a known protocol; with SASL a known
        mechanism, a user name and a password; no SASL setting without a SASL protocol (it would
        be ignored, and the job would connect without logging in); a CA file that holds a PEM
        certificate, read here so that the executors get its text, not a path."""
        protocol = (self.kafka_security_protocol or "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise ConfigError(
                f"{ENV_KAFKA_SECURITY_PROTOCOL} is {self.kafka_security_protocol!r}: choose one of "
                f"{', '.join(PROTOCOLS)}"
            )
        mechanism = (self.kafka_sasl_mechanism or "").upper() or None
        given = [
            name
            for name, value in (
                (ENV_KAFKA_SASL_MECHANISM, mechanism),
                (ENV_KAFKA_SASL_USERNAME, self.kafka_sasl_username),
                (ENV_KAFKA_SASL_PASSWORD, self.kafka_sasl_password),
            )
            if value
        ]
        if protocol.startswith("SASL_"):
            missing = [
                name
                for name in (ENV_KAFKA_SASL_MECHANISM, ENV_KAFKA_SASL_USERNAME, ENV_KAFKA_SASL_PASSWORD)
                if name not in given
            ]
            if missing:
                raise ConfigError(f"{ENV_KAFKA_SECURITY_PROTOCOL} {protocol} needs {', '.join(missing)}")
            if mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    f"{ENV_KAFKA_SASL_MECHANISM} is {self.kafka_sasl_mechanism!r}: choose one of "
                    f"{', '.join(SASL_MECHANISMS)}"
                )
            assert self.kafka_sasl_password is not None
            if PLACEHOLDER.search(self.kafka_sasl_password.get_secret_value()):
                raise ConfigError(
                    f"{ENV_KAFKA_SASL_PASSWORD} is a placeholder (a change-me value): set the Kafka "
                    "user's real password"
                )
        elif given:
            raise ConfigError(
                f"{', '.join(given)} set but {ENV_KAFKA_SECURITY_PROTOCOL} is {protocol}: set it to "
                "SASL_SSL (or SASL_PLAINTEXT) to log in"
            )
        cadata = None
        if self.kafka_ssl_cafile:
            if protocol not in ("SSL", "SASL_SSL"):
                raise ConfigError(
                    f"{ENV_KAFKA_SSL_CAFILE} set but {ENV_KAFKA_SECURITY_PROTOCOL} is {protocol}: set "
                    "it to SSL or SASL_SSL to use TLS"
                )
            try:
                cadata = Path(self.kafka_ssl_cafile).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"{ENV_KAFKA_SSL_CAFILE}: cannot read {self.kafka_ssl_cafile}: "
                    f"{getattr(exc, 'strerror', None) or exc}"
                ) from None
            if "-----BEGIN CERTIFICATE-----" not in cadata:
                raise ConfigError(f"{ENV_KAFKA_SSL_CAFILE}: {self.kafka_ssl_cafile} holds no PEM certificate")
        return KafkaConnection(
            bootstrap=bootstrap,
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=self.kafka_sasl_password,
            ssl_cadata=cadata,
        )

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
            raise ConfigError(
                f"{ENV_S3_SECRET_KEY} is a placeholder (a change-me value from .env.example): set the "
                f"S3 user's real secret key; generate one with {PASSWORD_HOWTO}"
            )
        return (
            self.s3_endpoint,
            self.s3_access_key.get_secret_value(),
            self.s3_secret_key.get_secret_value(),
        )

    def secrets(self) -> list[str]:
        """Secret values to scrub from text before it is logged or stored: only those long enough
        to be worth hiding (see logs.MIN_SECRET_LENGTH), so every scrubber masks the same values."""
        return scrubbable(
            [s.get_secret_value() for s in (self.s3_access_key, self.s3_secret_key, self.kafka_sasl_password) if s]
        )
