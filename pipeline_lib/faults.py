"""Named crash points, for proving exactly-once under SIGKILL.

Disabled unless ``PIPELINE_FAULT_POINTS`` is set to a comma-separated list of ``point``,
``point@epoch`` or ``point@epoch#k``, e.g. ``after_sink_success@3`` (kill the run at that point
of epoch 3) or ``during_read`` (every time it is reached). ``#k`` picks the k-th hit of the point
in that epoch (or in any epoch, without ``@``) counted in this process: some points are reached
more than once per epoch (``mid_sink_write`` once per part file, and the three sink points by
the flow sinks and then the dead-letter sink), so ``after_sink_success@3#2`` is the dead-letter
sink's commit of epoch 3 in a one-flow job. Without ``#k`` every hit counts (the first kills).
A trailing ``!`` (``during_read@2!``) fires only if ``PIPELINE_FAULT_LOG`` (required then) holds
no earlier ``FAULT INJECTED`` line of that point and epoch: the log survives the kill and is
shared by every process on the machine, so exactly one executor of a cluster test is lost and
the task Spark reruns passes. The check and the line are written under a lock on the log (the
pause mode below holds every selected hit, ``!`` or not).

A hit SIGKILLs the whole process group — the runner, the Spark JVM and its Python workers —
like a lost machine. In a process that descends from a cluster executor JVM (an ancestor runs
``CoarseGrainedExecutorBackend``), a hit SIGKILLs that JVM and the Python worker's own group
(the PySpark daemon and its workers) instead, and its log line ends ``executor=<pid>``: what
losing the executor's machine loses, and never the driver, which is on another host. On a
cluster the driver passes ``PIPELINE_FAULT_POINTS``, ``_PAUSE_UNTIL`` and ``_LOG`` to its
executors (spark_session.py). A malformed item or an unknown point fails the first time a point
is reached, so a typo cannot leave a test that never crashes.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from collections import Counter
from typing import NamedTuple

ENV_FAULT_POINTS = "PIPELINE_FAULT_POINTS"
ENV_FAULT_PGID = "PIPELINE_FAULT_PGID"
ENV_FAULT_LOG = "PIPELINE_FAULT_LOG"  # optional file that records each hit (survives the kill)
# Instead of killing, hold the process at the point until this file exists: a deterministic way
# to keep a "zombie" attempt alive while a newer one runs (tests of fencing).
ENV_FAULT_PAUSE_UNTIL = "PIPELINE_FAULT_PAUSE_UNTIL"
PAUSE_LIMIT_S = 600
EXECUTOR_MARKER = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"

POINTS = (
    "after_plan",
    "during_read",
    "after_task_parts",  # in a read task: its parts of stateless rows or dead letters written, not yet reported
    "after_owner_files",  # in an owner task: its sink part and state files written, not yet reported
    "after_read",
    "after_head_check",  # past the one head check, before anything visible is written
    "mid_sink_write",
    "after_sink_files",
    "after_sink_success",
    "after_table_commit",  # a table sink's (Delta, Iceberg) commit made, before the state, manifest and HEAD
    "after_merge_files",  # in a Delta or Iceberg merge task: its bucket's new file written, not yet reported
    "after_table_compaction",  # in the background clean-up: a Delta table's compaction committed, before its VACUUM
    "mid_snapshot_write",
    "after_manifest",
    "after_head_move",
    "mid_kafka_transaction",  # in a Kafka sink's writer task: the epoch's records and marker sent, not committed
    "after_kafka_publish",  # every Kafka sink holds the epoch, before the next epoch
)
# Points outside the epoch loop (no epoch number): ``during_startup`` is a subtask's on_start.
STARTUP_POINTS = ("during_startup",)


class FaultSpec(NamedTuple):
    """One armed crash point from ``PIPELINE_FAULT_POINTS``: where, in which epoch, at which hit."""

    point: str
    epoch: int | None  # None: any epoch
    hit: int | None  # the k-th hit of the point (in ``epoch``, if given); None: every hit
    once: bool = False  # ``!``: only if the fault log holds no earlier injection of point and epoch


_hits: Counter[tuple[str, int | None]] = Counter()  # (point, epoch or None for any) -> hits in this process


def parse_fault_points(spec: str) -> list[FaultSpec]:
    """``point[@epoch][#k][!]`` items, comma-separated; ValueError names a malformed one."""
    parsed = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        once = item.endswith("!")
        rest, hash_, hit = item.removesuffix("!").partition("#")
        name, at, epoch = rest.partition("@")
        if name not in POINTS and name not in STARTUP_POINTS:
            raise ValueError(f"{ENV_FAULT_POINTS}: unknown fault point {name!r} in {item!r}")
        if (at and not epoch.isdigit()) or (hash_ and (not hit.isdigit() or int(hit) < 1)):
            raise ValueError(
                f"{ENV_FAULT_POINTS}: {item!r} is not point, point@epoch or point@epoch#k (k >= 1), "
                "with an optional trailing !"
            )
        parsed.append(FaultSpec(name, int(epoch) if at else None, int(hit) if hash_ else None, once))
    return parsed


def _armed(point: str, epoch: int | None) -> FaultSpec | None:
    """Count this hit, then return the item of the spec that selects it, if any."""
    _hits[(point, epoch)] += 1
    _hits[(point, None)] += 1 if epoch is not None else 0
    for item in parse_fault_points(os.environ.get(ENV_FAULT_POINTS, "")):
        if item.point != point or (item.epoch is not None and item.epoch != epoch):
            continue
        if item.hit is None or _hits[(point, item.epoch)] == item.hit:
            if item.once and not os.environ.get(ENV_FAULT_LOG):
                raise ValueError(f"{ENV_FAULT_POINTS}: a ! item needs {ENV_FAULT_LOG} (it records the first hit)")
            return item
    return None


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return int(stat.read().rpartition(b")")[2].split()[1])  # the command name may hold spaces
    except (OSError, ValueError, IndexError):
        return 0


def executor_jvm_pid(pid: int | None = None) -> int | None:
    """The nearest ancestor of ``pid`` (this process by default) that is a cluster executor JVM,
    from /proc; None in local mode, where Python workers descend from the driver's JVM."""
    current = _ppid(pid or os.getpid())
    while current > 1:
        try:
            with open(f"/proc/{current}/cmdline", "rb") as cmdline:
                if EXECUTOR_MARKER in cmdline.read():
                    return current
        except OSError:
            return None
        current = _ppid(current)
    return None


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


def _inject_once(line: str, point: str, epoch: int | None) -> bool:
    """Record ``line`` unless the fault log already holds an injection of point and epoch; say
    whether it was recorded. Locked, so two executors hitting the point together fire once."""
    with open(os.environ[ENV_FAULT_LOG], "a+") as log:
        fcntl.flock(log, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        log.seek(0)
        if any(old.startswith(f"FAULT INJECTED: {point} epoch={epoch} ") for old in log):
            return False
        _record(line)
    return True


def _pause_until(path: str, point: str, epoch: int | None) -> None:
    _record(f"FAULT PAUSED: {point} epoch={epoch} hit={_hits[(point, epoch)]} pid={os.getpid()}\n")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    _record(f"FAULT RESUMED: {point} epoch={epoch}\n")


def fault_point(point: str, epoch: int | None = None) -> None:
    """A named crash point: kills the process (or pauses it) here when armed; free when not."""
    if point not in POINTS and point not in STARTUP_POINTS:
        raise ValueError(f"unknown fault point {point!r}")
    item = _armed(point, epoch) if os.environ.get(ENV_FAULT_POINTS) else None
    if item is not None:
        if os.environ.get(ENV_FAULT_PAUSE_UNTIL):
            _pause_until(os.environ[ENV_FAULT_PAUSE_UNTIL], point, epoch)
            return
        executor = executor_jvm_pid()
        line = f"FAULT INJECTED: {point} epoch={epoch} hit={_hits[(point, epoch)]} pid={os.getpid()}" + (
            f" executor={executor}\n" if executor is not None else "\n"
        )
        if not item.once:
            _record(line)
        elif not _inject_once(line, point, epoch):
            return
        if executor is not None:  # the executor's machine is lost: its JVM and this Python worker's group
            shares_group = os.getpgid(executor) == os.getpgrp()  # then killpg would reach the Spark worker
            os.kill(executor, signal.SIGKILL)
            if shares_group:
                os.kill(os.getpid(), signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        group = int(os.environ.get(ENV_FAULT_PGID) or os.getpgrp())
        if group != os.getpgrp():
            os.killpg(group, signal.SIGKILL)
        os.killpg(os.getpgrp(), signal.SIGKILL)
