"""How to reach and log in to a Kafka cluster: the bootstrap servers, TLS and SASL.

One picklable value that every Kafka client of the library is made from (``client_config``).
It travels to the executors inside the task closures of a read, as the bootstrap address does,
never in Spark's configuration or a command line. The CA certificate travels as its PEM text,
read on the driver, so the executors need no file at the driver's path; the TLS context is built
where the client is made (an ``ssl.SSLContext`` does not pickle). The password is a ``SecretStr``,
and is left out of the repr.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a password comes as pydantic's SecretStr; without one a worker needs no pydantic
    from pydantic import SecretStr

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaConnection:
    """The bootstrap servers and the security settings of one cluster (checked by
    settings.ConnectionSettings.require_kafka, which builds it)."""

    bootstrap: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = field(default=None, repr=False)
    ssl_cadata: str | None = field(default=None, repr=False)  # PEM; None: the system's trusted CAs

    @property
    def uses_tls(self) -> bool:
        """True for SSL and SASL_SSL."""
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """True for SASL_PLAINTEXT and SASL_SSL."""
        return self.security_protocol.startswith("SASL_")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that verifies the broker's certificate and host name against the
        configured CA (or the system's)."""
        context = (
            ssl.create_default_context(cadata=self.ssl_cadata) if self.ssl_cadata else ssl.create_default_context()
        )
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    def client_config(self) -> dict[str, Any]:
        """kafka-python's configuration keys for a client of this cluster."""
        config: dict[str, Any] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.uses_tls:
            config["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            config["sasl_mechanism"] = self.sasl_mechanism
            config["sasl_plain_username"] = self.sasl_username
            config["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        return config

    def servers(self) -> list[tuple[str, int]]:
        """The bootstrap servers as (host, port) pairs."""
        pairs = []
        for server in self.bootstrap.split(","):
            host, _, port = server.strip().rpartition(":")
            pairs.append((host.strip("[]"), int(port)))
        return pairs


def kafka_connection(kafka: str | KafkaConnection) -> KafkaConnection:
    """``kafka`` as a KafkaConnection: a bare bootstrap address is a PLAINTEXT cluster."""
    return kafka if isinstance(kafka, KafkaConnection) else KafkaConnection(bootstrap=kafka)


def client_config(kafka: str | KafkaConnection, **config: Any) -> dict[str, Any]:
    """kafka-python's configuration for a client of ``kafka``, with ``config`` added."""
    return {**kafka_connection(kafka).client_config(), **config}
