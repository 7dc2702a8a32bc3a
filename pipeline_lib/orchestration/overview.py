"""What the Airflow UI page shows: every job of the specs folder, its pipelines, their observed
status, lag, latest snapshot, snapshot history, what recovery did and what the last verification
found. Read-only.

Lag is the records between each pipeline's committed positions and the topic's end offsets,
asked of the broker with a short timeout; a broker that does not answer leaves the page working
and says so in the lag column instead.

A view has a time budget: the pipelines (and lag) it has not reached when the budget runs out are
shown as not read, and the overview says so, so that slow stores cannot hold a view for minutes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import PipelineError
from pipeline_lib.graph import build_graph
from pipeline_lib.orchestration.job_specs import job_dag_id, load_spec_folder
from pipeline_lib.orchestration.snapshot_rows import newest_snapshots
from pipeline_lib.recovery.recover import in_a_row, kept_settings
from pipeline_lib.recovery.recovery_record import read_launch, read_record
from pipeline_lib.recovery.verification_record import read_verification
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.models import JobSpec

log = logging.getLogger(__name__)


@dataclass
class PipelineView:
    """What the UI shows of one pipeline: its observed status, lag and latest snapshot."""

    name: str
    flows: list[str]
    topic: str
    status: str  # observed: SCHEDULING | RUNNING | STOPPED | COMPLETED | FAILED | LOST | STALLED | NEW | UNKNOWN
    reason: str | None = None
    attempt: int | None = None
    epoch: int | None = None  # the latest committed epoch (the head's, or the status record's if newer)
    heartbeat_age_s: float | None = None
    launched_by: str | None = None
    subtasks: str | None = None  # "6/6 started"
    lag: int | None = None
    lag_note: str | None = None
    latest_snapshot: str | None = None
    latest_at: str | None = None
    keys: int | None = None
    positions: dict[str, int] = field(default_factory=dict)  # committed: partition -> next offset
    history: list[dict] = field(default_factory=list)  # the newest snapshots the store lists, newest first
    history_total: int = 0  # snapshots listed in all (the history shows at most HISTORY_ROWS)
    retained: int = 0  # committed snapshots the head keeps: what a start-over discards
    recovery: str | None = None
    verified: str | None = None  # the last verification (pipeline_verify), one line
    verified_ok: bool | None = None  # None: never verified
    settings: dict = field(default_factory=dict)  # the run settings a restore keeps (mode, Spark settings...)
    run_dag: str | None = None  # the Airflow DAG run that launched the current attempt, if one did
    run_id: str | None = None
    parallelism: int | None = None  # the latest snapshot's (autoscale changes it between epochs)
    scaled: str | None = None  # the latest parallelism changes the history shows, newest first


@dataclass
class JobView:
    """What the UI shows of one job: its spec file, DAG and pipelines."""

    name: str
    spec_file: str
    dag_id: str
    store: str
    pipelines: list[PipelineView]


@dataclass
class Overview:
    """The UI page's whole state at one moment, served as JSON."""

    jobs: list[JobView]
    spec_errors: dict[str, str]
    generated_at: str
    incomplete: str | None = None  # why some pipelines (or their lag) were not read

    def to_dict(self) -> dict:
        """Plain JSON-ready data for the UI's API."""
        return asdict(self)


VIEW_BUDGET_S = 8.0  # what one build of the page may take (the page refreshes every 10 s)
NOT_READ = "not read: this view's time budget ran out"
Opener = Callable[[str, str, str, ConnectionSettings], SnapshotStore]


def build_overview(
    specs_dir: Path,
    settings: ConnectionSettings | Callable[[JobSpec], ConnectionSettings],
    lag: bool = True,
    now: dt.datetime | None = None,
    budget_s: float = VIEW_BUDGET_S,
    open_snapshots: Opener = SnapshotStore.open,
) -> Overview:
    """Read every job's checkpoints (and Kafka lag if ``lag``) into the overview the UI renders,
    within ``budget_s`` seconds: what is not reached by then is marked not read. ``settings``
    is one for all jobs, or a job's own (its spec's ``airflow.connections``)."""
    now = now or dt.datetime.now(dt.UTC)
    deadline = time.monotonic() + budget_s
    folder = load_spec_folder(specs_dir)
    settings_of = settings if callable(settings) else (lambda _spec: settings)
    jobs = [
        _job_view(path, spec, settings_of(spec), now, lag, deadline, open_snapshots)
        for path, spec in folder.specs.items()
    ]
    errors = {path.name: error for path, error in folder.errors.items()}
    skipped = sum(1 for j in jobs for p in j.pipelines if p.reason == NOT_READ or p.lag_note == NOT_READ)
    incomplete = (
        (
            f"this view ran out of its {budget_s:g} s budget: {skipped} pipeline(s) not (fully) read; "
            "the next refresh tries again"
        )
        if skipped
        else None
    )
    return Overview(jobs, errors, now.strftime("%Y-%m-%d %H:%M:%S UTC"), incomplete)


def _job_view(
    path: Path,
    spec: JobSpec,
    settings: ConnectionSettings,
    now: dt.datetime,
    lag: bool,
    deadline: float,
    open_snapshots: Opener,
) -> JobView:
    sources = spec.all_sources()
    views = []
    for pipeline in build_graph(spec).pipelines():
        view = PipelineView(pipeline.name, list(pipeline.flows), sources[pipeline.source].kafka.topic, "UNKNOWN")
        if time.monotonic() >= deadline:
            view.reason = NOT_READ
        else:
            try:
                _fill(view, open_snapshots(spec.checkpoint.store, spec.name, pipeline.name, settings), now, spec)
            except Exception as exc:  # one unreachable store must not blank the page
                view.reason = f"cannot read the checkpoint store: {exc}"
        views.append(view)
    if lag:
        _fill_lag([v for v in views if v.reason != NOT_READ], settings, deadline)
    return JobView(spec.name, path.name, job_dag_id(spec.name), spec.checkpoint.store, views)


