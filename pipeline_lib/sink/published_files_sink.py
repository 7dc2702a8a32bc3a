"""The files sink a flow's ``sink.files`` names: the commit protocol in ``_staging/``, each
committed epoch then copied to ``epoch=<n>/`` (sink.visible_epochs).

Every writer (read tasks, owner tasks, the driver) writes its parts under ``<path>/_staging/``,
and the epoch's ``_SUCCESS`` is written there by compare-and-swap, as for any files sink: restore,
``verify`` and ``repair`` check that staged commit (``SinkSpec.parts_location``). Once HEAD moved,
the epoch's background clean-up deletes the stale staged parts and publishes the epoch: a
server-side copy of each listed part, then the marker. So the copies are off the epoch's critical
path (the clean-up runs while the next epoch reads), only a committed epoch is ever published,
and an attempt that HEAD fenced never reaches its clean-up. A run publishes, once, every staged
epoch up to the one it restored that is not published yet (a run killed between its commit and
its clean-up), and a start-over publishes its emptied markers, which removes the old parts.
An epoch whose staged part was lost holds the publication there until it is repaired.
The clean-up then deletes the staged epochs older than every retained snapshot once published
(sink.staged_retention): the folder keeps the changelog, ``_staging/`` about ``retain`` epochs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from pipeline_lib.checkpoint.manifest import FileRef, SinkCommit
from pipeline_lib.errors import NotFound
from pipeline_lib.sink.files_sink import FilesSink, SuccessMarker
from pipeline_lib.sink.staged_retention import retire_staged
from pipeline_lib.sink.table_reader import committed_epochs
from pipeline_lib.sink.visible_epochs import publish_epoch, staged, unpublished
from pipeline_lib.spec.flow_spec import FlowSpec
from pipeline_lib.storage import ObjectStore

log = logging.getLogger(__name__)


class PublishedFilesSink:
    """A ``FilesSink`` in ``_staging/`` whose committed epochs are published to ``visible`` (the
    sink's folder). Offers what the runner asks of a ``FilesSink``, on the staged commit."""

    def __init__(self, staging: FilesSink, visible: ObjectStore):
        self.staging, self.visible = staging, visible
        self._caught_up = False  # the epochs before this run's first commit were published

    @property
    def store(self) -> ObjectStore:
        """The staging store: the parts and markers restore, verify and repair check."""
        return self.staging.store

    @property
    def format(self) -> str:
        """The parts' encoding."""
        return self.staging.format

    @property
    def location(self) -> str:
        """The sink's folder (for logs)."""
        return self.visible.describe()

    @staticmethod
    def epoch_dir(epoch: int) -> str:
        """The folder of ``epoch``'s parts, under the staging store."""
        return FilesSink.epoch_dir(epoch)

    def marker_key(self, epoch: int) -> str:
        """The key of ``epoch``'s staged ``_SUCCESS`` marker."""
        return self.staging.marker_key(epoch)

    def committed_epochs(self) -> list[int]:
        """Epochs whose staged marker exists, ascending."""
        return self.staging.committed_epochs()

    def write_epoch(
        self, epoch: int, digest: str, parts: list[pa.Table], attempt: int, written: Sequence[FileRef] = ()
    ) -> SinkCommit:
        """The staged commit, as a files sink writes it; nothing visible changes."""
        return self.staging.write_epoch(epoch, digest, parts, attempt, written)

    def remove_stale_parts(self, commit: SinkCommit, attempt: int) -> None:
        """After HEAD moved: the staged parts the marker does not list go, then the epoch (and,
        once per run, every earlier one not published yet) is published."""
        self.staging.remove_stale_parts(commit, attempt)
        self.publish_through(commit.epoch, attempt)

    @property
    def caught_up(self) -> bool:
        """Whether every committed epoch this run saw is published (none held back)."""
        return self._caught_up

    def publish_through(self, epoch: int, attempt: int) -> int:
        """Publish ``epoch``, and on the run's first call (or after a publication stopped) every
        staged epoch before it that is not published yet, in order. A committed epoch whose
        staged part is missing (damage ``repair`` restores) stops the publication there, with
        a warning: the folder keeps a prefix of the committed epochs, never one with a gap, and
        a later call goes on from it. Returns the epochs published."""
        epochs = unpublished(self.visible, epoch) if not self._caught_up else [epoch]
        for n, each in enumerate(epochs):
            try:
                done = publish_epoch(self.visible, each, attempt)
            except NotFound as exc:
                self._caught_up = False  # guard: publish-gap-forgotten
                log.warning(
                    "%s stays at epoch %d: committed epoch %d cannot be published (%s); `pipeline-lib repair` "
                    "restores the part, and a later clean-up or run publishes it",
                    self.location,
                    each - 1,
                    each,
                    exc,
                )
                return n
            log.debug("epoch %d of %s: %s", each, self.location, done)
        self._caught_up = True
        return len(epochs)

    def retire_staged(self, history_epochs: list[int]) -> list[int]:
        """After the clean-up published: delete the staged epochs older than every retained
        snapshot's (``history_epochs``) whose copy is published. Returns those epochs."""
        dropped = retire_staged(self.staging, self.visible, history_epochs)
        if dropped:
            log.info("%s: deleted published staged epochs %d..%d", self.location, dropped[0], dropped[-1])
        return dropped

    def retract_all(self, attempt: int, committed_through: int = 0) -> int:
        """Start the output over: the staged markers as a files sink retracts them, then each
        retracted epoch published (an empty marker; its old parts deleted). A published epoch
        whose staged copy was retired gets an empty staged marker first, so it is retracted
        too. Returns the epochs retracted."""
        staged_now = set(self.staging.committed_epochs())
        for epoch in committed_epochs(self.visible):
            if epoch not in staged_now:  # guard: retract-skips-retired-epochs
                empty = SuccessMarker(epoch=epoch, digest="", files=[], attempt=attempt)
                # create only: a marker staged meanwhile is retracted (or fences) below
                self.visible.put_if(staged(self.marker_key(epoch)), empty.model_dump_json(indent=1).encode(), None)
        retracted = self.staging.retract_all(attempt, committed_through)
        for epoch in unpublished(self.visible, max([committed_through, *self.staging.committed_epochs()])):
            publish_epoch(self.visible, epoch, attempt)
        return retracted


def read_location(flow: FlowSpec) -> str:
    """Where a flow's committed epochs are read (``read_upsert_table``, ``lineage``, the report
    DAG): a files sink's folder, which keeps every epoch (its staged copies are retired), else the
    parts' location (a Kafka sink's staging, a table's staged parts)."""
    files = flow.sink.files
    return files.path if files is not None and flow.sink.kafka is None else flow.sink.parts_location


def published_sinks(flows) -> list[PublishedFilesSink]:
    """The files sinks among a run's flows (``RunFlow``s: each has its opened ``sink``)."""
    return [flow.sink for flow in flows if isinstance(flow.sink, PublishedFilesSink)]


def publish_at_start(flows, epoch: int, attempt: int) -> None:
    """At a run's start: every files sink's staged epochs up to the restored ``epoch`` that are
    not published yet (a run killed between its commit and its clean-up), published."""
    for sink in published_sinks(flows):
        published = sink.publish_through(epoch, attempt)
        if published:
            log.info("published %d committed epoch(s) of %s left unpublished by a crash", published, sink.location)


def publish_held_back(flows, epoch: int, attempt: int) -> None:
    """At a run's end: the epochs up to ``epoch`` a files sink held back (a staged part was lost
    when their clean-up ran, and may have been repaired since), published if they can be now."""
    for sink in published_sinks(flows):
        if not sink.caught_up:
            sink.publish_through(epoch, attempt)


def all_published(flows, epoch: int) -> bool:
    """Whether every files sink holds each staged epoch up to ``epoch`` in its folder."""
    return all(not unpublished(sink.visible, epoch) for sink in published_sinks(flows))
