"""Named crash points, for proving exactly-once under SIGKILL.

Disabled unless ``PIPELINE_FAULT_POINTS`` is set, e.g. ``after_sink_success@3`` (kill the run
at that point of epoch 3) or ``during_read`` (every time it is reached). A hit SIGKILLs the
whole process group — the runner, the Spark JVM and its Python workers — like a lost machine.
"""

from __future__ import annotations

import os
import signal
import sys
import time

ENV_FAULT_POINTS = "PIPELINE_FAULT_POINTS"
ENV_FAULT_PGID = "PIPELINE_FAULT_PGID"
ENV_FAULT_LOG = "PIPELINE_FAULT_LOG"  # optional file that records each hit (survives the kill)
# Instead of killing, hold the process at the point until this file exists: a deterministic way
# to keep a "zombie" attempt alive while a newer one runs (tests of fencing).
ENV_FAULT_PAUSE_UNTIL = "PIPELINE_FAULT_PAUSE_UNTIL"
PAUSE_LIMIT_S = 600

POINTS = (
    "after_plan",
    "during_read",
    "after_read",
    "mid_sink_write",
    "after_sink_files",
    "after_sink_success",
    "mid_snapshot_write",
    "after_manifest",
    "after_head_move",
)
# Points outside the epoch loop (no epoch number): ``during_startup`` is a subtask's on_start.
STARTUP_POINTS = ("during_startup",)


def _armed(point: str, epoch: int | None) -> bool:
    spec = os.environ.get(ENV_FAULT_POINTS, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, at = item.partition("@")
        if name == point and (not at or (epoch is not None and int(at) == epoch)):
            return True
    return False


def remember_runner_group() -> None:
    """Record the runner's process group for Spark's Python workers, which live in a group of
    their own (PySpark's daemon calls setpgid): a fault hit there must still kill the runner."""
    if os.environ.get(ENV_FAULT_POINTS):
        os.environ[ENV_FAULT_PGID] = str(os.getpgrp())


def _record(line: str) -> None:
    sys.stderr.write(line)
    sys.stderr.flush()
    if os.environ.get(ENV_FAULT_LOG):
        with open(os.environ[ENV_FAULT_LOG], "a") as log:
            log.write(line)
            log.flush()
            os.fsync(log.fileno())


def _pause_until(path: str, point: str, epoch: int | None) -> None:
    _record(f"FAULT PAUSED: {point} epoch={epoch} pid={os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    _record(f"FAULT RESUMED: {point} epoch={epoch}\n")


def fault_point(point: str, epoch: int | None = None) -> None:
    if point not in POINTS and point not in STARTUP_POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    if os.environ.get(ENV_FAULT_POINTS) and _armed(point, epoch):
        if os.environ.get(ENV_FAULT_PAUSE_UNTIL):
            _pause_until(os.environ[ENV_FAULT_PAUSE_UNTIL], point, epoch)
            return
        _record(f"FAULT INJECTED: {point} epoch={epoch} pid={os.getpid()}\n")
        group = int(os.environ.get(ENV_FAULT_PGID) or os.getpgrp())
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
