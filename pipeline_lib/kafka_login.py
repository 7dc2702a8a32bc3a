"""Check, once and quickly, that the Kafka cluster is reachable, trusted and accepts the login.

kafka-python retries a failed bootstrap until its timeout and then says only "Unable to
bootstrap": an untrusted certificate, a wrong password and a wrong port all look alike, after
30 s or more (a broker that refuses a SASL login closes the connection without an answer, which
kafka-python takes for a network error). This check makes one connection to a bootstrap server,
with the settings every client uses (kafka_connection), and names what failed: the TCP connect,
the TLS handshake (with the verification error), or the SASL login (mechanism and user, never
the password). It speaks the protocol through kafka-python's own request encoder and SASL
mechanisms, so it logs in exactly as the clients will.
"""

from __future__ import annotations

import socket
import ssl
import time

from pipeline_lib.errors import PipelineError
from pipeline_lib.kafka_connection import KafkaConnection, kafka_connection

LOGIN_TIMEOUT_S = 10.0
_SASL_HANDSHAKE_VERSION = 1  # SaslHandshake v1 + SaslAuthenticate: every broker since Kafka 1.0
_SASL_AUTHENTICATE_VERSION = 1


class KafkaLoginError(PipelineError):
    """The cluster cannot be reached, is not trusted, or refused the login."""


def check_login(kafka: str | KafkaConnection, timeout_s: float = LOGIN_TIMEOUT_S) -> None:
    """Connect to the bootstrap servers in turn until one answers; raise KafkaLoginError naming the
    server and what failed when TLS or SASL fails there, or when none can be reached."""
    conn = kafka_connection(kafka)
    if not conn.uses_tls and not conn.uses_sasl:
        return  # PLAINTEXT: kafka-python's own errors already say what is wrong
    unreachable = []
    for host, port in conn.servers():
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            unreachable.append(f"{host}:{port} ({exc.strerror or exc})")
            continue
        try:
            sock.settimeout(timeout_s)
            if conn.uses_tls:
                sock = _tls(conn, sock, host, port)
            if conn.uses_sasl:
                _sasl_login(conn, sock, host, port, time.monotonic() + timeout_s)
            return
        finally:
            sock.close()
    raise KafkaLoginError(f"cannot reach any Kafka bootstrap server: {', '.join(unreachable)}")


def _tls(conn: KafkaConnection, sock: socket.socket, host: str, port: int) -> ssl.SSLSocket:
    try:
        return conn.ssl_context().wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as exc:
        trusted = (
            "the configured CA (ssl_cafile of the Kafka connection, or PIPELINE_KAFKA_SSL_CAFILE)"
            if conn.ssl_cadata
            else "the system's trusted CAs"
        )
        raise KafkaLoginError(
            f"Kafka broker {host}:{port}: its TLS certificate is not trusted by {trusted}: {exc.verify_message}"
        ) from None
    except (ssl.SSLError, OSError) as exc:
        raise KafkaLoginError(
            f"Kafka broker {host}:{port}: the TLS handshake failed ({exc}); is "
            f"security_protocol {conn.security_protocol} what this listener speaks?"
        ) from None


def _sasl_login(conn: KafkaConnection, sock: socket.socket, host: str, port: int, deadline: float) -> None:
    from kafka import errors as kafka_errors
    from kafka.errors import KafkaError

    from pipeline_lib.kafka_adapter.login import authenticate_request, handshake_request, sasl_mechanism, sasl_protocol

    assert conn.sasl_mechanism is not None, "called for SASL protocols only"
    who = f"Kafka broker {host}:{port}"
    login = f"SASL {conn.sasl_mechanism} login of user {conn.sasl_username!r}"
    protocol = sasl_protocol("pipeline-lib-login-check")

    def exchange(request):
        protocol.send_request(request)
        sock.sendall(protocol.send_bytes())
        while True:
            if time.monotonic() > deadline:
                raise KafkaLoginError(f"{who}: no answer to the {login} in time")
            try:
                data = sock.recv(65536)
            except OSError as exc:
                raise KafkaLoginError(f"{who} refused the {login}: the connection failed ({exc})") from None
            if not data:
                raise KafkaLoginError(
                    f"{who} refused the {login} (it closed the connection): wrong user name or "
                    f"password, or the mechanism is not enabled for this user"
                )
            try:
                responses = protocol.receive_bytes(data)
            except KafkaError as exc:
                raise KafkaLoginError(
                    f"{who} did not answer the {login} as Kafka does ({exc}); is security_protocol "
                    f"{conn.security_protocol} what this listener speaks?"
                ) from None
            if responses:
                return responses[0][1]

    answer = exchange(handshake_request(conn.sasl_mechanism, _SASL_HANDSHAKE_VERSION))
    offered = ", ".join(answer.mechanisms) or "no mechanism"
    if conn.sasl_mechanism not in answer.mechanisms:
        raise KafkaLoginError(f"{who} does not offer SASL {conn.sasl_mechanism}: it offers {offered}")
    if answer.error_code != 0:
        error = kafka_errors.for_code(answer.error_code).__name__
        raise KafkaLoginError(
            f"{who} refused the SASL handshake for {conn.sasl_mechanism} ({error}, error code "
            f"{answer.error_code}; it offers {offered})"
        )
    mechanism = sasl_mechanism(conn.sasl_mechanism, host, conn.client_config())
    while not mechanism.is_done():
        answer = exchange(authenticate_request(mechanism.auth_bytes(), _SASL_AUTHENTICATE_VERSION))
        if answer.error_code != 0:
            raise KafkaLoginError(f"{who} refused the {login}: {answer.error_message or 'authentication failed'}")
        mechanism.receive(answer.auth_bytes)
    if not mechanism.is_authenticated():
        raise KafkaLoginError(f"{who}: the {login} did not complete (the server's proof did not verify)")
