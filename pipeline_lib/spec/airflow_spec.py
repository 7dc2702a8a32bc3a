"""The job spec's ``airflow`` section: when its DAG starts by itself and which connections it reads."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator

from pipeline_lib.spec.base import StrictModel

CONN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
ConnectionId = Annotated[str, Field(pattern=CONN_ID_PATTERN)]
# Airflow's cron presets (airflow.utils.dates.cron_presets) and its one-run schedule.
SCHEDULE_PRESETS = frozenset({"@once", "@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly"})
ASSET_URI = re.compile(r"[a-z][a-z0-9+.-]*://\S+")


def _schedule(value: str | None) -> str | None:
    """A preset, or a five-field cron expression that croniter (Airflow's own parser) accepts.
    ``@continuous`` is refused: Airflow runs it with one active run at a time, which would queue
    the relaunches pipeline_recovery makes; a job that runs without end uses mode continuous."""
    if value is None or value in SCHEDULE_PRESETS:
        return value
    if value == "@continuous":
        raise ValueError("@continuous is not a schedule of a job DAG; trigger a run with mode continuous instead")
    if value.startswith("@"):
        raise ValueError(f"{value!r} is not one of {', '.join(sorted(SCHEDULE_PRESETS))} or a cron expression")
    from croniter import croniter

    if len(value.split()) != 5 or not croniter.is_valid(value):
        raise ValueError(
            f"{value!r} is not a cron expression of five fields (minute hour day month weekday), "
            'e.g. "0 * * * *", nor a preset such as @hourly'
        )
    return value


def _asset_uri(value: str) -> str:
    if not ASSET_URI.fullmatch(value) or value.startswith("airflow://"):
        raise ValueError(f"{value!r} is not an asset URI such as s3://results/spend-per-user")
    return value


class AirflowConnectionsSpec(StrictModel):
    """The Airflow connection ids a job's runs read their settings from (ids, never settings:
    the spec stays free of secrets). Jobs that read different clusters name different ones."""

    kafka: ConnectionId = "pipeline_kafka"
    s3: ConnectionId = "pipeline_s3"
    spark: ConnectionId = "pipeline_spark"


class AirflowSpec(StrictModel):
    """How Airflow runs the job's DAG: when it starts by itself, and which connections it reads."""

    schedule: Annotated[str | None, AfterValidator(_schedule)] = None
    assets: list[Annotated[str, AfterValidator(_asset_uri)]] = []
    connections: AirflowConnectionsSpec = AirflowConnectionsSpec()

    @field_validator("assets")
    @classmethod
    def _assets_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("an asset is listed twice")
        return value

    @property
    def scheduled(self) -> bool:
        """Whether the DAG starts runs by itself (on its schedule or on asset events)."""
        return self.schedule is not None or bool(self.assets)
