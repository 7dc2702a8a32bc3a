"""The S3 store, on the ``minio`` client, with a real conditional write for ``put_if``.

Transient failures (connection refused or reset, timeouts, 5xx, SlowDown) are retried here
with bounded exponential backoff, and urllib3's own retries are off so that an outage reaches
this policy instead of hanging inside the client. Every error message is scrubbed of the
access and secret key before it leaves this module.
"""

from __future__ import annotations

import io
import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import certifi
import urllib3
from minio import Minio
from minio.commonconfig import CopySource
from minio.deleteobjects import DeleteObject
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
    wait_random,
)

from pipeline_lib.errors import ConfigError, NotFound, StorageError
from pipeline_lib.logs import scrub
from pipeline_lib.settings import ENV_S3_ENDPOINT, ConnectionSettings
from pipeline_lib.storage.base import Keys, ObjectStore
from pipeline_lib.storage.uri import Location

ENV_S3_RETRY_SECONDS = "PIPELINE_S3_RETRY_SECONDS"

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_CODES = {"SlowDown", "InternalError", "ServiceUnavailable", "RequestTimeout"}
_LOST_RACE_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_TRANSIENT_NETWORK = (
    urllib3.exceptions.TimeoutError,  # includes connection refused (NewConnectionError)
    urllib3.exceptions.ProtocolError,  # connection reset / aborted mid-response
    urllib3.exceptions.IncompleteRead,
    ConnectionError,
    TimeoutError,
)
_FAILURES = (MinioException, urllib3.exceptions.HTTPError, OSError)


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep retrying a transient S3 failure before giving up."""

    total_seconds: float = 30.0
    max_attempts: int = 12
    first_wait: float = 0.2
    max_wait: float = 5.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """The default policy, with its time budget from PIPELINE_S3_RETRY_SECONDS if set."""
        raw = (os.environ if env is None else env).get(ENV_S3_RETRY_SECONDS, "").strip()
        if not raw:
            return cls()
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ConfigError(f"{ENV_S3_RETRY_SECONDS} must be a number of seconds >= 0, got {raw!r}")
        return cls(total_seconds=seconds)

    def retrying(self, before_sleep: Callable[[RetryCallState], None]) -> Retrying:
        """A tenacity retrier for transient failures only, bounded by attempts and total time."""
        return Retrying(
            stop=stop_after_attempt(self.max_attempts) | stop_before_delay(self.total_seconds),
            wait=wait_exponential(multiplier=self.first_wait, max=self.max_wait) + wait_random(0, self.first_wait),
            retry=retry_if_exception(is_transient),
            before_sleep=before_sleep,
            reraise=True,
        )


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the network or the server hiccupped, the request itself is fine."""
    if isinstance(exc, S3Error):
        return exc.code in _TRANSIENT_CODES or exc.response.status >= 500
    if isinstance(exc, ServerError):
        return exc.status_code >= 500 or exc.status_code == 429
    if isinstance(exc, InvalidResponseError):  # a non-XML error page, e.g. from a proxy
        return exc._code >= 500 or exc._code == 429  # minio keeps the status only here
    return isinstance(exc, _TRANSIENT_NETWORK)


def _lost_race(exc: S3Error) -> bool:
    return exc.code in _LOST_RACE_CODES or exc.response.status == 412


