"""What a user may ask of a job's DAG run: the trigger form's fields and their validation.

The same rules exist twice on purpose: as JSON schemas (Airflow renders them as the trigger
form and rejects a bad ``conf`` at trigger time) and as a pydantic model that the DAG's first
task applies again, so nothing reaches Spark that a schema-less trigger path let through.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline_lib.checkpoint.manifest import SNAPSHOT_ID
from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import SpecError
from pipeline_lib.execution.runtime.lifecycle import DEFAULT_LEASE_SECONDS, DEFAULT_STALL_SECONDS
from pipeline_lib.graph import build_graph
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec
from pipeline_lib.spec.run_settings import allowed_words, check_run_settings, run_settings_schema

MODES = {"until_caught_up": "until-caught-up", "continuous": "forever"}
# (?![\s\S]) is the end of the text in both JSON Schema (ECMA) and Python regexes; Python's $
# would also match before a trailing newline.
RESTORE_PATTERN = rf"^(latest|none|{SNAPSHOT_ID.pattern})(?![\s\S])"
STALL_BOUNDS = (2, 86_400)  # seconds; the form and the model take the same bounds
LEASE_BOUNDS = (1, 3600)  # seconds


def bounded(low: float, high: float) -> dict[str, Any]:
    """JSON-schema bounds that Airflow enforces at trigger time (a 400 naming the param) and its
    trigger form does not read: the form's number input clamps a value to a top-level ``minimum``
    or ``maximum`` when it loses focus, so 10000 would silently become the maximum and run."""
    return {"allOf": [{"minimum": low, "maximum": high}]}


def pipeline_names(spec: JobSpec) -> list[str]:
    """The job's pipeline names, the choices of the launch form's pipeline field."""
    return [p.name for p in build_graph(spec).pipelines()]


def param_schemas(spec: JobSpec) -> dict[str, dict[str, Any]]:
    """name -> {default, description, schema}: the trigger form of ``pipeline__<job>``."""
    names = pipeline_names(spec)
    maxp = spec.checkpoint.max_parallelism
    return {
        "mode": {
            "default": "until_caught_up",
            "description": "until_caught_up: process what the topic holds at start, commit, and finish. "
            "continuous: keep polling for new records until stopped (stop it by marking the run "
            "failed or success).",
            "schema": {"type": "string", "enum": list(MODES), "title": "Mode"},
        },
        "restore": {
            "default": "latest",
            "description": "latest: resume from each pipeline's latest valid snapshot (completed pipelines are "
            "skipped). none: start over. A snapshot id such as 0000000012-a3 rewinds one "
            "pipeline to that snapshot (choose the pipeline below).",
            "schema": {
                "type": "string",
                "pattern": RESTORE_PATTERN,
                "title": "Restore from",
                "examples": ["latest", "none"],
            },
        },
        "parallelism": {
            "default": spec.parallelism,
            "description": f"Subtasks per operator, 1 to {maxp} (the spec's max_parallelism); a change rescales "
            "keyed state by key-group ranges.",
            "schema": {"type": "integer", **bounded(1, maxp), "title": "Parallelism"},
        },
        "pipelines": {
            "default": [],
            "description": f"Run only these pipelines; empty runs all of them ({', '.join(names)}).",
            "schema": {
                "type": ["null", "array"],
                "items": {"type": "string", "enum": names},
                "uniqueItems": True,
                "examples": names,
                "title": "Pipelines",
            },
        },
        "spark_conf": {
            "default": {},
            "description": "Spark settings of this run over the spec's spark section, e.g. "
            '{"spark.cores.max": "4", "spark.executor.memory": "2g"}. A run may change only its '
            f"resources and scheduling: {allowed_words()}. Anything else belongs in the job's spec.",
            "schema": run_settings_schema(),
        },
        "lease_seconds": {
            "default": DEFAULT_LEASE_SECONDS,
            "description": f"Heartbeat lease, {LEASE_BOUNDS[0]} to {LEASE_BOUNDS[1]} s: a RUNNING pipeline whose "
            "runner is silent this long is LOST and may be relaunched by pipeline_recovery.",
            "schema": {"type": "number", **bounded(*LEASE_BOUNDS), "title": "Heartbeat lease (s)"},
        },
        "stall_seconds": {
            "default": DEFAULT_STALL_SECONDS,
            "description": f"Stall time, {STALL_BOUNDS[0]} to {STALL_BOUNDS[1]} s and more than the lease: a "
            "RUNNING pipeline that commits no epoch this long while records wait is STALLED, and "
            "pipeline_recovery relaunches it.",
            "schema": {"type": "number", **bounded(*STALL_BOUNDS), "title": "Stall time (s)"},
        },
    }


class LaunchRequest(BaseModel):
    """A validated ``conf`` of a ``pipeline__<job>`` run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["until_caught_up", "continuous"] = "until_caught_up"
    restore: str = "latest"
    parallelism: int | None = Field(default=None, ge=1)
    pipelines: list[str] = []
    lease_seconds: float = Field(default=DEFAULT_LEASE_SECONDS, ge=LEASE_BOUNDS[0], le=LEASE_BOUNDS[1])
    stall_seconds: float = Field(default=DEFAULT_STALL_SECONDS, ge=STALL_BOUNDS[0], le=STALL_BOUNDS[1])
    spark_conf: dict[str, str] = {}
    reason: str | None = Field(default=None, max_length=500)  # why it was launched (recovery sets it)

    @field_validator("restore")
    @classmethod
    def _restore(cls, value: str) -> str:
        if value not in ("latest", "none") and not SNAPSHOT_ID.fullmatch(value):
            raise ValueError(f"{value!r} is not latest, none or a snapshot id like 0000000012-a3")
        return value

    @field_validator("spark_conf")
    @classmethod
    def _spark_conf(cls, value: dict[str, str]) -> dict[str, str]:
        return check_run_settings(value)

    @model_validator(mode="after")
    def _one_pipeline_for_a_snapshot(self) -> LaunchRequest:
        if self.restore not in ("latest", "none") and len(self.pipelines) != 1:
            raise ValueError("restore from a snapshot id needs exactly one pipeline in 'pipelines'")
        return self

    @model_validator(mode="after")
    def _stall_longer_than_lease(self) -> LaunchRequest:
        """A stall shorter than the lease would call a pipeline stuck before a missed heartbeat could."""
        if self.stall_seconds <= self.lease_seconds:
            raise ValueError(
                f"stall_seconds {self.stall_seconds:g} must be more than lease_seconds {self.lease_seconds:g}"
            )
        return self

    @property
    def run_mode(self) -> str:
        """The CLI's mode flag for the form's choice (the form's words are not the CLI's)."""
        return MODES[self.mode]

    @classmethod
    def from_conf(cls, conf: dict[str, Any] | None, spec: JobSpec) -> LaunchRequest:
        """Validate against the job: SpecError names the param that is wrong."""
        try:
            request = cls.model_validate({k: v for k, v in (conf or {}).items() if v is not None})
        except ValidationError as exc:
            raise SpecError(f"job {spec.name}: {plain_error(exc)}") from None
        names = pipeline_names(spec)
        unknown = sorted(set(request.pipelines) - set(names))
        if unknown:
            raise SpecError(f"job {spec.name}: param pipelines: no pipeline {unknown} (it has {names})")
        maxp = spec.checkpoint.max_parallelism
        if request.parallelism is not None and request.parallelism > maxp:
            raise SpecError(f"job {spec.name}: param parallelism: {request.parallelism} exceeds max_parallelism {maxp}")
        return request


