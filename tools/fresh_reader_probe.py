"""Time reading a topic with fresh Kafka consumers, as epoch 1's read tasks do, with and without
asking for the topic's metadata at once (``kafka_clients.partitions_of``).

    .venv/bin/python tools/fresh_reader_probe.py [--events 50000] [--partitions 4] [--rounds 2]

Starts an Apache Kafka stack (``start_stack(broker="kafka")``), produces the events, then per
round and variant reads every partition whole through the reader's own path
(``read_range_batches``) with its consumer cache emptied first, and prints the seconds and how
often kafka-python's poll slept. ``--variant waits`` stands in for a consumer left to kafka-python's
own metadata refresh (``partitions_of`` made a no-op). A profiling aid, not a benchmark of record.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import kafka.consumer.group as kafka_group
from kafka import TopicPartition

from benchmarks.events import produce_payments
from pipeline_lib import kafka_clients
from pipeline_lib.execution.source import kafka_source
from pipeline_lib.localstack import start_stack, stop_stack


class _CountedSleep:
    """kafka-python's ``time`` module as its poll sees it, counting the poll's idle sleeps."""

    def __init__(self) -> None:
        self.sleeps = 0

    def __getattr__(self, name: str):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        time.sleep(seconds)


def _kafka_python_s_own_wait(consumer: object, topic: str) -> set[int]:
    return set()  # a no-op partitions_of: the consumer's first poll asks for the metadata itself


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variant", action="append", choices=["at-once", "waits"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fresh-reader-probe-"))
    info = start_stack(work / "stack", broker_storage="memory", broker="kafka")
    try:
        bootstrap, topic = info.kafka_bootstrap, "fresh-reader-probe"
        produce_payments(bootstrap, topic, args.events, 1000, args.partitions, 1)
        consumer = kafka_clients.Consumer(bootstrap_servers=bootstrap)
        ends = {
            tp.partition: end
            for tp, end in consumer.end_offsets([TopicPartition(topic, p) for p in range(args.partitions)]).items()
        }
        consumer.close()
        counted, at_once = _CountedSleep(), kafka_clients.partitions_of
        kafka_group.time = counted
        for round_ in range(args.rounds):
            for variant in args.variant or ["waits", "at-once"]:
                kafka_clients.partitions_of = at_once if variant == "at-once" else _kafka_python_s_own_wait
                kafka_source._consumers.clear()
                counted.sleeps = 0
                started, records = time.monotonic(), 0
                for partition, end in ends.items():
                    for columns in kafka_source.read_range_batches(bootstrap, topic, partition, 0, end):
                        records += sum(len(batch) for batch in columns)
                print(
                    f"round {round_ + 1} {variant}: {time.monotonic() - started:.3f} s, {records} records, "
                    f"{counted.sleeps} idle sleeps in kafka-python's poll",
                    flush=True,
                )
                for cached in kafka_source._consumers.values():
                    cached.consumer.close()
    finally:
        stop_stack(work / "stack")


if __name__ == "__main__":
    main()