def _endpoint(url: str) -> tuple[str, bool]:
    """host[:port] and whether to use TLS, from an http(s):// endpoint URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{ENV_S3_ENDPOINT} must look like http://host:port or https://host, got {url!r}")
    if parts.username or parts.password:
        raise ConfigError(f"{ENV_S3_ENDPOINT} must not contain credentials; set the access and secret key variables")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"{ENV_S3_ENDPOINT} must not have a path, got {parts.path!r}")
    return parts.netloc, parts.scheme == "https"


def _http_pool() -> urllib3.PoolManager:
    """Short timeouts and no urllib3 retries: tenacity owns the retry policy."""
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=5.0, read=30.0),
        retries=False,
        maxsize=16,
        cert_reqs="CERT_REQUIRED",
        ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
    )


class S3Store(ObjectStore):
    """Objects under ``s3://bucket/prefix``; the bucket is created on first use if missing."""

    def __init__(self, location: Location, settings: ConnectionSettings, retry: RetryPolicy | None = None):
        if location.scheme != "s3":
            raise ValueError(f"S3Store needs an s3:// location, got {location}")
        super().__init__(location)
        endpoint, access_key, secret_key = settings.require_s3()
        host, secure = _endpoint(endpoint)
        self._client = Minio(
            host, access_key, secret_key, secure=secure, region=settings.s3_region, http_client=_http_pool()
        )
        self._secrets = [s for s in settings.secrets() if s]
        self._retry = retry or RetryPolicy.from_env()
        self._bucket = location.bucket
        self._root = f"{location.path}/" if location.path else ""
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()

    # -- helpers ----------------------------------------------------------------------------
    def _name(self, key: str) -> str:
        return self._root + key

    def _where(self, key: str | None) -> str:
        return f"s3://{self._bucket}/{self._name(key)}" if key is not None else f"s3://{self._bucket}"

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _detail(self, exc: BaseException) -> str:
        if isinstance(exc, S3Error):
            return self._scrub(f"{exc.code}: {exc.message}")
        return self._scrub(f"{type(exc).__name__}: {exc}")

    def _attempt(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the retry policy; map failures to NotFound / scrubbed StorageError."""

        def before_sleep(state: RetryCallState) -> None:
            assert state.outcome is not None and state.next_action is not None
            exc = state.outcome.exception()
            assert exc is not None, "retried on exceptions only (retry_if_exception)"
            log.warning(
                "S3 %s of %s failed (%s); retry %d in %.1f s",
                op,
                self._where(key),
                self._detail(exc),
                state.attempt_number,
                state.next_action.sleep,
            )

        retrying = self._retry.retrying(before_sleep)
        try:
            return retrying(fn)
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                raise NotFound(f"{self._where(key)} does not exist") from None
            failure: BaseException = exc
        except _FAILURES as exc:
            failure = exc
        tries = retrying.statistics.get("attempt_number", 1)
        # ``from None``: the original exception may carry request details; the scrubbed text is enough.
        raise StorageError(
            f"S3 {op} of {self._where(key)} failed after {tries} attempt(s): {self._detail(failure)}"
        ) from None

    def _call(self, op: str, key: str | None, fn: Callable[[], T]) -> T:
        if not self._bucket_ready:
            self._ensure_bucket()
        return self._attempt(op, key, fn)

    def _ensure_bucket(self) -> None:
        """Create the bucket once; concurrent creators (threads or processes) are fine."""

        def create() -> None:
            if self._client.bucket_exists(self._bucket):
                return
            try:
                self._client.make_bucket(self._bucket)
            except S3Error as exc:
                if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        with self._bucket_lock:
            if not self._bucket_ready:
                self._attempt("bucket check/create", None, create)
                self._bucket_ready = True

    def _read(self, name: str) -> tuple[bytes, str]:
        response = self._client.get_object(self._bucket, name)
        try:
            return response.read(), response.headers.get("ETag", "").strip('"')
        finally:
            response.close()
            response.release_conn()

    # -- primitives -------------------------------------------------------------------------
    def _put(self, key: str, data: bytes) -> None:
        name = self._name(key)
        self._call("write", key, lambda: self._client.put_object(self._bucket, name, io.BytesIO(data), len(data)))

    def _put_if(self, key: str, data: bytes, expected_version: str | None) -> str | None:
        """A real conditional PUT: ``If-None-Match: *`` to create, ``If-Match: "<etag>"`` to replace.

        ``Minio.put_object`` turns extra headers into ``x-amz-meta-*``, so this goes through the
        client's private ``_put_object``, which passes headers verbatim to the signed ``_execute``.
        If a retried attempt meets 412, an earlier attempt may have won with its reply lost; that
        is reported as a lost race (None): the safe side, since the caller then stops writing.
        ``If-Match`` on a key that is gone is a lost race too: AWS and moto answer 404 NoSuchKey
        there, SeaweedFS 412, and the contract (LocalStore alike) is None either way.
        """
        name = self._name(key)
        condition = {"If-None-Match": "*"} if expected_version is None else {"If-Match": f'"{expected_version}"'}

        def write() -> str | None:
            try:
                result = self._client._put_object(self._bucket, name, data, headers=dict(condition))
            except S3Error as exc:
                if _lost_race(exc) or (expected_version is not None and exc.code == "NoSuchKey"):
                    return None
                raise
            return result.etag

        return self._call("conditional write", key, write)

    def _get(self, key: str) -> bytes:
        return self._call("read", key, lambda: self._read(self._name(key)))[0]

    def _get_versioned(self, key: str) -> tuple[bytes, str] | None:
        try:
            return self._call("read", key, lambda: self._read(self._name(key)))
        except NotFound:
            return None

    def _exists(self, key: str) -> bool:
        try:
            self._size(key)
        except NotFound:
            return False
        return True

    def _size(self, key: str) -> int:
        stat = self._call("stat", key, lambda: self._client.stat_object(self._bucket, self._name(key)))
        return stat.size or 0

    def _copy(self, source: str, target: str) -> None:
        """A server-side copy (``x-amz-copy-source``): one request, no bytes through this process."""
        copied = CopySource(self._bucket, self._name(source))
        self._call("copy", source, lambda: self._client.copy_object(self._bucket, self._name(target), copied))

    def _list(self, prefix: str) -> Keys:
        def listing() -> Keys:
            objects = self._client.list_objects(self._bucket, prefix=self._root + prefix, recursive=True)
            return [o.object_name[len(self._root) :] for o in objects if o.object_name and not o.is_dir]

        return self._call("list", prefix, listing)

    def _list_versions(self, prefix: str) -> dict[str, tuple[int, str]]:
        def listing() -> dict[str, tuple[int, str]]:
            objects = self._client.list_objects(self._bucket, prefix=self._root + prefix, recursive=True)
            return {
                o.object_name[len(self._root) :]: (o.size or 0, (o.etag or "").strip('"'))
                for o in objects
                if o.object_name and not o.is_dir
            }

        return self._call("list", prefix, listing)

    def _delete_many(self, keys: Keys) -> None:
        def delete() -> None:
            batch = [DeleteObject(self._name(k)) for k in keys]
            errors = [e for e in self._client.remove_objects(self._bucket, batch) if e.code != "NoSuchKey"]
            if errors:
                first = errors[0]
                raise StorageError(
                    self._scrub(
                        f"S3 delete in s3://{self._bucket} failed for {len(errors)} of {len(keys)} keys, "
                        f"first {first.name}: {first.code}: {first.message}"
                    )
                )

        self._call("delete", keys[0] if len(keys) == 1 else f"{keys[0]} (+{len(keys) - 1} more)", delete)
