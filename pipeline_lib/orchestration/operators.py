"""The operator that runs a job: one action, owning its child process.

A TaskFlow function cannot react to being stopped; an operator's ``on_kill`` can. When a user
marks the task failed or stops its DAG run, Airflow calls ``on_kill``: the run is asked to stop
gracefully (the epoch in flight commits, the pipelines record STOPPED, so ``pipeline_recovery``
does not relaunch what a person stopped) and is killed as a group only if it does not stop.
When the run committed epochs, the operator announces each sink of those pipelines as an asset
event (orchestration.assets).

The operator works in a user's own DAG file: ``RunJobOperator(task_id=..., spec_path=...)``
with the trigger form's fields as arguments (their defaults are the form's; each may be a Jinja
template), checked at parse time (a template after rendering) and again against the spec as it is
when the task runs. The generated ``pipeline__<job>`` DAGs instead pass ``request_task_id``: the
request their ``check_params`` task validated.

Around the launch it records the run's settings beside each pipeline's snapshots (so a relaunch
keeps them) and, if the job's process dies, marks its still-RUNNING status LOST at once
(orchestration.run_records). Each line of the job's output is logged at its own level
(orchestration.job_log). With the OpenLineage provider installed, a run reports its Kafka topics
as inputs and its sinks as outputs.

``deferrable=True`` (or Airflow's ``[operators] default_deferrable``) frees the worker slot while
the job runs: the run is started detached (orchestration.detached_run), the task defers to a
trigger that watches its status records (orchestration.run_watch), and resumes when the run ends
to log the job's output and report as the task that waited does, red with the reason when the
run was killed, fenced or failed.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from pydantic import ValidationError

from pipeline_lib.errors import SpecError
from pipeline_lib.orchestration.assets import committed_events, job_alias
from pipeline_lib.orchestration.detached_run import JOB_LOG, read_result, start_detached
from pipeline_lib.orchestration.job_log import JobLogLevels
from pipeline_lib.orchestration.launch_request import LaunchRequest, check_restore_target, pipeline_names
from pipeline_lib.orchestration.launcher import LaunchedRun, LaunchResult
from pipeline_lib.orchestration.lineage_facets import facets, run_datasets
from pipeline_lib.orchestration.operator_links import PipelinesPageLink
from pipeline_lib.orchestration.run_records import mark_dead, record_launch
from pipeline_lib.orchestration.run_watch import RunWatchTrigger
from pipeline_lib.spec import load_spec
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)
REQUEST_FIELDS = (
    "mode",
    "restore",
    "parallelism",
    "pipelines",
    "spark_conf",
    "lease_seconds",
    "stall_seconds",
    "reason",
)


def _templated(value: Any) -> bool:
    """Whether a field still holds a Jinja template (checked once rendered, not at parse time)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_templated(v) for v in value.values())
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    return False


