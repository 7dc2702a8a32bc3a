"""The job spec's run settings: checkpoints, epoch size, Spark scheduling and dead letters."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from pipeline_lib.spec.base import FieldsError, LocationUri, StrictModel
from pipeline_lib.spec.durations import parse_duration
from pipeline_lib.spec.spark_settings import MEMORY, check_conf_key

STATE_FILE_TARGET_KEYS = 4_096


class CheckpointSpec(StrictModel):
    """Where snapshots go and how many to keep; ``max_parallelism`` bounds rescaling for the job's lifetime."""

    store: LocationUri
    retain: Annotated[int, Field(ge=1, le=10_000)] = 10
    max_parallelism: Annotated[int, Field(ge=1, le=32_768)] = 128
    # Keyed state is stored as one file per this many key groups, and an epoch rewrites only the
    # files whose key groups it touched (incremental snapshots). Unset: sized to the state (see
    # state_file_key_groups).
    key_groups_per_state_file: Annotated[int, Field(ge=1, le=32_768)] | None = None
    # Bytes of decoded state each executor keeps on its local disk for owner tasks (keyed_state:
    # owners), least recently used evicted; 0 turns the cache off and every epoch reads from the store.
    cache_bytes: Annotated[int, Field(ge=0, le=1 << 50)] = 2 << 30

    @model_validator(mode="after")
    def _file_within_groups(self) -> CheckpointSpec:
        if self.key_groups_per_state_file is not None and self.key_groups_per_state_file > self.max_parallelism:
            raise FieldsError(
                f"key_groups_per_state_file {self.key_groups_per_state_file} exceeds max_parallelism "
                f"{self.max_parallelism}",
                "key_groups_per_state_file",
                "max_parallelism",
            )
        return self

    def state_file_key_groups(self, keys: int) -> int:
        """Key groups per state file for a state of ``keys`` keys: the spec's value, or the largest
        power of two giving files of at most ~4,096 keys, with at most 128 files. An epoch writes
        only the changed keys of a span (a delta), so a span's size does not set an incremental
        snapshot's bytes; each file costs a fixed encode and footer, so fewer files are cheaper to
        write every epoch, and enough of them keep owner tasks balanced."""
        if self.key_groups_per_state_file is not None:
            return self.key_groups_per_state_file
        maxp, per = self.max_parallelism, 1
        while per * 2 <= maxp and keys * per * 2 <= STATE_FILE_TARGET_KEYS * maxp:
            per *= 2
        return max(per, maxp // 128)


MAX_INTERVAL_S = 24 * 3600.0


def _interval(value: str | None) -> str | None:
    if value is not None:
        seconds = parse_duration(value)
        if not 0 < seconds <= MAX_INTERVAL_S:
            raise ValueError(f"{value!r} is outside the allowed intervals: more than 0 and at most 24 hours")
    return value


class TriggerSpec(StrictModel):
    """How much one epoch reads and how often one starts: the trade-off between latency and
    per-epoch overhead. ``interval`` (a duration such as "1 second"): an epoch starts at most once
    per interval, and a run with nothing to read looks again each interval (see epoch_trigger);
    unset, epochs run back to back while there is data."""

    max_records_per_epoch: Annotated[int, Field(ge=1, le=100_000_000)] = 20_000
    # set: an epoch reads at most this many offsets per subtask it is planned at, within
    # max_records_per_epoch, so the budget grows with the parallelism (see plan.epoch_budget)
    max_records_per_subtask: Annotated[int, Field(ge=1, le=100_000_000)] | None = None
    interval: Annotated[str | None, AfterValidator(_interval)] = None

    @model_validator(mode="after")
    def _subtask_within_epoch(self) -> TriggerSpec:
        per = self.max_records_per_subtask
        if per is not None and per > self.max_records_per_epoch:
            raise FieldsError(
                f"trigger.max_records_per_subtask {per} exceeds trigger.max_records_per_epoch "
                f"{self.max_records_per_epoch}, which caps every epoch: raise max_records_per_epoch to at least "
                "max_records_per_subtask times the largest parallelism",
                "max_records_per_subtask",
                "max_records_per_epoch",
            )
        return self

    @property
    def interval_s(self) -> float | None:
        """The interval in seconds (None: unset)."""
        return parse_duration(self.interval) if self.interval is not None else None


def _memory(value: str | None) -> str | None:
    if value is not None and not MEMORY.fullmatch(value):
        raise ValueError(f"{value!r} is not a size such as 512m or 2g")
    return value


MemorySize = Annotated[str | None, AfterValidator(_memory)]


class SparkSpec(StrictModel):
    """Scheduling settings, so that one job does not take a whole shared cluster."""

    cores_max: Annotated[int, Field(ge=1)] | None = None  # on a cluster; unset: the job's parallelism
    driver_memory: MemorySize = None
    executor_memory: MemorySize = None
    executor_cores: Annotated[int, Field(ge=1)] | None = None
    driver_max_result_size: MemorySize = None
    conf: dict[str, str | bool | int | float] = {}  # any other spark.* setting, except credentials

    @field_validator("conf")
    @classmethod
    def _conf_keys(cls, conf: dict[str, str | bool | int | float]) -> dict[str, str | bool | int | float]:
        for key in conf:
            check_conf_key(key)
        return conf

    def conf_strings(self) -> dict[str, str]:
        """The Spark settings as strings (booleans lower-case), the form SparkConf takes."""
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in self.conf.items()}


class DeadLetterSpec(StrictModel):
    """Where records that fail to decode go instead of failing the epoch."""

    path: LocationUri  # dead letters of pipeline P go to PATH/P/epoch=<n>/
