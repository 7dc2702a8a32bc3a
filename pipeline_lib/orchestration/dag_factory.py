"""Airflow DAGs built from the job specs of a folder (kept thin: the work is in pipeline_lib).

* ``pipeline__<job>``, one per spec: ``check_params`` (rejects a bad form before Spark starts)
  → ``run_job`` (``RunJobOperator``: the job as its own process, local Spark or ``spark-submit``;
  stopping the task stops the run gracefully). Manual only, unless the spec's ``airflow`` section
  gives a schedule or assets; a run Airflow starts by itself takes the form's defaults and is
  skipped while another run of the job is running (a second attempt would fence the first).
* ``pipeline_recovery``, every few minutes and by hand: ``assess`` (judges every pipeline,
  claims relaunches by compare-and-swap) → ``relaunch`` (one ``pipeline__<job>`` run per
  claimed pipeline, restricted to that pipeline, restoring its latest valid snapshot).
* ``pipeline_verify``, daily and by hand: ``verify`` checks every committed epoch's part files
  and every retained snapshot of every job (``pipeline-lib verify``), writes each pipeline's
  VERIFIED record (the Pipelines page shows it) and fails when anything is lost or damaged.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Asset, Param, get_current_context, task

from pipeline_lib.errors import SpecError
from pipeline_lib.orchestration.job_specs import RECOVERY_DAG_ID, VERIFY_DAG_ID, job_dag_id, load_spec_folder
from pipeline_lib.orchestration.launch_request import LaunchRequest, bounded, check_restore_target, param_schemas
from pipeline_lib.orchestration.operators import RunJobOperator
from pipeline_lib.orchestration.task_stacks import positive_seconds, stacks_if_stuck
from pipeline_lib.spec import load_spec
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ENV_RECOVERY_SCHEDULE = "PIPELINE_RECOVERY_SCHEDULE"  # a cron expression, or "none" (manual only)
DEFAULT_RECOVERY_SCHEDULE = "*/5 * * * *"
ENV_VERIFY_SCHEDULE = "PIPELINE_VERIFY_SCHEDULE"  # a cron expression or preset, or "none" (manual only)
DEFAULT_VERIFY_SCHEDULE = "@daily"
ENV_VERIFY_TIMEOUT = "PIPELINE_VERIFY_TIMEOUT_SECONDS"  # a verify attempt past it is stopped and retried
DEFAULT_VERIFY_TIMEOUT_S = 6 * 3600
# A task of recovery or verification that could not reach the api-server (a busy machine's first
# start) is tried again; a damage finding fails without a retry (AirflowFailException).
RETRIES: dict[str, Any] = {"retries": 2, "retry_delay": dt.timedelta(seconds=20)}


def _schedule_from_env(name: str, default: str) -> str | None:
    value = os.environ.get(name, "").strip() or default
    return None if value.lower() == "none" else value


def recovery_schedule() -> str | None:
    """The recovery DAG's schedule from the environment; ``none`` turns it off (manual runs only)."""
    return _schedule_from_env(ENV_RECOVERY_SCHEDULE, DEFAULT_RECOVERY_SCHEDULE)


def verify_schedule() -> str | None:
    """The verification DAG's schedule from the environment; ``none`` turns it off (manual runs only)."""
    return _schedule_from_env(ENV_VERIFY_SCHEDULE, DEFAULT_VERIFY_SCHEDULE)


def verify_timeout() -> dt.timedelta:
    """How long one attempt of the verify task may run (PIPELINE_VERIFY_TIMEOUT_SECONDS, default 6 h):
    an attempt stuck past it is stopped and retried, rather than holding a worker slot for good."""
    seconds = positive_seconds(ENV_VERIFY_TIMEOUT)
    return dt.timedelta(seconds=DEFAULT_VERIFY_TIMEOUT_S if seconds is None else seconds)


def build_dags(specs_dir: Path) -> dict[str, DAG]:
    """Every valid spec's DAG plus the recovery DAG, keyed by DAG id (for ``globals()``)."""
    folder = load_spec_folder(specs_dir)
    for path, error in folder.errors.items():
        log.error("job spec %s is not loaded: %s", path, error)
    dags = {job_dag_id(spec.name): job_dag(path, spec) for path, spec in folder.specs.items()}
    names = sorted(spec.name for spec in folder.specs.values())
    dags[RECOVERY_DAG_ID] = recovery_dag(specs_dir, names)
    dags[VERIFY_DAG_ID] = verify_dag(specs_dir, names)
    return dags


def _params(schemas: dict[str, dict[str, Any]]) -> dict[str, Param]:
    return {name: Param(s["default"], description=s["description"], **s["schema"]) for name, s in schemas.items()}


