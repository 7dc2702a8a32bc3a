"""A pipeline runner's restorer: from a snapshot (or none) to the flows' starting point."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipeline_lib.checkpoint.manifest import Manifest
from pipeline_lib.checkpoint.restore import DEAD_LETTERS, Restored, load_state, restore_after, restore_snapshot
from pipeline_lib.errors import SnapshotError
from pipeline_lib.execution.runtime.path_choice import owners_asked
from pipeline_lib.execution.runtime.run_attempt import RunAttempt
from pipeline_lib.execution.runtime.runner_parts import PipelineParts, restored_watermark
from pipeline_lib.execution.state.restore_verification import VerifiedState, verify_on_executors
from pipeline_lib.execution.state.span_owners import SpanOwners
from pipeline_lib.execution.state.state_kinds import new_keyed_state

log = logging.getLogger(__name__)


class Restorer:
    """Where a run starts: the chosen snapshot loaded and adopted (``restored``), its state
    verified, or the output started over; a snapshot whose topic, keys or aggregates differ is
    refused. ``stored_groups_apply``: the restored state's key groups are this run's."""

    def __init__(self, parts: PipelineParts, verify: Callable[..., VerifiedState] = verify_on_executors):
        self.parts, self.verify = parts, verify  # ``verify``: the executors' check of a state left to them
        self.restored: Restored | None = None
        self.stored_groups_apply = True
        self.state_verified = False  # the restored state was verified on the executors (verify_on_executors)

    def latest_is_completed(self) -> str | None:
        """The id of the head snapshot if it says the pipeline is COMPLETED (read nothing else)."""
        if self.parts.options.restore == "none":
            return None
        head, _ = self.parts.snapshots.read_head()
        if head is None or head.latest is None:
            return None
        if self.parts.options.restore not in ("latest", head.latest.snapshot_id):
            return None
        try:
            manifest = self.parts.snapshots.load_manifest(head.latest.snapshot_id, head.latest.manifest_sha256)
        except SnapshotError:
            return None  # the full restore will explain and fall back
        return manifest.snapshot_id if manifest.completed else None

    def restore(self) -> Restored | None:
        """Load the chosen snapshot into the flows' state and sinks, or None to start from the
        beginning. A state bound for owner tasks is not read here: ``verify_on_executors``
        has the executors verify it once Spark runs."""
        restored = restore_snapshot(
            self.parts.snapshots, self.sinks(), self.parts.options.restore, self.state_on_driver
        )
        if restored is None:
            if self.parts.options.restore == "none":
                self.parts.snapshots.discard_plans_from(1)
            return None
        self._adopt(restored)
        return restored

    def sinks(self) -> dict:
        """Each flow's sink store, and the dead letters', as a restore checks their epochs."""
        sinks = {f.spec.name: f.sink.store for f in self.parts.flows}
        if self.parts.dead_letters is not None:
            sinks[DEAD_LETTERS] = self.parts.dead_letters.store
        return sinks

    def state_on_driver(self, manifest: Manifest) -> bool:
        """Whether a restore of ``manifest`` reads its state on the driver: unless the spec puts
        keyed state on owner tasks (path_choice, on either path) and the stored key groups
        still apply."""
        owners = owners_asked(self.parts.job, self.parts.settings.spark_master)
        maxp = self.parts.maxp
        same_groups = all(c.state is None or c.state.max_parallelism == maxp for c in manifest.flows.values())
        return not (owners and same_groups)

    def _adopt(self, restored: Restored) -> None:
        """Make ``restored`` the flows' starting point: their state (when the restore loaded it),
        state files and key counts; ``stored_groups_apply`` says whether its key groups are ours."""
        self._check_compatible(restored.manifest)
        self.stored_groups_apply = True
        for flow in self.parts.flows:
            flow.state = new_keyed_state(flow.spec.state, self.parts.maxp)
            flow.state_schema, flow.state_files, flow.owned_keys = None, {}, 0
            flow.watermark = restored_watermark(self.parts.job, flow.spec, restored.manifest)
            loaded = restored.flows.get(flow.spec.name)
            if loaded is None:  # a flow added to the spec since: it starts empty from this position
                continue
            commit = restored.manifest.flows[flow.spec.name]
            if flow.state is not None and commit.state is not None:
                same_groups = commit.state.max_parallelism == self.parts.maxp  # the stored key groups still apply
                self.stored_groups_apply &= same_groups
                flow.owned_keys = commit.state.keys
                if loaded.tables:
                    flow.state.load(loaded.table(), loaded.key_groups() if same_groups else None)
                    flow.state_schema = loaded.schema
                if commit.state.parallelism != self.parts.parallelism:
                    log.info(
                        "pipeline %s flow %s: rescaling keyed state from %d to %d subtasks",
                        self.parts.pipeline.name,
                        flow.spec.name,
                        commit.state.parallelism,
                        self.parts.parallelism,
                    )
                if same_groups:  # spans still on the grid and unchanged keep referencing these files
                    flow.state_files = {(f.key_group_start, f.key_group_end): f for f in commit.state.files}
                if not restored.state_loaded:  # bound for owner tasks (or for load_on_driver)
                    flow.state = None
        self.restored = restored
        if restored.state_loaded:
            self._log_driver_state_bytes()

    def _log_driver_state_bytes(self, beside: str = "") -> None:
        """The measure that the owner path's restore decodes no state on the driver."""
        assert self.restored is not None
        log.info(
            "pipeline %s: restore of snapshot %s read %d bytes of state on the driver%s",
            self.parts.pipeline.name,
            self.restored.manifest.snapshot_id,
            self.restored.driver_state_bytes,
            beside,
        )

    def verify_on_executors(self, spark) -> None:
        """A restore that left its state to the executors has them verify it now, before anything
        of this attempt is visible (see execution.state.restore_verification); a missing or corrupt span
        falls back to the snapshot before, as a restore on the driver does. The owners are this
        run's: a rescale only changes which task checks which span."""
        while self.restored is not None and not self.restored.state_loaded and not self.state_verified:
            restored = self.restored
            parts = self.parts
            owners = {
                flow.spec.name: SpanOwners(parts.parallelism, parts.maxp, parts.key_groups_per_file(flow.owned_keys))
                for flow in parts.flows
                if flow.stateful
            }
            checkpoint = parts.checkpoint_at()
            started = time.monotonic()
            try:
                verified = self.verify(
                    spark,
                    checkpoint,
                    restored.manifest,
                    owners,
                    parts.parallelism,
                    parts.job.checkpoint.cache_bytes,
                    parts.options.startup_timeout_s,
                )
            except SnapshotError as exc:
                self.restored = None  # until the fall-back succeeds (it raises when nothing is left)
                self._adopt(
                    restore_after(
                        self.parts.snapshots,
                        self.sinks(),
                        self.parts.options.restore,
                        restored,
                        exc,
                        self.state_on_driver,
                    )
                )
                continue
            for flow in self.parts.flows:
                flow.state_schema = verified.schemas.get(flow.spec.name, flow.state_schema)
            self.state_verified = True  # the owners load it, from their caches
            self._log_driver_state_bytes(
                f"; {verified.files} state files ({verified.fetched_bytes} bytes) "
                f"verified on the executors in {time.monotonic() - started:.1f}s"
            )

    def load_on_driver(self) -> None:
        """The driver's keyed state, from a restore verified on the executors: the epochs take
        the driver path after all (a flow the Arrow path cannot take)."""
        assert self.restored is not None
        flows, self.restored.driver_state_bytes = load_state(self.parts.snapshots, self.restored.manifest)
        self.restored.flows.update(flows)
        self.restored.state_loaded = True
        self._adopt(self.restored)

    def start_over(self, attempt: RunAttempt) -> None:
        """A run without a snapshot starts the output over. First the head is reset by
        compare-and-swap: the durable decision (a crash after it starts over again), and it fences
        every older attempt, which could otherwise still commit an epoch of the abandoned run.
        Then every epoch the sinks hold is retracted, so an abandoned run's epochs past this
        run's last one can never be read beside it (an upsert reader would take their stale rows)."""
        attempt.head_version, committed_through = self.parts.snapshots.reset_head(attempt.head_version)
        dead_letters = self.parts.dead_letters
        sinks = [f.sink for f in self.parts.flows] + ([dead_letters] if dead_letters is not None else [])
        for sink in sinks:
            retracted = sink.retract_all(attempt.number, committed_through)
            if retracted:
                log.warning(
                    "pipeline %s: starting over without a snapshot; retracted %d epoch(s) of %s",
                    self.parts.pipeline.name,
                    retracted,
                    sink.location,
                )

    def _check_compatible(self, m: Manifest) -> None:
        """A snapshot's state only means something for the same topic, keys and aggregates."""
        if m.topic != self.parts.topic:
            raise SnapshotError(f"snapshot {m.snapshot_id} read topic {m.topic!r}, the spec reads {self.parts.topic!r}")
        for flow in self.parts.flows:
            commit = m.flows.get(flow.spec.name)
            if commit is None:
                continue
            want = flow.spec.state
            have = commit.state
            same = (want is None and have is None) or (
                want is not None
                and have is not None
                and want.state_key() == have.key_columns
                and want.snapshot_columns() == have.value_columns
            )
            if not same:
                raise SnapshotError(
                    f"snapshot {m.snapshot_id} holds state {have.key_columns if have else None} / "
                    f"{have.value_columns if have else None} for flow {flow.spec.name}, which its state step no "
                    "longer matches; use --restore none to start over"
                )
