"""How many cores Spark offers a run, and asking it for more: the ceiling of a scale-up.

Local mode: the N of ``local[N]`` (the machine's cores for ``local[*]``). A cluster: with dynamic
allocation, ``spark.dynamicAllocation.maxExecutors`` × ``spark.executor.cores`` (no more than
``spark.cores.max``), and Spark is asked for the executors a scale-up needs
(``SparkContext.requestExecutors``; it releases idle ones itself after a scale-down, per
``spark.dynamicAllocation.executorIdleTimeout``); without it, the cores the cluster granted the
application's live executors (a standalone application gets what its workers had free, up to
``spark.cores.max``, and loses a lost worker's), else ``spark.cores.max``, else Spark's
``defaultParallelism``. Best effort: a cluster that cannot start the executors asked for leaves the
tasks queued, and the next decision sees the epoch's time.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable

log = logging.getLogger(__name__)

_LOCAL = re.compile(r"local\[(\*|\d+)")


def offered_cores(spark) -> int:
    """The cores Spark offers this run's tasks (see the module's docstring)."""
    sc = spark.sparkContext
    conf = sc.getConf()
    local = _LOCAL.match(sc.master or "")
    if local:
        return (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1))
    dynamic = dynamic_allocation(spark)
    return cluster_cores(
        conf.get("spark.cores.max"),
        int(conf.get("spark.dynamicAllocation.maxExecutors", "0") or 0) * executor_cores(spark) if dynamic else None,
        None if dynamic else granted_cores(spark),
        lambda: int(sc.defaultParallelism),
    )


def cluster_cores(
    cores_max: str | None, dynamic_most: int | None, granted: int | None, default_parallelism: Callable[[], int]
) -> int:
    """The cores a cluster offers: with dynamic allocation its most (``dynamic_most``: maxExecutors
    × executor cores, 0 when unbounded), else the cores ``granted`` to live executors; either no
    more than ``cores_max``; else ``cores_max``, else Spark's default parallelism."""
    most = dynamic_most if dynamic_most else granted
    if most is not None:  # guard: autoscale-beyond-granted-cores
        return min(most, int(cores_max)) if cores_max else most
    if cores_max:
        return int(cores_max)
    return default_parallelism()


def dynamic_allocation(spark) -> bool:
    """Whether the run's executors come and go with its tasks (``spark.dynamicAllocation.enabled``)."""
    return spark.sparkContext.getConf().get("spark.dynamicAllocation.enabled", "false").lower() == "true"


def executor_cores(spark) -> int:
    """``spark.executor.cores`` (1 when unset: the unit a request is counted in)."""
    return int(spark.sparkContext.getConf().get("spark.executor.cores", "1") or 1)


