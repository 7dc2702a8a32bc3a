"""A real object store that notes every call and can act right after one: tests of the commit
protocol see the order of writes, or let another attempt act at an exact step, without a mock."""

from __future__ import annotations

from collections.abc import Callable

from pipeline_lib.checkpoint import layout
from pipeline_lib.storage import ObjectStore


class Watched(ObjectStore):
    """A real store, each call noted in ``log`` as (name, op, key) and then passed to ``after``."""

    def __init__(self, inner: ObjectStore, name: str, log: list, after: Callable[[str, str], None] | None = None):
        super().__init__(inner.location)
        self.inner, self.name, self.log, self.after = inner, name, log, after

    def _note(self, op: str, key: str) -> None:
        self.log.append((self.name, op, key))
        if self.after is not None:
            self.after(op, key)

    def _put(self, key, data):
        self.inner.put(key, data)
        self._note("put", key)

    def _put_if(self, key, data, expected_version):
        found = self.inner.put_if(key, data, expected_version)
        self._note("put_if" if found is not None else "put_if-refused", key)
        return found

    def _get(self, key):
        data = self.inner.get(key)
        self._note("get", key)
        return data

    def _get_versioned(self, key):
        found = self.inner.get_versioned(key)
        self._note("get_versioned", key)
        return found

    def _exists(self, key):
        return self.inner.exists(key)

    def _size(self, key):
        return self.inner.size(key)

    def _list(self, prefix):
        keys = self.inner.list(prefix)
        self._note("list", prefix)
        return keys

    def _copy(self, source, target):
        self.inner.copy(source, target)
        self._note("copy", target)

    def _delete_many(self, keys):
        self.inner.delete_many(keys)
        for key in keys:
            self._note("delete", key)


def once(when: Callable[[str, str], bool], action: Callable[[], None]) -> Callable[[str, str], None]:
    """An ``after`` hook that runs ``action`` right after the first call ``when(op, key)`` accepts."""
    pending = [action]

    def after(op: str, key: str) -> None:
        if pending and when(op, key):
            pending.pop()()

    return after


def commit_step(entry: tuple[str, str, str], head: str = "head") -> str | None:
    """What a logged call (store, op, key) or fault point ("fault", name, "") is to an epoch's
    commit; None for a read that changes nothing. ``head`` names the HEAD write."""
    store, op, key = entry
    if store == "fault":
        return f"fault {op}"
    if op == "get_versioned" and key == layout.HEAD_KEY:
        return "head check"
    if op == "delete":
        return "clean-up"
    if store == "pub" and op in ("put", "put_if", "copy"):
        return "publish"  # a files sink's committed epoch copied to its folder
    if op not in ("put", "put_if"):
        return None
    if store in ("out", "dlq"):
        return f"{store} marker" if key.endswith("/_SUCCESS") else f"{store} part"
    for prefix, kind in (
        (layout.STATE_PREFIX, "state"),
        (layout.MANIFESTS_PREFIX, "manifest"),
        (layout.HEAD_KEY, head),
    ):
        if key.startswith(prefix):
            return kind
    return key
