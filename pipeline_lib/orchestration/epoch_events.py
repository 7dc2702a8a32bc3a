"""Asset events from a running stream: each batch of newly committed epochs, announced while the
run goes on, so a downstream DAG follows a continuous pipeline.

Airflow registers a task's asset events only when the task succeeds, and a continuous run's task
does not end. An asset *watcher* does not wait for it: ``CommittedEpochsTrigger`` runs in
Airflow's triggerer, polls the pipeline's head (the commit point of every epoch) and fires an
event for the snapshots committed since its last one, at most one event per
``min_interval_seconds`` (the epochs in between go into the next). Each flow gets its own asset
for these events, ``committed_epochs_asset``, beside the sink asset the run-end events go to
(orchestration.assets): a DAG schedules on one or the other, and so never sees an epoch twice.

What was announced is kept in Airflow's asset state store (the snapshot ids the head still
lists): a restarted triggerer resumes where it stopped, a rewind or a start-over announces the
epochs committed again, and a watcher's first start announces what the head already holds.
The trigger's kwargs are stored in Airflow's metadata DB: they hold the checkpoint URI and the
connection ids only, and the trigger reads the credentials from the connections when it runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from pipeline_lib.checkpoint.manifest import Head, HistoryEntry
from pipeline_lib.graph import build_graph
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec import load_spec

STATE_KEY = "announced"


def trigger_settings(connections: dict[str, str]) -> ConnectionSettings:
    """The settings of a trigger's connection ids, read where it runs (the triggerer). A trigger
    only reads checkpoints, so S3 comes from the read-only ``<s3>_ui`` connection when the
    triggerer has it (the compose stack gives it no job's own key), else from the job's."""
    from pipeline_lib.orchestration.airflow_connections import airflow_page_settings
    from pipeline_lib.spec.airflow_spec import AirflowConnectionsSpec

    return airflow_page_settings(AirflowConnectionsSpec(**connections))


def committed_epochs_asset_name(job: str, flow: str) -> str:
    """The name of the asset a flow's committed-epoch events go to."""
    return f"pipeline_lib__{job}__{flow}__epochs"


def new_batch(head: Head | None, announced: dict[str, Any]) -> dict[str, Any] | None:
    """The epochs the head commits that ``announced`` (``{"snapshots": [...], "epoch": n}``) has
    not: ``{"first_epoch", "last_epoch", "snapshot"}``, or None when there are none.

    An epoch the head lists under a snapshot id not announced is new; so is one committed after
    the newest announced entry but already dropped from the head's history (more commits between
    two polls than the head retains). After a start-over or a rewind the epochs numbered again
    are new: their snapshot ids are."""
    history = head.history if head is not None else []
    seen = set(announced.get("snapshots", []))
    fresh = [e for e in history if e.snapshot_id not in seen]  # guard: epoch-batch-reannounced
    if not fresh:
        return None
    older = [e for e in history if e.snapshot_id in seen and e.epoch < fresh[-1].epoch]
    last_announced = int(announced.get("epoch", 0))
    if older:
        first = older[0].epoch + 1
    elif 0 < last_announced < fresh[-1].epoch:
        first = last_announced + 1
    else:
        first = fresh[-1].epoch
    return {"first_epoch": first, "last_epoch": fresh[0].epoch, "snapshot": fresh[0].snapshot_id}


def announced_state(history: list[HistoryEntry]) -> dict[str, Any]:
    """What to remember once ``history`` is announced: its snapshot ids (bounded by the head's
    retention) and its newest epoch."""
    return {"snapshots": [e.snapshot_id for e in history], "epoch": history[0].epoch if history else 0}


class CommittedEpochsTrigger(BaseEventTrigger):
    """Fire an event for each batch of epochs the pipeline's head commits (an asset watcher's
    trigger; see the module's docstring). Its kwargs name where to look, never a credential."""

    def __init__(
        self,
        *,
        job: str,
        pipeline: str,
        flow: str,
        store: str,
        connections: dict[str, str],
        poll_seconds: float = 10.0,
        min_interval_seconds: float = 30.0,
    ):
        super().__init__()
        self.job, self.pipeline, self.flow, self.store = job, pipeline, flow, store
        self.connections = dict(connections)
        self.poll_seconds, self.min_interval_seconds = poll_seconds, min_interval_seconds
        self._memory: dict[str, Any] | None = None  # without Airflow's asset state store
        self._settings: ConnectionSettings | None = None  # read once, again after a failed read

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and kwargs Airflow stores (in its metadata DB) to rebuild the trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job": self.job,
                "pipeline": self.pipeline,
                "flow": self.flow,
                "store": self.store,
                "connections": self.connections,
                "poll_seconds": self.poll_seconds,
                "min_interval_seconds": self.min_interval_seconds,
            },
        )

    def read_head(self) -> Head | None:
        """The pipeline's head, read with the credentials of the trigger's connections (blocking;
        they are looked up again after a failed read, so a rotated key is picked up)."""
        from pipeline_lib.checkpoint.snapshot_store import SnapshotStore

        self._settings = self._settings or trigger_settings(self.connections)
        try:
            return SnapshotStore.open(self.store, self.job, self.pipeline, self._settings).read_head()[0]
        except Exception:
            self._settings = None
            raise

    async def _load(self) -> dict[str, Any]:
        if self.asset_state_store is not None:
            value = await self.asset_state_store.aget(f"{STATE_KEY}:{self.pipeline}")
            return value if isinstance(value, dict) else {}
        return self._memory or {}

    async def _save(self, state: dict[str, Any]) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(f"{STATE_KEY}:{self.pipeline}", state)
        else:
            self._memory = state

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll the head; an event per batch of epochs committed since the last (rate-limited)."""
        from asgiref.sync import sync_to_async

        last_event = float("-inf")
        while True:
            if time.monotonic() - last_event >= self.min_interval_seconds:
                try:
                    head = await sync_to_async(self.read_head, thread_sensitive=False)()
                except Exception as exc:  # a store that does not answer now may next time
                    self.log.warning("job %s pipeline %s: cannot read the head: %s", self.job, self.pipeline, exc)
                    await asyncio.sleep(self.poll_seconds)
                    continue
                announced = await self._load()
                batch = new_batch(head, announced)
                if batch is not None and head is not None:
                    await self._save(announced_state(head.history))
                    last_event = time.monotonic()
                    yield TriggerEvent({"job": self.job, "pipeline": self.pipeline, "flow": self.flow, **batch})
                elif head is not None and announced.get("snapshots") != announced_state(head.history)["snapshots"]:
                    await self._save(announced_state(head.history))  # entries aged out of the head
            await asyncio.sleep(self.poll_seconds)


def committed_epochs_asset(
    spec_path: str | Path, flow: str | None = None, *, poll_seconds: float = 10.0, min_interval_seconds: float = 30.0
) -> Asset:
    """The asset of ``flow`` (the job's only flow by default) that gets an event per batch of
    committed epochs while its pipeline runs, with the watcher that announces them: schedule a
    DAG on it. Its URI, ``x-pipeline-lib://<job>/<flow>``, names no place data is (the sink
    asset's URI does)."""
    spec = load_spec(Path(spec_path))
    flows = {f.name: f for f in spec.all_flows()}
    name = flow or next(iter(flows))
    if name not in flows:
        raise ValueError(f"job {spec.name} has no flow {name!r} (it has {', '.join(flows)})")
    pipeline = next(p.name for p in build_graph(spec).pipelines() if name in p.flows)
    trigger = CommittedEpochsTrigger(
        job=spec.name,
        pipeline=pipeline,
        flow=name,
        store=spec.checkpoint.store,
        connections=spec.airflow.connections.model_dump(),
        poll_seconds=poll_seconds,
        min_interval_seconds=min_interval_seconds,
    )
    return Asset(
        name=committed_epochs_asset_name(spec.name, name),
        uri=f"x-pipeline-lib://{spec.name}/{name}",
        group="pipeline-lib",
        watchers=[AssetWatcher(name=f"pipeline_lib__{spec.name}__{name}__head", trigger=trigger)],
    )