def ask_for_executors(spark, cores: int) -> bool:
    """With dynamic allocation, ask Spark for the executors ``cores`` more cores take; False when
    not asked or refused (logged: the scale-up goes on, its tasks wait for cores)."""
    if not dynamic_allocation(spark) or cores <= 0:
        return False
    executors = -(-cores // executor_cores(spark))
    try:
        granted = bool(spark.sparkContext._jsc.sc().requestExecutors(executors))
    except Exception as exc:  # py4j: a cluster manager that does not support it
        log.warning("asking Spark for %d executor(s) failed: %s", executors, str(exc).splitlines()[0])
        return False
    if not granted:
        log.warning("Spark refused a request for %d more executor(s): the scale-up waits for cores", executors)
    else:
        log.info("asked Spark for %d more executor(s) before scaling up", executors)
    return granted


def granted_cores(spark) -> int | None:
    """The cores of the application's live executors, from Spark's status store (None: unknown,
    e.g. a Spark without it): what a scale-up can run on now, without asking for more."""
    executors = live_executors(spark)
    return None if executors is None else executor_cores_of(executors)


def live_executors(spark) -> list[tuple[str, int]] | None:
    """The application's live executors as (id, cores), the driver's entry among them, from
    Spark's status store (None: unknown, e.g. a Spark without it). An executor the scheduler is
    removing (idle under dynamic allocation, or lost) is not live, though the status store, fed
    by the listener bus, lists it until its removal event is processed."""
    try:
        sc = spark.sparkContext._jsc.sc()
        executors = sc.statusStore().executorList(True)
        summaries = [executors.apply(i) for i in range(executors.size())]
        listed = [(str(e.id()), int(e.totalCores())) for e in summaries]
    except Exception as exc:  # py4j: an internal API another Spark may lack
        log.debug("the status store's executors are unknown: %s", str(exc).splitlines()[0])
        return None
    active = _scheduler_active(sc)
    live = [i == "driver" or active(i) for i, _ in listed]  # guard: autoscale-removed-executor-counted
    return [executor for executor, is_live in zip(listed, live, strict=True) if is_live]


def _scheduler_active(sc) -> Callable[[str], bool]:
    """The scheduler backend's own word on whether an executor is active (registered, and not
    pending removal, loss or decommission: ``CoarseGrainedSchedulerBackend.isExecutorActive``);
    every executor counts where the backend has no such call (local mode's)."""

    def active(executor_id: str) -> bool:
        try:
            return bool(sc.schedulerBackend().isExecutorActive(executor_id))
        except Exception:  # py4j: a backend without the call
            return True

    return active


def release_request(spark, keep_cores: int) -> None:
    """Give the request for executors back to dynamic allocation after a scale-up whose executors
    did not come (``SparkContext.requestTotalExecutors``), so none stays asked for and starts
    later for a parallelism the pipeline did not take. The total asked for becomes the allocation
    manager's own target (``allocation_target``): a total of ours above it would stand until the
    manager's target next changes, and an executor it then removes as idle would be replaced.
    Where that target cannot be read, the live executors and those ``keep_cores`` (the
    parallelism the pipeline stays at) take. No executor is stopped by it. Best effort, logged."""
    executors = live_executors(spark)
    if executors is None:
        return
    live = sum(executor_id != "driver" for executor_id, _ in executors)
    target = allocation_target(spark)
    total = target if target is not None else max(live, -(-keep_cores // executor_cores(spark)))
    jvm = spark.sparkContext._jvm
    try:
        no_hosts = jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(jvm.java.util.HashMap())
        spark.sparkContext._jsc.sc().requestTotalExecutors(total, 0, no_hosts)
    except Exception as exc:  # py4j: a cluster manager that does not support it
        log.warning("releasing the request for executors failed: %s", str(exc).splitlines()[0])
        return
    whose = "dynamic allocation's target" if target is not None else "the live executors and the parallelism kept"
    log.info("released the request for executors: %d asked for in all (%s; %d live)", total, whose, live)


def allocation_target(spark) -> int | None:
    """Dynamic allocation's own target of executors for the default resource profile (the
    ExecutorAllocationManager's, read by reflection: Spark has no public call for it); None
    without dynamic allocation or where this Spark does not have it."""
    try:
        manager = spark.sparkContext._jsc.sc().executorAllocationManager()
        if not manager.isDefined():
            return None
        manager = manager.get()
        field = manager.getClass().getDeclaredField("numExecutorsTargetPerResourceProfileId")
        field.setAccessible(True)
        return int(field.get(manager).apply(0))  # the default resource profile's id is 0
    except Exception as exc:  # py4j: an internal another Spark may lack
        log.debug("dynamic allocation's target is unknown: %s", str(exc).splitlines()[0])
        return None


def executor_cores_of(executors: list[tuple[str, int]]) -> int:
    """The cores of ``executors`` ((id, cores)), the driver's aside: it runs no task on a cluster."""
    return sum(cores for executor_id, cores in executors if executor_id != "driver")  # guard: autoscale-driver-cores
