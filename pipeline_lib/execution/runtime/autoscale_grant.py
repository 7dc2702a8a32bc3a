"""A scale-up on dynamic allocation: ask Spark for the executors it needs, wait a bounded time for
them, and go no wider than what was granted (plan.executor_grant decides).

Waiting happens at an epoch boundary, on the driver, by polling Spark's status store for the
application's live executors every ``POLL_S`` seconds for at most ``autoscale.executor_wait_seconds``:
nothing in it grows with records or keys. A scale-up whose cores did not come stays (or goes as far
as they reach), says so, and its request is released down to the live executors and those the
parallelism it stays at takes, so no executor stays asked for and starts later for a parallelism
the pipeline did not take. A scale-up the live executors already cover asks
for nothing and does not wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline_lib.execution.engine import spark_capacity
from pipeline_lib.plan.autoscale_decision import Decision
from pipeline_lib.plan.executor_grant import settled

log = logging.getLogger(__name__)

POLL_S = 0.25


@dataclass
class SparkExecutors:
    """What the wait needs of Spark, as functions (a unit test gives its own): the cores granted to
    the live executors now (None: unknown), asking for more cores, releasing what was asked beyond
    the live executors and the cores of the parallelism kept."""

    granted: Callable[[], int | None]
    ask: Callable[[int], object]
    release: Callable[[int], None]

    @classmethod
    def of(cls, spark) -> SparkExecutors:
        """The executors of ``spark``'s application (spark_capacity's calls)."""
        return cls(
            lambda: spark_capacity.granted_cores(spark),
            lambda cores: spark_capacity.ask_for_executors(spark, cores),
            lambda keep: spark_capacity.release_request(spark, keep),
        )


def grant_scale_up(
    decision: Decision,
    executors: SparkExecutors,
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """``decision`` once Spark had ``wait_s`` seconds to grant the cores its scale-up needs beyond
    the live executors': itself when they came (or were there), else capped, the request released."""
    want = decision.parallelism
    if want <= decision.before:
        return decision
    now = executors.granted()
    if now is None or now >= want:
        return decision  # the cores unknown (spark_capacity bounds it), or already there
    asked = want - now
    executors.ask(asked)
    started = clock()
    granted = now
    while True:
        granted = executors.granted() or 0
        if granted >= want or clock() - started >= wait_s:
            break
        sleep(POLL_S)
    outcome = settled(decision, asked, granted, wait_s)
    if outcome.parallelism < want:
        executors.release(outcome.parallelism)  # guard: autoscale-ungranted-request-kept
    return outcome
