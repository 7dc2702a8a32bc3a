"""A short-lived cache of the Pipelines page's data, built once however many views ask at once.

Every open page refreshes every 10 s, and each build reads every pipeline's checkpoint store and
asks the broker for lag. Views within ``ttl_s`` share one build; views that arrive during a build
wait for it without holding a thread of the api-server's pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

V = TypeVar("V")


class ViewCache(Generic[V]):
    """Values by key, each kept ``ttl_s`` seconds after it was built; one build per key at a time."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._values: dict[Hashable, tuple[float, V]] = {}
        self._lock = asyncio.Lock()

    async def get(self, key: Hashable, build: Callable[[], V]) -> V:
        """The value of ``key`` built less than ``ttl_s`` ago, else a new one from ``build`` (run in
        the thread pool, while other callers wait on the event loop)."""
        async with self._lock:
            found = self._values.get(key)
            if found is not None and self.clock() - found[0] < self.ttl_s:
                return found[1]
            value = await run_in_threadpool(build)
            self._values[key] = (self.clock(), value)
            return value
