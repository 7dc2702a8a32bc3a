"""The operator that runs a job: one action, owning its child process.

A TaskFlow function cannot react to being stopped; an operator's ``on_kill`` can. When a user
marks the task failed or stops its DAG run, Airflow calls ``on_kill``: the run is asked to stop
gracefully (the epoch in flight commits, the pipelines record STOPPED, so ``pipeline_recovery``
does not relaunch what a person stopped) and is killed as a group only if it does not stop.
When the run committed epochs, the operator announces each sink of those pipelines as an asset
event (orchestration.assets).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from pipeline_lib.orchestration.assets import committed_events, job_alias
from pipeline_lib.orchestration.launch_request import LaunchRequest
from pipeline_lib.orchestration.launcher import LaunchedRun

log = logging.getLogger(__name__)


class RunJobOperator(BaseOperator):
    """Launch the job of ``spec_path`` with the request validated by ``request_task_id``."""

    def __init__(self, *, spec_path: str, job_name: str, request_task_id: str = "check_params",
                 stop_grace_s: float = 45.0, **kwargs: Any):
        kwargs.setdefault("outlets", [job_alias(job_name)])  # sink events, see orchestration.assets
        super().__init__(**kwargs)
        self.spec_path, self.job_name = spec_path, job_name
        self.request_task_id, self.stop_grace_s = request_task_id, stop_grace_s
        self._run: LaunchedRun | None = None

    def execute(self, context) -> dict[str, Any]:
        """Run the job to its end, streaming its log into the task's; fail the task if the run failed."""
        from airflow.exceptions import AirflowException

        from pipeline_lib.orchestration.airflow_connections import airflow_settings

        request = LaunchRequest(**context["ti"].xcom_pull(task_ids=self.request_task_id))
        launched_by = f"airflow:{self.dag_id}/{context['run_id']}"
        self._run = LaunchedRun(Path(self.spec_path), request, airflow_settings(), launched_by)
        self._run.start(log.info)
        result = self._run.wait(log.info)
        if result.returncode != 0:
            raise AirflowException(f"job {self.job_name} failed (exit {result.returncode}): {result.last_error}")
        self._emit_sink_events(context, result.summary or {})
        return result.summary or {}

    def _emit_sink_events(self, context, summary: dict[str, Any]) -> None:
        """An asset event per sink whose pipeline committed epochs in this run."""
        from pipeline_lib.spec import load_spec

        alias = job_alias(self.job_name)
        if alias not in self.outlets:
            return
        for asset, extra in committed_events(load_spec(Path(self.spec_path)), summary):
            context["outlet_events"][alias].add(asset, extra=extra)
            log.info("asset event for %s: epochs %s-%s", asset.uri, extra["first_epoch"], extra["last_epoch"])

    def on_kill(self) -> None:
        """Airflow stops the task: ask the run to stop after its epoch in flight instead of killing it."""
        if self._run is not None:
            log.warning("task stopped: asking job %s to stop after the epoch in flight", self.job_name)
            self._run.stop(self.stop_grace_s)
