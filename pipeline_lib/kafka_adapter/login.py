"""The SASL exchange of the login check (kafka_login): kafka-python's protocol parser, its
handshake and authenticate requests, and its mechanisms (PLAIN, SCRAM), used on a socket of our
own so that a refused login is named at once instead of after the client's bootstrap timeout."""

from __future__ import annotations

from typing import Any

from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest


def sasl_protocol(client_id: str) -> KafkaProtocol:
    """A request encoder and response parser for one connection (``send_request``, ``send_bytes``,
    ``receive_bytes``)."""
    return KafkaProtocol(client_id=client_id)


def handshake_request(mechanism: str, version: int) -> Any:
    """SaslHandshake at ``version``: which mechanisms the broker offers."""
    request = SaslHandshakeRequest(mechanism=mechanism)
    request.API_VERSION = version
    return request


def authenticate_request(auth_bytes: bytes, version: int) -> Any:
    """SaslAuthenticate at ``version``: one step of a mechanism's exchange."""
    request = SaslAuthenticateRequest(auth_bytes=auth_bytes)
    request.API_VERSION = version
    return request


def sasl_mechanism(name: str, host: str, config: dict[str, Any]) -> Any:
    """kafka-python's mechanism ``name`` for ``host`` with the client's settings (``auth_bytes``,
    ``receive``, ``is_done``, ``is_authenticated``)."""
    return get_sasl_mechanism(name)(host=host, **config)