def job_schedule(spec: JobSpec) -> Any:
    """The DAG's ``schedule`` from the spec's ``airflow`` section: None (manual only), the cron
    expression or preset, the assets (a run once each has an event since the last run), or both
    (``AssetOrTimeSchedule``: on the cron, and on the assets' events). Assets are referenced by
    URI (``Asset.ref``), so the one another DAG declares, a sink's name included, is the one used."""
    from airflow.sdk import AssetAll, AssetOrTimeSchedule, CronTriggerTimetable

    section = spec.airflow
    if not section.assets:
        return section.schedule
    assets = AssetAll(*(Asset.ref(uri=uri) for uri in section.assets))
    if section.schedule is None:
        return assets
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(section.schedule, timezone="UTC"), assets=assets)


def overlap_skip_reason(run_type: str, running_runs: int) -> str | None:
    """Why a run must not start, or None. A run Airflow starts by itself (schedule, asset
    events) is skipped while another run of the job's DAG is running: its attempt would fence
    the running one (a continuous run, say). Manual runs are left to the user and to
    pipeline_recovery, whose relaunches must reach a stuck run; ``running_runs`` counts this run too."""
    if run_type == "manual" or running_runs <= 1:
        return None
    return f"a {run_type} run starts only when no other run of the job is running ({running_runs - 1} other running)"


def job_dag(spec_path: Path, spec: JobSpec) -> DAG:
    """The DAG that runs one job: validate the request, then launch the run as a child process."""
    dag_id = job_dag_id(spec.name)
    reason = {
        "default": None,
        "description": "Why this run was launched (pipeline_recovery fills it in).",
        "schema": {"type": ["null", "string"], "maxLength": 500, "title": "Reason"},
    }
    with DAG(
        dag_id=dag_id,
        schedule=job_schedule(spec),
        start_date=START,
        catchup=False,
        max_active_runs=4,
        is_paused_upon_creation=False,
        params=_params({**param_schemas(spec), "reason": reason}),
        tags=["pipeline-lib", f"job:{spec.name}"],
        doc_md=f"Job **{spec.name}** from `{spec_path.name}`: reads Kafka topic(s) "
        f"{', '.join(sorted({s.kafka.topic for s in spec.all_sources().values()}))}, snapshots to "
        f"`{spec.checkpoint.store}`. Trigger with the form to run, resume or rewind it.",
    ) as dag:

        @task(task_id="check_params")
        def check_params() -> dict[str, Any]:
            from airflow.sdk.exceptions import AirflowSkipException

            from pipeline_lib.orchestration.airflow_connections import airflow_settings

            context = get_current_context()
            run_type = str(getattr(context["dag_run"].run_type, "value", context["dag_run"].run_type))
            if run_type != "manual":
                running = context["ti"].get_dr_count(dag_id=dag_id, states=["running"])
                if reason := overlap_skip_reason(run_type, running):
                    raise AirflowSkipException(reason)
            params = dict(context["params"])
            current = load_spec(spec_path)  # the spec as it is now, not as it was parsed
            request = LaunchRequest.from_conf(params, current)
            check_restore_target(current, request, airflow_settings(current.airflow.connections))
            log.info("launch request: %s", request.model_dump_json())
            return request.model_dump()

        check_params() >> RunJobOperator(
            task_id="run_job", spec_path=str(spec_path), job_name=spec.name, request_task_id="check_params", retries=0
        )
    return dag


def _jobs_param(job_names: list[str] | None, does: str) -> Param:
    """The form's "Jobs" field of a DAG that acts on every job of the folder, ``job_names`` offered."""
    return Param(
        [],
        type=["null", "array"],
        items={"type": "string"},
        uniqueItems=True,
        examples=job_names or [],
        title="Jobs",
        description=f"Only these jobs; empty {does} every job in dags/pipelines.",
    )


