"""The latency benchmark's instruments: a producer at a fixed rate that stamps each event, and a
watcher that sees each event become visible to a reader of the output.

Events are ``{"user", "amount", "seq", "ts"}``: users in turn, ``seq`` the event's number among
its user's events (1, 2, ...), ``ts`` the wall time just before it is sent. The watcher polls the
output folder for commit markers (our files sink's ``epoch=N/_SUCCESS``, or the ``_SUCCESS``
Spark's committer writes last in a Structured Streaming batch's ``batch=N`` folder) and reads the
rows of each new one: a stateless job's row names its event (user, seq); an aggregate's row
(user, n) makes the user's events up to the n-th visible. An event's latency is the time the
watcher first saw the marker that includes it, less its stamp: from the producer's send to a
reader's view, through the broker, the engine's trigger, the epoch and its commit.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_lib.kafka_clients import Producer

MARKER_DIR = re.compile(r"^(?:epoch|batch)=([0-9]+)$")


@dataclass
class Stamps:
    """Each produced event's stamp and the rate of the phase that produced it, by (user, seq)."""

    sent: dict[tuple[str, int], tuple[float, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class RateProducer:
    """Produces stamped events to ``topic`` at a fixed rate; the event numbering runs on across
    calls of ``produce`` so that every event has its own (user, seq)."""

    def __init__(self, bootstrap: str, topic: str, users: int, stamps: Stamps):
        # no linger: a latency benchmark sends each event when it is due, as a live producer does
        self.producer = Producer(bootstrap_servers=bootstrap, linger_ms=0, acks="all")
        self.topic, self.users, self.stamps, self.sent = topic, users, stamps, 0

    def send(self, user: str, seq: int, rate: int) -> None:
        """Send one event (``rate`` names its phase), stamped now."""
        import json

        ts = time.time()
        with self.stamps.lock:
            self.stamps.sent[(user, seq)] = (ts, rate)
        value = json.dumps({"user": user, "amount": 1, "seq": seq, "ts": ts}, separators=(",", ":")).encode()
        self.producer.send(self.topic, key=user.encode(), value=value)

    def produce(self, rate: int, seconds: float) -> int:
        """``rate`` events a second for ``seconds``, each sent when due; returns how many."""
        count, start = int(rate * seconds), time.monotonic()
        for i in range(count):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n = self.sent + i
            self.send(f"u{n % self.users:05d}", n // self.users + 1, rate)
        self.producer.flush(timeout=60)
        self.sent += count
        return count

    def close(self) -> None:
        """Close the producer (what it sent is flushed by ``produce``)."""
        self.producer.close()


RowsOf = Callable[[Path, int], list[dict]]  # the rows of the committed epoch/batch folder given


class TopicRows:
    """The output topic as a ``read_committed`` consumer sees it: each call of ``take`` returns the
    JSON rows that became readable since the last (tombstones left out). For the Kafka sinks, where
    a record is visible once the broker has it (Spark's sink) or once its transaction commits
    (ours)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
        )
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer.assign(assigned)
        self.consumer.seek_to_beginning(*assigned)

    def take(self) -> list[dict]:
        """The rows readable since the last call (a short poll)."""
        import json

        batches = self.consumer.poll(timeout_ms=10, max_records=100_000)
        return [json.loads(r.value) for records in batches.values() for r in records if r.value is not None]

    def close(self) -> None:
        """Close the consumer."""
        self.consumer.close()


class VisibilityWatcher:
    """Polls ``output`` for new commit markers (every ``poll_s``) in a thread and records, per
    event, the latency of its first visibility; also each marker's epoch and when it was seen."""

    def __init__(
        self,
        output: Path,
        rows_of: RowsOf,
        kind: str,
        stamps: Stamps,
        poll_s: float = 0.01,
        topic: TopicRows | None = None,
    ):
        self.output, self.rows_of, self.kind, self.stamps, self.poll_s = output, rows_of, kind, stamps, poll_s
        self.topic = topic  # given: watch this topic's records instead of the folder's markers
        self.latencies: dict[tuple[str, int], float] = {}  # (user, seq) -> seconds
        self.duplicates = 0  # events a stateless output showed twice
        self.markers: dict[int, float] = {}  # epoch/batch -> wall time its (latest) marker was seen
        self._marker_bytes: dict[int, bytes] = {}  # what each marker said when last read
        self.warm = threading.Event()  # set when the warm-up event (user "warm") is visible
        self._shown: dict[str, int] = {}  # an aggregate's last count per user
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="latency-watcher", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; a failure of the watcher's thread is raised here."""
        self._stop.set()
        self._thread.join(timeout=30)
        if self.topic is not None:
            self.topic.close()
        if self.error is not None:
            raise self.error

    def seen(self) -> int:
        """How many produced events are visible."""
        return len(self.latencies)

    def wait_seen(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` events are visible (False on timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.seen() < count and time.monotonic() < deadline and self.error is None:
            time.sleep(0.05)
        return self.seen() >= count

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._look()
                self._stop.wait(self.poll_s)
        except BaseException as exc:  # noqa: BLE001 -- raised again by stop()
            self.error = exc

    def _look(self) -> None:
        if self.topic is not None:  # a Kafka sink: each poll that brings records counts as a delivery
            rows = self.topic.take()
            if rows:
                now = time.time()
                self.markers[len(self.markers)] = now
                self._take(rows, now)
            return
        if not self.output.exists():
            return
        for folder in sorted(self.output.iterdir()):
            m = MARKER_DIR.match(folder.name)
            marker = folder / "_SUCCESS"
            if m is None or not marker.exists():
                continue
            number, said = int(m.group(1)), marker.read_bytes()
            if self._marker_bytes.get(number) == said:
                continue
            # A marker can be replaced: a run without a snapshot first writes empty markers (the
            # retraction of an older run, runner_restore.start_over), then its epochs' own.
            now = time.time()
            self.markers[number], self._marker_bytes[number] = now, said
            self._take(self.rows_of(folder, number), now)

    def _take(self, rows: list[dict], now: float) -> None:
        with self.stamps.lock:
            sent = dict(self.stamps.sent)
        for row in rows:
            user = row["user"]
            if user == "warm":
                self.warm.set()
            if self.kind == "stateless":
                seqs = [int(row["seq"])]
            else:
                shown, n = self._shown.get(user, 0), int(row["n"])
                seqs = list(range(shown + 1, n + 1))
                self._shown[user] = max(shown, n)
            for seq in seqs:
                stamp = sent.get((user, seq))
                if stamp is None:
                    continue  # the warm-up event
                if (user, seq) in self.latencies:
                    self.duplicates += 1
                else:
                    self.latencies[(user, seq)] = now - stamp[0]


def percentiles(values: list[float]) -> dict[str, float | None]:
    """p50, p95, p99 and max of ``values`` (nearest rank), in seconds; None when empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[max(1, math.ceil(q * len(ordered))) - 1]

    return {"p50": rank(0.50), "p95": rank(0.95), "p99": rank(0.99), "max": ordered[-1]}
