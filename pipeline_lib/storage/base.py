"""The object-store contract shared by S3 and local directories.

The checkpoint library and the files sink are written once against this class; each backend
only implements the underscored primitives, so key validation and the documented semantics
live in one place.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable

from pipeline_lib.storage.uri import Location, check_relative

Keys = list[str]  # module-level alias: inside the class, ``list`` names the method


def check_prefix(prefix: str) -> str:
    """A listing prefix: '' or a key-like string that may end in '/' or mid-segment."""
    if prefix:
        check_relative(prefix.removesuffix("/"), "prefix")
    return prefix


class ObjectStore(abc.ABC):
    """Objects under one root Location, addressed by relative '/'-separated keys.

    Writes are atomic (readers see the old or the new object, never a partial one), and
    ``put_if`` is a compare-and-swap on an opaque version token: the commit primitive that
    fences a stale writer out.
    """

    def __init__(self, location: Location):
        self.location = location

    def describe(self) -> str:
        """The root URI, safe to log: it never contains credentials."""
        return str(self.location)

    # -- public API: validates keys, then delegates -----------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Create or replace ``key`` atomically."""
        self._put(check_relative(key), bytes(data))

    def get(self, key: str) -> bytes:
        """The content of ``key``; raises NotFound if it does not exist."""
        return self._get(check_relative(key))

    def get_versioned(self, key: str) -> tuple[bytes, str] | None:
        """Content and version token read together, or None if ``key`` does not exist."""
        return self._get_versioned(check_relative(key))

    def put_if(self, key: str, data: bytes, expected_version: str | None) -> str | None:
        """Write ``key`` only if its version is still ``expected_version`` (None: only if absent).

        Returns the new version token on success and None when the precondition failed (someone
        else wrote first), so the caller can chain the next compare-and-swap without re-reading.
        """
        return self._put_if(check_relative(key), bytes(data), expected_version)

    def exists(self, key: str) -> bool:
        """True if ``key`` exists."""
        return self._exists(check_relative(key))

    def size(self, key: str) -> int:
        """Size in bytes; raises NotFound if ``key`` does not exist."""
        return self._size(check_relative(key))

    def list(self, prefix: str = "") -> Keys:
        """All keys starting with ``prefix`` (a plain string prefix), recursive and sorted."""
        return sorted(self._list(check_prefix(prefix)))

    def list_versions(self, prefix: str = "") -> dict[str, tuple[int, str]]:
        """Each key under ``prefix`` with its size and version token (the token ``get_versioned``
        gives with the content): what pins a table's files (plan.table_pins)."""
        return dict(sorted(self._list_versions(check_prefix(prefix)).items()))

    def copy(self, source: str, target: str) -> None:
        """Create or replace ``target`` with ``source``'s bytes, atomically (readers of ``target``
        see the old or the whole new object); NotFound if ``source`` does not exist. On S3 the
        server copies (no bytes pass through this process)."""
        self._copy(check_relative(source), check_relative(target))

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error (deletes are idempotent)."""
        self._delete_many([check_relative(key)])

    def delete_many(self, keys: Iterable[str]) -> None:
        """Remove several keys, in batches where the backend allows it."""
        checked = [check_relative(k) for k in keys]
        if checked:
            self._delete_many(checked)

    # -- backend primitives: keys are already validated -------------------------------------
    @abc.abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _get_versioned(self, key: str) -> tuple[bytes, str] | None: ...

    @abc.abstractmethod
    def _put_if(self, key: str, data: bytes, expected_version: str | None) -> str | None: ...

    @abc.abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def _size(self, key: str) -> int: ...

    def _list_versions(self, prefix: str) -> dict[str, tuple[int, str]]:
        """Reads every object for its token; a backend whose listing carries it overrides this."""
        found = {}
        for key in self._list(prefix):
            got = self._get_versioned(key)
            if got is not None:
                found[key] = (len(got[0]), got[1])
        return found

    @abc.abstractmethod
    def _list(self, prefix: str) -> Keys: ...

    def _copy(self, source: str, target: str) -> None:
        """Reads and writes; a backend that can copy in place overrides this."""
        self._put(target, self._get(source))

    @abc.abstractmethod
    def _delete_many(self, keys: Keys) -> None: ...
