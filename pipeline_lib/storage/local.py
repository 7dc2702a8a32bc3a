"""A local directory with the same guarantees as the S3 store.

Atomicity comes from writing a temporary file in the target directory, fsyncing it and
``os.replace``-ing it over the key, then fsyncing the directory, so a crash leaves the old or
the new object. Every replace and delete happens under an ``flock`` on a lock file in the root,
which makes ``put_if``'s check-then-replace atomic across threads and processes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline_lib.errors import NotFound, StorageError
from pipeline_lib.storage.base import Keys, ObjectStore
from pipeline_lib.storage.uri import Location

# Names the store keeps for itself (temporary files, the lock); listings skip them.
RESERVED = ".pipeline-"
LOCK_NAME = RESERVED + "lock"
_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(directory: Path) -> None:
    """mkdir -p, fsyncing the parent of every directory created so the new entries survive a crash."""
    if directory.is_dir():
        return
    _make_dirs(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:
        return
    _fsync_dir(directory.parent)


def _version(st: os.stat_result, data: bytes) -> str:
    """Time and size tell apart rewrites with equal content (A-B-A); the hash covers coarse clocks."""
    return f"{st.st_mtime_ns}-{st.st_size}-{hashlib.sha256(data).hexdigest()[:16]}"  # guard: local-version-size-only


class LocalStore(ObjectStore):
    """Objects as files below an absolute directory (created on first write)."""

    def __init__(self, location: Location):
        if location.scheme != "file":
            raise ValueError(f"LocalStore needs a file:// location, got {location}")
        super().__init__(location)
        self.root = Path(location.path)

    # -- helpers ----------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        if any(segment.startswith(RESERVED) for segment in key.split("/")):
            raise ValueError(f"key {key!r}: names starting with {RESERVED!r} are reserved by the local store")
        return self.root / key

    @staticmethod
    @contextmanager
    def _errors(op: str, path: Path) -> Iterator[None]:
        """Turn OS errors into StorageError naming the operation and the file."""
        try:
            yield
        except OSError as exc:
            raise StorageError(f"{op} {path} failed: {exc.strerror or exc}") from exc

    @contextmanager
    def _locked(self) -> Iterator[None]:
        _make_dirs(self.root)
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    @staticmethod
    def _write_temp(path: Path, data: bytes) -> Path:
        """A fully written, fsynced file next to ``path``, ready to be renamed over it."""
        _make_dirs(path.parent)
        tmp = path.parent / f"{RESERVED}{uuid.uuid4().hex}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @staticmethod
    def _publish(tmp: Path, path: Path) -> None:
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    @staticmethod
    def _read(path: Path) -> tuple[bytes, str] | None:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())  # the inode we read, even if replaced meanwhile
                data = f.read()
        except _MISSING:
            return None
        return data, _version(st, data)

    # -- primitives -------------------------------------------------------------------------
    def _put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._errors("write", path):
            tmp = self._write_temp(path, data)
            try:
                with self._locked():
                    self._publish(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)

    def _put_if(self, key: str, data: bytes, expected_version: str | None) -> str | None:
        path = self._path(key)
        with self._errors("conditional write", path):
            tmp = self._write_temp(path, data)
            try:
                with self._locked():
                    current = self._read(path)
                    if (current[1] if current else None) != expected_version:  # guard: local-put-if-no-precondition
                        return None
                    self._publish(tmp, path)
                    return _version(path.stat(), data)
            finally:
                tmp.unlink(missing_ok=True)

    def _get(self, key: str) -> bytes:
        found = self._get_versioned(key)
        if found is None:
            raise NotFound(f"{self.location.child(key)} does not exist")
        return found[0]

    def _get_versioned(self, key: str) -> tuple[bytes, str] | None:
        path = self._path(key)
        with self._errors("read", path):
            return self._read(path)

    def _exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _size(self, key: str) -> int:
        path = self._path(key)
        with self._errors("stat", path):
            try:
                st = path.stat()
            except _MISSING:
                st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            raise NotFound(f"{self.location.child(key)} does not exist")
        return st.st_size

    def _list(self, prefix: str) -> Keys:
        start = self.root / prefix.rpartition("/")[0]
        keys = []
        with self._errors("list", start):
            for directory, _, files in os.walk(start):
                rel = Path(directory).relative_to(self.root).as_posix()
                for name in files:
                    key = name if rel == "." else f"{rel}/{name}"
                    if not name.startswith(RESERVED) and key.startswith(prefix):
                        keys.append(key)
        return keys

    def _delete_many(self, keys: Keys) -> None:
        paths = [self._path(k) for k in keys]
        if not self.root.is_dir():
            return
        with self._errors("delete", paths[0]), self._locked():
            touched = set()
            for path in paths:
                try:
                    path.unlink()
                except _MISSING:
                    continue
                touched.add(path.parent)
            for directory in touched:
                _fsync_dir(directory)