class RunJobOperator(BaseOperator):
    """Launch the job of ``spec_path``: with the request fields given here (``mode``,
    ``restore``, ``parallelism``, ``pipelines``, ``spark_conf``, ``lease_seconds``,
    ``stall_seconds``, ``reason``; unset ones take the trigger form's defaults), or, when
    ``request_task_id`` is set, with the request that task returned as its XCom. ``deferrable``:
    wait for the run in the triggerer, polling its status every ``poll_seconds``."""

    template_fields = ("spec_path", *REQUEST_FIELDS)
    operator_extra_links = (PipelinesPageLink(),)

    def __init__(
        self,
        *,
        spec_path: str,
        job_name: str | None = None,
        request_task_id: str | None = None,
        stop_grace_s: float = 45.0,
        mode: str | None = None,
        restore: str | None = None,
        parallelism: int | None = None,
        pipelines: list[str] | None = None,
        spark_conf: dict[str, str] | None = None,
        lease_seconds: float | None = None,
        stall_seconds: float | None = None,
        reason: str | None = None,
        deferrable: bool | None = None,
        poll_seconds: float = 5.0,
        **kwargs: Any,
    ):
        if job_name is None:  # read once at parse time: the alias below needs the job's name
            job_name = load_spec(Path(spec_path)).name
        fields = {
            "mode": mode,
            "restore": restore,
            "parallelism": parallelism,
            "pipelines": pipelines,
            "spark_conf": spark_conf,
            "lease_seconds": lease_seconds,
            "stall_seconds": stall_seconds,
            "reason": reason,
        }
        given = {k: v for k, v in fields.items() if v is not None}
        if request_task_id is not None and given:
            raise ValueError(
                f"RunJobOperator: give request_task_id or the request's fields ({', '.join(sorted(given))}), not both"
            )
        try:  # a bad value fails the DAG file's parse, not a run hours later; a template once rendered
            LaunchRequest.model_validate({k: v for k, v in given.items() if not _templated(v)})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "request"
            raise ValueError(f"RunJobOperator for job {job_name}: {where}: {first['msg']}") from None
        kwargs.setdefault("outlets", [job_alias(job_name)])  # sink events, see orchestration.assets
        super().__init__(**kwargs)
        for name, value in fields.items():
            setattr(self, name, value)
        self.spec_path, self.job_name = spec_path, job_name
        self.request_task_id, self.stop_grace_s = request_task_id, stop_grace_s
        if deferrable is None:
            from airflow.configuration import conf

            deferrable = conf.getboolean("operators", "default_deferrable", fallback=False)
        self.deferrable, self.poll_seconds = deferrable, poll_seconds
        self._run: LaunchedRun | None = None

    def launch_request(self, spec: JobSpec, context) -> LaunchRequest:
        """The request of this run: the XCom of ``request_task_id``, or this operator's fields
        checked against the spec as it is when the task runs (pipelines it has, parallelism within its bound)."""
        if self.request_task_id is not None:
            return LaunchRequest(**context["ti"].xcom_pull(task_ids=self.request_task_id))
        return LaunchRequest.from_conf(self.request_fields, spec)

    @property
    def request_fields(self) -> dict[str, Any]:
        """The request's fields given to this operator (rendered, when the task runs)."""
        return {k: v for k in REQUEST_FIELDS if (v := getattr(self, k, None)) is not None}

    def execute(self, context) -> dict[str, Any]:
        """Run the job to its end, streaming its log into the task's; fail the task if the run
        failed. Deferrable: start it detached and wait in the triggerer."""
        from pipeline_lib.orchestration.airflow_connections import airflow_settings

        spec = load_spec(Path(self.spec_path))
        if spec.name != self.job_name:
            raise SpecError(f"{self.spec_path} is job {spec.name}, not {self.job_name}")
        request = self.launch_request(spec, context)
        settings = airflow_settings(spec.airflow.connections)
        if self.request_task_id is None:  # the generated DAGs' check_params made this check
            check_restore_target(spec, request, settings)
        launched_by = f"airflow:{self.dag_id}/{context['run_id']}"
        record_launch(spec, request, settings, launched_by)
        if self.deferrable:
            self._defer(spec, request, settings, launched_by)
        self._run = LaunchedRun(Path(self.spec_path), request, settings, launched_by)
        levels = JobLogLevels()
        self._run.start(log.info)
        result = self._run.wait(lambda line: log.log(*levels(line)))
        if result.returncode != 0:
            why = f"its process ended with exit {result.returncode} ({result.last_error or 'no error printed'})"
            if marked := mark_dead(spec, request, settings, launched_by, why):
                log.error("marked %s LOST: %s", ", ".join(marked), why)
        return self._finish(context, result)

    def _finish(self, context, result: LaunchResult, also: str | None = None) -> dict[str, Any]:
        """The task's end: red if the run failed (with ``also``, what its statuses said), else
        the sinks' asset events and the summary as the XCom."""
        from airflow.exceptions import AirflowException

        if result.returncode != 0:
            why = "; ".join(w for w in (result.last_error, also) if w)
            raise AirflowException(f"job {self.job_name} failed (exit {result.returncode}): {why}")
        self._emit_sink_events(context, result.summary or {})
        return result.summary or {}

    def _defer(self, spec: JobSpec, request: LaunchRequest, settings, launched_by: str) -> None:
        """Start the run detached and defer to the trigger that watches it (ids and paths only:
        the trigger's kwargs are stored in Airflow's metadata DB)."""
        run_dir, pid = start_detached(Path(self.spec_path), request, settings, launched_by)
        log.info("job %s runs detached (pid %d, folder %s); the triggerer watches it", self.job_name, pid, run_dir)
        trigger = RunWatchTrigger(
            job=spec.name,
            store=spec.checkpoint.store,
            pipelines=request.pipelines or pipeline_names(spec),
            connections=spec.airflow.connections.model_dump(),
            launched_by=launched_by,
            run_dir=str(run_dir),
            poll_seconds=self.poll_seconds,
        )
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context, event: dict[str, Any]) -> dict[str, Any]:
        """The deferred run ended: its output into the task's log, then the end as ``execute``'s."""
        from airflow.exceptions import AirflowException

        run_dir = Path(event["run_dir"])
        levels = JobLogLevels()
        try:
            with open(run_dir / JOB_LOG, encoding="utf-8") as lines:
                for line in lines:
                    log.log(*levels(line.rstrip("\n")))
        except OSError:
            log.warning("the run's output (%s) is not on this machine", run_dir / JOB_LOG)
        ended = read_result(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        if ended is None:  # the run's folder is elsewhere: its statuses are all there is
            if event["outcome"] != "ended":
                raise AirflowException(f"job {self.job_name} failed: {event['reason']}")
            return self._finish(context, LaunchResult(0, None, None))
        result = LaunchResult(ended["returncode"], ended["summary"], ended["last_error"])
        return self._finish(context, result, event.get("reason"))

    def _emit_sink_events(self, context, summary: dict[str, Any]) -> None:
        """An asset event per sink whose pipeline committed epochs in this run."""
        alias = job_alias(self.job_name)
        if alias not in self.outlets:
            return
        for asset, extra in committed_events(load_spec(Path(self.spec_path)), summary):
            context["outlet_events"][alias].add(asset, extra=extra)
            log.info("asset event for %s: epochs %s-%s", asset.uri, extra["first_epoch"], extra["last_epoch"])

    def _datasets(self, pipelines: list[str] | None = None):
        from pipeline_lib.orchestration.airflow_connections import airflow_settings

        spec = load_spec(Path(self.spec_path))
        bootstrap = airflow_settings(spec.airflow.connections).kafka_bootstrap
        return run_datasets(spec, bootstrap, pipelines or self.request_fields.get("pipelines"))

    def get_openlineage_facets_on_start(self):
        """OpenLineage (provider): the topics the run reads and the sinks it writes."""
        return facets(*self._datasets())

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage (provider): the topics and sinks of the pipelines that committed epochs."""
        summary = task_instance.xcom_pull(task_ids=task_instance.task_id) or {}
        ran = [p["name"] for p in summary.get("pipelines", []) if p.get("epochs")]
        return facets(*self._datasets(ran or None))

    def on_kill(self) -> None:
        """Airflow stops the task: ask the run to stop after its epoch in flight instead of killing it."""
        if self._run is not None:
            log.warning("task stopped: asking job %s to stop after the epoch in flight", self.job_name)
            self._run.stop(self.stop_grace_s)
