"""How many cores Spark offers a run, and asking it for more: the ceiling of a scale-up.

Local mode: the N of ``local[N]`` (the machine's cores for ``local[*]``). A cluster: with dynamic
allocation, ``spark.dynamicAllocation.maxExecutors`` × ``spark.executor.cores`` (no more than
``spark.cores.max``), and Spark is asked for the executors a scale-up needs
(``SparkContext.requestExecutors``; it releases idle ones itself after a scale-down, per
``spark.dynamicAllocation.executorIdleTimeout``); without it, ``spark.cores.max``, else Spark's
``defaultParallelism``. Best effort: a cluster that cannot start executors leaves the tasks
queued, and the next decision sees the epoch's time.
"""

from __future__ import annotations

import logging
import os
import re

log = logging.getLogger(__name__)

_LOCAL = re.compile(r"local\[(\*|\d+)")


def offered_cores(spark) -> int:
    """The cores Spark offers this run's tasks (see the module's docstring)."""
    sc = spark.sparkContext
    conf = sc.getConf()
    local = _LOCAL.match(sc.master or "")
    if local:
        return (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1))
    cores_max = conf.get("spark.cores.max")
    if dynamic_allocation(spark):
        most = int(conf.get("spark.dynamicAllocation.maxExecutors", "0") or 0) * executor_cores(spark)
        if most > 0:
            return min(most, int(cores_max)) if cores_max else most
    if cores_max:
        return int(cores_max)
    return int(sc.defaultParallelism)


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
    return granted
