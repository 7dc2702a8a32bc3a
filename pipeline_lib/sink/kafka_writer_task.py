"""One publish task on an executor: take a writer group, then run its writers one after the other.

Most of a task's time that is not its rows is waiting: for the claim, for the staged parts from
the store, and, for a writer whose producer this worker does not keep, for ``init_transactions``
and the marker read (a few broker round trips each). None of these depends on another: the
staged parts are read whichever group the task takes, and each writer's producer is its own. So
the parts are read while the claim is made, and the group's producers are taken (the new ones
initialised) and their markers read side by side while the parts are still coming; the writers'
transactions then run one after the other (``kafka_writer``). Taking a producer early changes
nothing the broker checks: a writer's marker read and commit still follow its producer's own
``init_transactions`` (a marker read early is as final as one read late: no other producer of
the id can commit before this one's commit without fencing it), and a producer taken and not
used goes back to the worker with no transaction begun.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from pipeline_lib.sink import kafka_producers as producers
from pipeline_lib.sink.kafka_writer import PublishTask, Staged, publish_partition, staged_part, take_producer, writer_id
from pipeline_lib.sink.kafka_writer_claims import GroupDeal, take_group
from pipeline_lib.sink.kafka_writer_times import WriterTimes
from pipeline_lib.storage import open_store


def publish_group(task: PublishTask, deal: GroupDeal, times: WriterTimes) -> tuple[int | None, int]:
    """Take a group of the deal (``kafka_writer_claims``: the one whose producers this worker
    keeps, if no other task took it) and publish its partitions: (the group's index, records
    sent), or (None, 0) when every group was taken."""
    staged: Staged = {}
    with ThreadPoolExecutor(1, thread_name_prefix="staged-parts") as pool:
        reading = pool.submit(read_parts, task, staged, times)
        with times.timed("claim"):
            group = take_group(open_store(task.staging, task.settings), deal, lambda ps: _kept(task, ps))
        if group is None:
            return None, 0
        if group != deal.dealt:
            times.count("other_group")
        return group, publish_partitions(task, deal.groups[group], times, staged, reading)


def _kept(task: PublishTask, partitions: tuple[int, ...]) -> int:
    """How many of the partitions' writers this worker keeps a producer of."""
    ids = [writer_id(task.job, task.pipeline, task.flow, task.topic, p) for p in partitions]
    return producers.kept(task.kafka, ids)


def read_parts(task: PublishTask, staged: Staged, times: WriterTimes) -> None:
    """Read and hash every staged part of the epoch into ``staged``."""
    for part in task.parts:
        staged_part(task, part, staged, times)


def publish_partitions(
    task: PublishTask,
    partitions: tuple[int, ...],
    times: WriterTimes | None = None,
    staged: Staged | None = None,
    reading: Future | None = None,
) -> int:
    """Publish the epoch's rows of each of ``partitions`` once, one writer (transactional id and
    transaction) after the other, reading and hashing the staged parts once for all of them
    (``reading``: that read, already under way into ``staged``), their producers taken side by
    side first; ``times``: where the task's seconds went."""
    times = WriterTimes() if times is None else times
    staged = {} if staged is None else staged
    with ThreadPoolExecutor(max(1, len(partitions)), thread_name_prefix="producers") as pool:
        taking = [pool.submit(take_producer, task, p, times, True) for p in partitions]
    taken = {}
    failed: BaseException | None = None
    for p, future in zip(partitions, taking, strict=True):
        try:
            taken[p] = future.result()
        except BaseException as error:  # a producer that could not initialise: the task fails
            failed = failed or error
    try:
        if failed is not None:
            raise failed
        if reading is not None:
            reading.result()
        return sum(publish_partition(task, p, staged, times, taken.pop(p)) for p in partitions)
    finally:  # taken and not used (an earlier writer failed): no transaction of theirs was begun
        for took in taken.values():
            producers.give_back(task.kafka, took.producer.transactional_id, took.producer)