def plain_error(exc: ValidationError) -> str:
    """The first error in the form's words: ``param <field>: <what is wrong>``, without pydantic's
    "Value error, " and with the field a cross-field rule is about."""
    first = exc.errors()[0]
    message = str(first["msg"]).removeprefix("Value error, ")
    where = ".".join(str(p) for p in first["loc"])
    if not where:  # a rule over several fields names the field it refuses first in its message
        where = next((name for name in LaunchRequest.model_fields if message.startswith(name)), "conf")
    if first["type"] == "extra_forbidden":
        message = "is not a field of this form"
    return f"param {where}: {message}"


def check_restore_target(spec: JobSpec, request: LaunchRequest, settings: ConnectionSettings) -> None:
    """A snapshot id must be one the pipeline still retains, before anything starts."""
    if request.restore in ("latest", "none"):
        return
    pipeline = request.pipelines[0]
    head, _ = SnapshotStore.open(spec.checkpoint.store, spec.name, pipeline, settings).read_head()
    retained = [e.snapshot_id for e in head.history] if head else []
    if request.restore not in retained:
        raise SpecError(
            f"job {spec.name}: param restore: {request.restore} is not a retained snapshot of "
            f"pipeline {pipeline} (retained: {', '.join(retained) or 'none'})"
        )
