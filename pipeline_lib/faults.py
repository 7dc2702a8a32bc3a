"""Named crash points, for proving exactly-once under SIGKILL.

Disabled unless ``PIPELINE_FAULT_POINTS`` is set, e.g. ``after_sink_success@3`` (kill the run
at that point of epoch 3) or ``during_read`` (first time it is reached). A hit SIGKILLs the
whole process group — the runner, the Spark JVM and its Python workers — like a lost machine.
"""

from __future__ import annotations

import os
import signal
import sys

ENV_FAULT_POINTS = "PIPELINE_FAULT_POINTS"

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


def _armed(point: str, epoch: int | None) -> bool:
    spec = os.environ.get(ENV_FAULT_POINTS, "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, at = item.partition("@")
        if name == point and (not at or (epoch is not None and int(at) == epoch)):
            return True
    return False


def fault_point(point: str, epoch: int | None = None) -> None:
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    if os.environ.get(ENV_FAULT_POINTS) and _armed(point, epoch):
        sys.stderr.write(f"FAULT INJECTED: {point} epoch={epoch} pid={os.getpid()}\n")
        sys.stderr.flush()
        os.killpg(os.getpgrp(), signal.SIGKILL)
