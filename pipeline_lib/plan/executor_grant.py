"""What a scale-up becomes once Spark has answered its request for executors: a pure function of
the decision, the cores asked for and the cores granted within the wait, so that the rule "a
scale-up that cannot get executors says so and stays" is unit-tested without a cluster.

With dynamic allocation a scale-up asks Spark for executors before it applies (see
execution/runtime/autoscale_grant.py, which waits a bounded time for them). Tasks of an epoch
planned wider than the cores granted would only queue, so the scale-up goes as far as the granted
cores reach, never below where it started, and its reason names the cores asked for and granted.
"""

from __future__ import annotations

from dataclasses import replace

from pipeline_lib.plan.autoscale_decision import Decision


def granted_parallelism(before: int, want: int, granted: int) -> int:
    """The parallelism a scale-up from ``before`` to ``want`` takes with ``granted`` cores: ``want``
    when they cover it, else as far as they reach, never below ``before``."""
    return max(before, min(want, granted))  # guard: autoscale-ungranted-scale-up


def settled(decision: Decision, asked: int, granted: int, waited_s: float) -> Decision:
    """``decision`` (a scale-up) after asking Spark for ``asked`` more cores and finding ``granted``
    cores on the application's executors within ``waited_s`` seconds: unchanged when they cover
    its parallelism, else capped (staying, or going as far as the cores reach) with the reason."""
    want = decision.parallelism
    if want <= decision.before:
        return decision
    parallelism = granted_parallelism(decision.before, want, granted)
    if parallelism >= want:
        return decision
    outcome = "stays" if parallelism == decision.before else f"goes to {parallelism}"
    return replace(
        decision,
        parallelism=parallelism,
        reason=(
            f"{decision.reason}: wants {want} subtasks, asked Spark for {asked} more core(s), "
            f"{granted} core(s) granted within {waited_s:g} s: {outcome}"
        ),
        capped=True,
    )
