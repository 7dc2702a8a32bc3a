"""The ``autoscale`` section: the bounds, targets and thresholds by which a running pipeline
changes its parallelism at an epoch boundary (plan.autoscale_decision decides; docs/autoscaling.md).

One section for the job; ``pipelines`` overrides any of its fields for one pipeline (a pipeline is
named after the source it reads), so a job states its policy once and tunes the odd pipeline.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from pipeline_lib.spec.base import NAME_PATTERN, FieldsError, StrictModel

_FIELDS = (
    "enabled",
    "min",
    "max",
    "target_lag_records",
    "target_lag_seconds",
    "target_epoch_seconds",
    "scale_up_at",
    "scale_down_at",
    "cooldown_epochs",
    "step",
    "executor_wait_seconds",
)


class AutoscaleSettings(StrictModel):
    """One pipeline's policy. Its load after an epoch is the largest of lag / target_lag_records,
    (seconds to drain the lag at the epoch's rate) / target_lag_seconds and epoch seconds /
    target_epoch_seconds (those set); at or above ``scale_up_at`` it gains ``step`` subtasks, at or
    below ``scale_down_at`` it loses ``step``, within [min, max] and what Spark offers, and not
    within ``cooldown_epochs`` epochs of its last change."""

    enabled: bool = True
    min: Annotated[int, Field(ge=1, le=32_768)] = 1
    max: Annotated[int, Field(ge=1, le=32_768)]
    target_lag_records: Annotated[int, Field(ge=1)] | None = None
    target_lag_seconds: Annotated[float, Field(gt=0)] | None = None
    target_epoch_seconds: Annotated[float, Field(gt=0)] | None = None
    scale_up_at: Annotated[float, Field(gt=0)] = 1.0
    scale_down_at: Annotated[float, Field(ge=0)] = 0.5
    cooldown_epochs: Annotated[int, Field(ge=0)] = 2
    step: Annotated[int, Field(ge=1)] = 1
    # with dynamic allocation: how long a scale-up waits for the executors it asked for, then stays
    executor_wait_seconds: Annotated[float, Field(gt=0, le=600)] = 10.0

    @model_validator(mode="after")
    def _consistent(self) -> AutoscaleSettings:
        if self.min > self.max:
            raise FieldsError(f"autoscale.min {self.min} exceeds autoscale.max {self.max}", "min", "max")
        if self.scale_down_at >= self.scale_up_at:
            raise FieldsError(
                f"autoscale.scale_down_at {self.scale_down_at} must be below scale_up_at {self.scale_up_at}",
                "scale_down_at",
                "scale_up_at",
            )
        if self.target_lag_records is None and self.target_lag_seconds is None and self.target_epoch_seconds is None:
            raise FieldsError(
                "autoscale needs a target: target_lag_records, target_lag_seconds or target_epoch_seconds",
                "target_lag_records",
                "target_lag_seconds",
                "target_epoch_seconds",
            )
        return self


class AutoscaleSpec(AutoscaleSettings):
    """The job's policy, and per pipeline the fields that differ (validated merged with the job's)."""

    pipelines: dict[Annotated[str, Field(pattern=NAME_PATTERN)], dict[str, Any]] = {}

    @model_validator(mode="after")
    def _overrides(self) -> AutoscaleSpec:
        for name, fields in self.pipelines.items():
            unknown = sorted(set(fields) - set(_FIELDS))
            if unknown:
                raise FieldsError(f"autoscale.pipelines.{name} has unknown field(s) {unknown}", f"pipelines.{name}")
            try:
                self.for_pipeline(name)
            except ValueError as exc:
                raise FieldsError(f"autoscale.pipelines.{name}: {exc}", f"pipelines.{name}") from exc
        return self

    def for_pipeline(self, name: str) -> AutoscaleSettings | None:
        """``name``'s policy, the job's with its overrides (None: autoscaling is off for it)."""
        merged = AutoscaleSettings.model_validate(
            {**self.model_dump(include=set(_FIELDS)), **self.pipelines.get(name, {})}
        )
        return merged if merged.enabled else None

    def check_bounds(self, max_parallelism: int, pipelines: list[str]) -> None:
        """Every pipeline's max within checkpoint.max_parallelism; overrides name pipelines of the job."""
        unknown = sorted(set(self.pipelines) - set(pipelines))
        if unknown:
            raise FieldsError(
                f"autoscale.pipelines names {unknown}, which the job does not have (its pipelines: {pipelines})",
                "autoscale.pipelines",
            )
        for name in pipelines:
            settings = self.for_pipeline(name)
            if settings is not None and settings.max > max_parallelism:
                raise FieldsError(
                    f"autoscale.max {settings.max} of pipeline {name} exceeds checkpoint.max_parallelism "
                    f"{max_parallelism}",
                    "autoscale.max",
                    "checkpoint.max_parallelism",
                )
