"""SeaweedFS's own credentials, so that the embedded S3 server is reachable only through the S3 API.

``weed mini`` runs a master, a volume server, a filer and an admin server beside the S3 gateway,
each with an HTTP and a gRPC port on 127.0.0.1. Without configuration they take reads and writes
from anyone on the machine: the filer's HTTP API rewrites a checkpoint's ``HEAD`` and the master
hands out the tokens that read or write any volume file. This module writes the ``security.toml``
that closes them:

- mutual TLS on every HTTP port but the S3 API's (``[https.*]`` with a ``ca``: a client must show
  a certificate our CA signed) and on every gRPC port, TCP and unix socket (``[grpc.*]``);
- besides, JWTs signed with random keys for every volume and filer read and write (``[jwt.*]``).

A fresh CA, certificate and keys are made at every start: all components run in one process, so
nothing outside it needs them. The CA's key is deleted once it has signed. Everything is in one
directory of mode 0700 (files 0600), which weed reads as its working directory; no secret is on
an argv (openssl's or weed's) or in a log.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from pipeline_lib.localstack.tls_files import _openssl

SECURITY_FILE = "security.toml"
# The weed mini components that serve gRPC, and "client": what every component presents when it dials.
GRPC_SECTIONS = ("master", "volume", "filer", "s3", "admin", "worker", "client")
# The components whose HTTP port demands a client certificate; the S3 port is not among them.
HTTPS_SECTIONS = ("master", "volume", "filer", "admin")
JWT_SECTIONS = ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read")
_CERT_DAYS = "3650"  # a `stack up` may run for months; the files are remade at each start anyway
_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def make_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, certificate, key): one certificate for every component, as server and client.

    SeaweedFS checks the chain, not the host name. EC keys: openssl makes them in milliseconds.
    """
    ca_cert, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    _openssl(
        "req",
        "-x509",
        *_EC_KEY,
        "-days",
        _CERT_DAYS,
        "-subj",
        "/CN=pipeline-lib weed CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca_cert),
        cwd=directory,
    )
    cert, key, csr, ext = directory / "weed.pem", directory / "weed-key.pem", directory / "weed.csr", directory / "ext"
    _openssl("req", *_EC_KEY, "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(csr), cwd=directory)
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-set_serial",
        str(secrets.randbits(63)),
        "-days",
        _CERT_DAYS,
        "-extfile",
        str(ext),
        "-out",
        str(cert),
        cwd=directory,
    )
    for leftover in (ca_key, csr, ext):
        leftover.unlink()
    for path in (ca_cert, cert, key):
        os.chmod(path, 0o600)
    return ca_cert, cert, key


def security_toml(ca_cert: Path, cert: Path, key: Path, jwt_keys: Mapping[str, str]) -> str:
    """The text of security.toml: ``jwt_keys`` maps each of JWT_SECTIONS to its signing key."""

    def q(value: object) -> str:
        return json.dumps(str(value))  # a JSON string is a TOML basic string

    lines = ["[access]", "ui = false", "[filer.expose_directory_metadata]", "enabled = false"]
    for section in JWT_SECTIONS:
        lines += [f"[{section}]", f"key = {q(jwt_keys[section])}", "expires_after_seconds = 10"]
    lines += ["[grpc]", f"ca = {q(ca_cert)}"]
    for name in GRPC_SECTIONS:
        lines += [f"[grpc.{name}]", f"cert = {q(cert)}", f"key = {q(key)}"]
    for name in HTTPS_SECTIONS:
        lines += [f"[https.{name}]", f"cert = {q(cert)}", f"key = {q(key)}", f"ca = {q(ca_cert)}"]
    lines += ["[https.client]", "enabled = true", f"cert = {q(cert)}", f"key = {q(key)}", f"ca = {q(ca_cert)}"]
    return "\n".join(lines) + "\n"


def write_security_config(directory: Path) -> Path:
    """Make ``directory`` (mode 0700) with fresh certificates and security.toml; return the file's path."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)  # in case it existed with wider permissions
    ca_cert, cert, key = make_certificates(directory)
    path = directory / SECURITY_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(security_toml(ca_cert, cert, key, {name: secrets.token_hex(32) for name in JWT_SECTIONS}))
    return path