def _fill(view: PipelineView, snapshots: SnapshotStore, now: dt.datetime, spec: JobSpec) -> None:
    status = snapshots.read_status()
    if status is None:
        view.status = "NEW"
        view.settings = {"mode": "until_caught_up", "parallelism": spec.parallelism}
    else:
        view.status, view.reason = status.observed(now)
        view.attempt, view.epoch = status.attempt, status.epoch
        view.launched_by = status.launch.launched_by if status.launch else None
        if status.heartbeat_at is not None:
            view.heartbeat_age_s = round((now - status.heartbeat_at).total_seconds(), 1)
        if status.subtasks_total:
            view.subtasks = f"{status.subtasks_started}/{status.subtasks_total} started"
        view.settings = kept_settings(spec, status, read_launch(snapshots, view.launched_by), view.name)
        if view.launched_by and view.launched_by.startswith("airflow:") and "/" in view.launched_by:
            view.run_dag, view.run_id = view.launched_by.removeprefix("airflow:").split("/", 1)
    rows, view.history_total, view.retained = newest_snapshots(snapshots)
    view.history = [
        {
            k: r.get(k)
            for k in (
                "snapshot_id",
                "epoch",
                "created_at",
                "records_read",
                "keys",
                "status",
                "completed",
                "data_lost",
                "parallelism",
            )
        }
        for r in rows
    ]
    head = next((r for r in rows if r.get("head")), None)
    if head is not None:
        view.latest_snapshot, view.latest_at, view.keys = head["snapshot_id"], head.get("created_at"), head.get("keys")
        view.positions = head.get("positions") or {}
        view.parallelism, view.scaled = head.get("parallelism"), parallelism_changes(rows)
        # the status record carries the epoch only from its next heartbeat; the head has it at once
        view.epoch = max(view.epoch or 0, head.get("epoch") or 0)
    record, version = read_record(snapshots)
    if version is not None and record.history:
        view.recovery = _recovery_text(record, status is None or in_a_row(record, status))
    verification = read_verification(snapshots)
    if verification is not None:
        view.verified, view.verified_ok = verification.text(), not verification.bad


def _recovery_text(record, counting: bool) -> str:
    """The latest event, and the latest relaunch if that is older (what an operator asks first)."""

    def text(e) -> str:
        return f"{e.action.replace('_', ' ')} at {e.at:%Y-%m-%d %H:%M:%S}: {e.reason}"

    last = record.history[0]
    parts = [text(last)]
    relaunch = next((e for e in record.history if e.action == "relaunch"), None)
    if relaunch is not None and relaunch is not last:
        parts.append(f"last {text(relaunch)} ({relaunch.trigger_run_id})")
    if record.relaunches and counting:  # a count that the current attempt continues
        parts.append(f"relaunches in a row: {record.relaunches}")
    if record.gave_up:
        parts.append("gave up: restore it by hand")
    return "; ".join(parts)


def _fill_lag(views: list[PipelineView], settings: ConnectionSettings, deadline: float) -> None:
    if not settings.kafka_bootstrap:
        for v in views:
            v.lag_note = "no Kafka connection configured"
        return
    if not views or time.monotonic() >= deadline:
        for v in views:
            v.lag_note = NOT_READ
        return
    try:
        from pipeline_lib.kafka_clients import partitions_of
        from pipeline_lib.kafka_login import LOGIN_TIMEOUT_S, check_login
        from pipeline_lib.plan import kafka_offsets

        kafka = settings.require_kafka()
        check_login(kafka, timeout_s=max(1.0, min(LOGIN_TIMEOUT_S, deadline - time.monotonic())))
        with kafka_offsets.offsets_consumer(kafka) as consumer:
            for v in views:
                left = deadline - time.monotonic()
                if left <= 0:
                    v.lag_note = NOT_READ
                    continue
                try:
                    partitions = sorted(partitions_of(consumer, v.topic))
                    if not partitions:
                        v.lag_note = f"topic {v.topic} not found"
                        continue
                    # confirmed by a fetch (Tansu's ListOffsets under-reports), to the last stable offset
                    ends = kafka_offsets.confirmed_end_offsets(consumer, v.topic, partitions, timeout_s=min(5, left))
                    done = {int(p): o for p, o in v.positions.items()}
                    v.lag = sum(max(0, end - done.get(p, 0)) for p, end in ends.items())
                except Exception as exc:
                    v.lag_note = f"lag unknown: {str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__}"
    except Exception as exc:
        for v in views:
            # the login check's and the settings' errors name what is wrong and hold no secret
            why = str(exc)[:200] if isinstance(exc, PipelineError) else type(exc).__name__
            v.lag_note = v.lag_note or f"broker unreachable: {why}"


def parallelism_changes(rows: list[dict], most: int = 3) -> str | None:
    """The latest changes of parallelism between consecutive snapshots of ``rows`` (newest
    first), e.g. "2 → 3 at epoch 9 · 1 → 2 at epoch 4"; None: none in the history shown."""
    known = [(r["epoch"], r["parallelism"]) for r in rows if r.get("parallelism") and r.get("epoch")]
    changes = [
        f"{before} → {after} at epoch {epoch}"
        for (epoch, after), (_, before) in zip(known, known[1:], strict=False)
        if after != before
    ]
    return " · ".join(changes[:most]) or None
