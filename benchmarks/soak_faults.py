"""What one soak cycle does to a run, and how the cycle ended.

A soak cycle is one real ``pipeline-lib run`` with one fault. In local mode the fault kills the
run: at a named point of an epoch, or from outside after a random delay. On a Spark cluster an
executor can be lost instead, which the run must survive by itself: a named point armed with
``!`` (fires once, see faults.py) kills the executor JVM when it is reached in an executor and the
driver when it is reached there; or a whole worker is SIGKILLed with its executors after a random
delay, like a lost machine, and a fresh worker replaces it. The classification is what the
report counts, and which exits are expected: the driver may die only when the fault killed it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from pipeline_lib.faults import POINTS

# A cycle's fault, in local mode: a named point (70%) or an outside SIGKILL.
LOCAL_POINT_SHARE = 0.7
# On a cluster: a named point, armed once (50%), an outside SIGKILL of the driver (20%), a lost worker (30%).
CLUSTER_POINT_SHARE, CLUSTER_DRIVER_KILL_SHARE = 0.5, 0.2
DELAY_S = (2.0, 25.0)  # when an outside kill comes, seconds after the run's spawn


@dataclass(frozen=True)
class Cycle:
    """One cycle's fault: at most one of the three is set."""

    fault_points: str | None = None  # PIPELINE_FAULT_POINTS of the run
    kill_driver_after: float | None = None  # SIGKILL the run's process group after this many seconds
    lose_worker_after: float | None = None  # SIGKILL a worker and its executors after this many seconds


def choose_cycle(rng: random.Random, epochs: int, cluster: bool) -> Cycle:
    """A random fault for a job of ``epochs`` epochs, in local mode or on a cluster."""
    draw = rng.random()
    if not cluster:
        if draw < LOCAL_POINT_SHARE:
            return Cycle(fault_points=f"{rng.choice(POINTS)}@{rng.randint(1, epochs)}")
        return Cycle(kill_driver_after=rng.uniform(*DELAY_S))
    if draw < CLUSTER_POINT_SHARE:
        return Cycle(fault_points=f"{rng.choice(POINTS)}@{rng.randint(1, epochs)}!")
    if draw < CLUSTER_POINT_SHARE + CLUSTER_DRIVER_KILL_SHARE:
        return Cycle(kill_driver_after=rng.uniform(*DELAY_S))
    return Cycle(lose_worker_after=rng.uniform(*DELAY_S))


def injected(fault_log: Path) -> tuple[str, bool] | None:
    """(point, in an executor) of the fault the run's fault log records, or None."""
    if not fault_log.exists():
        return None
    for line in fault_log.read_text().splitlines():
        if line.startswith("FAULT INJECTED: "):
            return line.split()[2], " executor=" in line
    return None


def outcome(rc: int, ended: str, fault_log: Path, worker_lost: bool) -> tuple[str, bool]:
    """(how the cycle ended, as the report counts it; whether that end was unexpected).

    A run may exit non-zero only when its driver was killed: by an armed point reached in the
    driver, or from outside. An executor lost to a point or with its worker must be survived."""
    hit = injected(fault_log)
    if ended == "external":
        return "sigkill:external", False
    if hit is not None and not hit[1]:
        return f"fault:{hit[0]}", rc == 0  # the point killed the driver: the run cannot have finished
    if hit is not None:
        kind = f"executor lost:{hit[0]}"
    elif worker_lost:
        kind = "worker lost"
    else:
        kind = "finished" if rc == 0 else f"exit {rc}"
    return kind, rc != 0
