"""A ``python:`` hook that calls ``withWatermark`` is refused, naming the hook.

A hook's DataFrame is one epoch's batch, and Spark drops a watermark on a batch DataFrame as it
builds the plan (no trace of it is left to find afterwards), so the call would be silently
ignored: late records counted, windows never closed by it. The watermark belongs on the source
(``source.kafka.watermark``), where it is part of the snapshot. While a hook runs, its thread's
``withWatermark`` raises instead; other threads (a Spark job of the user's own) are untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pipeline_lib.errors import TransformError

_running = threading.local()  # .hook: the hook running in this thread, as named in errors
_patched: set[type] = set()


def _refusing(original: Callable) -> Callable:
    def withWatermark(self, eventTime: str, delayThreshold: str):  # noqa: N802 - Spark's name
        hook = getattr(_running, "hook", None)
        if hook is not None:
            raise TransformError(
                f"{hook} calls withWatermark({eventTime!r}, {delayThreshold!r}), which Spark ignores on an "
                "epoch's batch DataFrame; declare the watermark on the source instead: "
                "source.kafka.watermark: {column: ..., delay: ...} (docs/spec.md)"
            )
        return original(self, eventTime, delayThreshold)

    return withWatermark


@contextmanager
def no_watermark_in(hook: str, frame_type: type) -> Iterator[None]:
    """Within the block, ``withWatermark`` on ``frame_type`` (this thread) raises naming ``hook``."""
    if frame_type not in _patched:
        frame_type.withWatermark = _refusing(frame_type.withWatermark)  # type: ignore[attr-defined]
        _patched.add(frame_type)
    _running.hook = hook
    try:
        yield
    finally:
        _running.hook = None
