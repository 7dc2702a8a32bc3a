"""How many offsets a new epoch may read: ``trigger.max_records_per_epoch``, or with
``trigger.max_records_per_subtask`` that many per subtask the epoch is planned at, within
``max_records_per_epoch``. A budget per subtask makes an epoch grow with the parallelism, so an
autoscaled pipeline's added subtasks read more per epoch rather than splitting the same records
(an epoch's fixed cost, its snapshot and commit, is paid once for more records).

Only a new plan takes the budget: a saved plan is replayed (and repaired) with the ranges it was
planned with, whatever the parallelism it is read at (see runner_planning.EpochPlanner.plan)."""

from __future__ import annotations

from pipeline_lib.spec.run_spec import TriggerSpec


def epoch_budget(trigger: TriggerSpec, parallelism: int) -> int:
    """The most offsets a new epoch planned at ``parallelism`` subtasks reads."""
    per_subtask = trigger.max_records_per_subtask
    if per_subtask is None:
        return trigger.max_records_per_epoch
    return min(trigger.max_records_per_epoch, per_subtask * parallelism)  # guard: budget-ignores-parallelism