def recovery_dag(specs_dir: Path, job_names: list[str] | None = None) -> DAG:
    """The DAG that assesses every job's pipelines and relaunches the failed or lost ones;
    ``job_names`` are offered in its form (any job in the folder when it runs is accepted)."""
    with DAG(
        dag_id=RECOVERY_DAG_ID,
        schedule=recovery_schedule(),
        start_date=START,
        catchup=False,
        max_active_runs=2,
        is_paused_upon_creation=False,
        tags=["pipeline-lib", "recovery"],
        params={
            "jobs": _jobs_param(job_names, "assesses"),
            "dry_run": Param(
                False, type="boolean", title="Dry run", description="Report what would be relaunched; change nothing."
            ),
            "max_relaunches": Param(
                5,
                type="integer",
                **bounded(0, 100),
                title="Relaunches before giving up",
                description="Relaunches in a row per pipeline, 0 to 100, before recovery gives "
                "up on it and an operator restores it by hand.",
            ),
            "backoff_base_seconds": Param(
                60,
                type="number",
                **bounded(0, 86400),
                title="Backoff base (s)",
                description="Wait base × 2^n seconds between relaunches of one pipeline, 0 to 86400.",
            ),
        },
        doc_md="Finds pipelines that are FAILED or whose heartbeat lease expired (LOST), and relaunches "
        "only those, each from its latest valid snapshot, skipping completed subtasks. Relaunches "
        "are claimed by compare-and-swap in the pipeline's RECOVERY record, so overlapping runs "
        "never launch one pipeline twice.",
    ) as dag:

        @task(task_id="assess", **RETRIES)
        def assess() -> list[dict[str, Any]]:
            with stacks_if_stuck():
                return _assess(specs_dir)

        @task(task_id="relaunch_requests", **RETRIES)
        def relaunch_requests(decisions: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if get_current_context()["params"]["dry_run"]:
                return []
            return [
                {"trigger_dag_id": job_dag_id(d["job"]), "trigger_run_id": d["trigger_run_id"], "conf": d["conf"]}
                for d in decisions
                if d["verdict"] == "relaunch"
            ]

        TriggerDagRunOperator.partial(
            task_id="relaunch",
            logical_date=None,
            skip_when_already_exists=True,
            fail_when_dag_is_paused=True,
        ).expand_kwargs(relaunch_requests(assess()))  # type: ignore[arg-type]  # @task takes XComArgs for its args
    return dag


def _wanted_jobs(specs_dir: Path, jobs: list[str] | None) -> list[JobSpec]:
    """The specs of the folder, only ``jobs`` when given (SpecError naming unknown ones)."""
    folder = load_spec_folder(specs_dir)
    wanted = set(jobs or [])
    unknown = wanted - {s.name for s in folder.specs.values()}
    if unknown:
        raise SpecError(f"param jobs: no job spec named {sorted(unknown)} in {specs_dir}")
    return [spec for spec in folder.specs.values() if not wanted or spec.name in wanted]


def verify_dag(specs_dir: Path, job_names: list[str] | None = None) -> DAG:
    """The DAG that verifies every job's committed output and retained snapshots, records what
    it found beside each pipeline's snapshots (VERIFIED) and fails when anything is lost or damaged."""
    with DAG(
        dag_id=VERIFY_DAG_ID,
        schedule=verify_schedule(),
        start_date=START,
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=False,
        tags=["pipeline-lib", "verify"],
        params={
            "jobs": _jobs_param(job_names, "verifies"),
        },
        doc_md="Reads every part file of every committed epoch (size and SHA-256 against its `_SUCCESS` "
        "marker) and every retained snapshot (manifest, state files, markers, lineage), like "
        "`pipeline-lib verify`. Records each pipeline's findings (the Pipelines page shows them) and "
        "fails when anything is lost or damaged. Changes nothing else.",
    ) as dag:

        @task(task_id="verify", execution_timeout=verify_timeout(), **RETRIES)
        def verify() -> dict[str, dict[str, int]]:
            with stacks_if_stuck():
                return _verify(specs_dir)

        verify()
    return dag


def _verify(specs_dir: Path) -> dict[str, dict[str, int]]:
    """The verify task's body: each wanted job verified and its findings recorded."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipeline_lib.orchestration.airflow_connections import airflow_settings
    from pipeline_lib.recovery.verification_record import record_verification
    from pipeline_lib.recovery.verify import verify_job

    context = get_current_context()
    by = f"airflow:{VERIFY_DAG_ID}/{context['run_id']}"
    summary, damaged = {}, []
    for spec in _wanted_jobs(specs_dir, context["params"]["jobs"]):
        settings = airflow_settings(spec.airflow.connections)
        for record in record_verification(spec, settings, verify_job(spec, settings), by):
            log.info("%s/%s: %s", record.job, record.pipeline, record.text())
            summary[f"{record.job}/{record.pipeline}"] = {"checked": record.checked, "bad": record.bad}
            if record.bad:
                damaged.append(f"{record.job}/{record.pipeline} ({record.bad})")
    if damaged:
        raise AirflowFailException(
            f"lost or damaged output or snapshots in {', '.join(damaged)}: "
            "see the task log, the Pipelines page or `pipeline-lib verify`"
        )
    return summary


def _assess(specs_dir: Path) -> list[dict[str, Any]]:
    """The assess task's body: each wanted job's pipelines judged (recovery.recover)."""
    from pipeline_lib.orchestration.airflow_connections import airflow_settings
    from pipeline_lib.recovery.recover import recover_job
    from pipeline_lib.recovery.recovery_record import RecoveryPolicy

    context = get_current_context()
    params = context["params"]
    policy = RecoveryPolicy(max_relaunches=params["max_relaunches"], backoff_base_s=params["backoff_base_seconds"])
    by = f"airflow:{RECOVERY_DAG_ID}/{context['run_id']}"
    decisions = []
    for spec in _wanted_jobs(specs_dir, params["jobs"]):
        settings = airflow_settings(spec.airflow.connections)
        for d in recover_job(spec, settings, policy, by, dry_run=params["dry_run"]):
            log.info(
                "%s/%s: %s (%s)%s",
                d.job,
                d.pipeline,
                d.verdict,
                d.reason,
                f"; from {d.restore_from}, subtasks {d.subtasks}" if d.verdict == "relaunch" else "",
            )
            decisions.append(d.to_dict())
    return decisions
