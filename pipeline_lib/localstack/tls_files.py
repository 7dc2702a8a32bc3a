"""A throwaway certificate authority and a broker certificate, made with ``openssl``, for a test
broker's TLS listeners.

Secured Kafka is tested against a real broker, whose certificate must chain to a CA the clients
are told to trust and name the address they connect to (127.0.0.1; kafka-python checks the
hostname). Every file is written 0600 in a directory of the caller's; the keys are unencrypted
PKCS#8, the form Kafka's PEM keystore (``ssl.keystore.type=PEM``) reads without a key password.
No secret passes through openssl's argv: there is none (the keys are not encrypted).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline_lib.localstack.processes import StackError


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate (what clients trust), and the broker's key and chain."""

    ca_cert: Path
    broker_key: Path
    broker_chain: Path  # the broker's certificate then the CA's


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise StackError("making test certificates needs openssl on PATH")
    done = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise StackError(f"openssl {args[0]} failed (exit {done.returncode}): {done.stderr[-2000:]}")


def make_ca(directory: Path, name: str = "pipeline-lib test CA") -> tuple[Path, Path]:
    """A self-signed CA in ``directory``: (certificate, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{_slug(name)}.pem", directory / f"{_slug(name)}-key.pem"
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        cwd=directory,
    )
    _private(key, cert)
    return cert, key


def make_tls_files(directory: Path, host: str = "127.0.0.1") -> TlsFiles:
    """A CA and a broker certificate for ``host`` (as an IP and as ``localhost``) signed by it."""
    ca_cert, ca_key = make_ca(directory)
    key, csr, cert = directory / "broker-key.pem", directory / "broker.csr", directory / "broker.pem"
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN={host}",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        cwd=directory,
    )
    ext = directory / "broker.ext"
    ext.write_text(f"subjectAltName=IP:{host},DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca_cert),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(ext),
        "-out",
        str(cert),
        cwd=directory,
    )
    chain = directory / "broker-chain.pem"
    chain.write_text(cert.read_text() + ca_cert.read_text())
    _private(key, cert, chain)
    return TlsFiles(ca_cert, key, chain)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower())


def _private(*paths: Path) -> None:
    for path in paths:
        os.chmod(path, 0o600)
