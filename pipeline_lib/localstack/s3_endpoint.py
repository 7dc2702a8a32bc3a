"""How to reach a running S3 server of the local stack, whichever server it is.

Shared by the SeaweedFS and moto launchers, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import urllib3
from minio import Minio

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Server:
    """A running S3 server (SeaweedFS or moto) and how to reach it."""

    pid: int
    binary: str
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    ports: dict[str, int]
    log_path: Path


def s3_client(endpoint: str, access_key: str, secret_key: str, *, fail_fast: bool = False) -> Minio:
    """A minio client for the server; ``fail_fast`` = short timeouts and no retries (for probes)."""
    host = endpoint.split("://", 1)[-1].rstrip("/")
    http = None
    if fail_fast:
        http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=3.0), retries=False)
    return Minio(
        host,
        access_key=access_key,
        secret_key=secret_key,
        secure=endpoint.startswith("https"),
        region=REGION,
        http_client=http,
    )
