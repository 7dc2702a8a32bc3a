"""The latency benchmark's watcher (benchmarks/latency_probe.py) on folders written by hand and on
a topic reader's batches (the Kafka sinks): an event counts once, from the first marker (or poll)
that shows it; a replaced marker (the empty one a run without a snapshot writes first) is read
again; an aggregate's count makes earlier events visible; and the percentiles are nearest-rank."""

from __future__ import annotations

import json

from benchmarks.latency_probe import Stamps, VisibilityWatcher, percentiles


def _rows(folder, number):
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.read_text().splitlines()]


def _epoch(out, number: int, rows: list[dict], marker: str) -> None:
    folder = out / f"epoch={number}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "_SUCCESS").write_text(marker)


def test_a_stateless_event_counts_once_and_a_replaced_marker_is_read_again(tmp_path):
    stamps = Stamps({("a", 1): (0.0, 20), ("a", 2): (0.0, 20)})
    watcher = VisibilityWatcher(tmp_path, _rows, "stateless", stamps)
    _epoch(tmp_path, 1, [], "empty")  # the retraction's empty marker
    watcher._look()
    assert watcher.seen() == 0 and not watcher.warm.is_set()
    _epoch(tmp_path, 1, [{"user": "warm", "seq": 1}, {"user": "a", "seq": 1}], "epoch 1")
    watcher._look()
    watcher._look()  # unchanged: not read again
    assert watcher.seen() == 1 and watcher.warm.is_set() and watcher.duplicates == 0
    _epoch(tmp_path, 2, [{"user": "a", "seq": 2}], "epoch 2")
    watcher._look()
    assert watcher.seen() == 2 and all(v > 0 for v in watcher.latencies.values())


def test_an_aggregate_count_makes_the_user_s_earlier_events_visible(tmp_path):
    stamps = Stamps({("a", s): (0.0, 20) for s in (1, 2, 3)})
    watcher = VisibilityWatcher(tmp_path, _rows, "aggregate", stamps)
    _epoch(tmp_path, 1, [{"user": "a", "n": 2}], "1")
    watcher._look()
    assert set(watcher.latencies) == {("a", 1), ("a", 2)}
    _epoch(tmp_path, 2, [{"user": "a", "n": 3}], "2")
    watcher._look()
    assert set(watcher.latencies) == {("a", 1), ("a", 2), ("a", 3)} and watcher.duplicates == 0


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "max": 100.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None, "max": None}


class _Rows:
    """Stands for the output topic's reader: hands out the batches it is given, once."""

    def __init__(self, *batches: list[dict]):
        self.batches, self.closed = list(batches), False

    def take(self) -> list[dict]:
        return self.batches.pop(0) if self.batches else []

    def close(self) -> None:
        self.closed = True


def test_a_kafka_sink_s_records_count_once_each_poll_that_brings_rows_a_delivery(tmp_path):
    stamps = Stamps({("a", s): (0.0, 20) for s in (1, 2)})
    topic = _Rows([{"user": "warm", "seq": 1}, {"user": "a", "seq": 1}], [], [{"user": "a", "seq": 2}])
    watcher = VisibilityWatcher(tmp_path / "unused", _rows, "stateless", stamps, topic=topic)  # type: ignore[arg-type]
    for _ in range(3):
        watcher._look()
    assert watcher.seen() == 2 and watcher.warm.is_set() and len(watcher.markers) == 2
    watcher.start()
    watcher.stop()
    assert topic.closed
