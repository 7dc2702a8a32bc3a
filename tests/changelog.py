"""Every committed epoch of a job checked against Kafka itself, independently of the engine.

The final table hides a wrong epoch: nearly every key is rewritten by a later epoch, so a crashed
epoch's wrong output would be overwritten and never seen. Here the manifest chain must cover
epochs 1..N with contiguous offset ranges, and each epoch's committed output (the parts its
``_SUCCESS`` lists) must be exactly the new value of every key that epoch's records touched,
computed in plain Python from the records read back from Kafka with kafka-python; no marker past
the last committed epoch may list anything.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from kafka import KafkaConsumer, TopicPartition

from pipeline_lib.checkpoint.snapshot_store import SnapshotStore
from pipeline_lib.errors import NotFound
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.storage import open_store, parse_location

SPEND_VALUES = {"total": "sum(amount)", "n": "count(*)"}
_AGGREGATE = re.compile(r"^\s*(sum|count|min|max)\s*\(\s*(\*|\w+)\s*\)\s*$", re.I)
_MARKER = re.compile(r"^epoch=(\d+)/_SUCCESS$")
SHOWN = 5  # mismatching keys named per kind in a failure message


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def json_row(record: Record) -> dict | None:
    """The default reference: the record's JSON value is the row the aggregate reads."""
    assert record.value is not None, f"{record.topic}[{record.partition}]@{record.offset} is a tombstone"
    return json.loads(record.value)


@dataclass
class EpochCheck:
    epoch: int
    records: list[Record]
    touched: int  # keys the epoch changed
    bad: list[Record] = field(default_factory=list)


def _aggregates(values: dict[str, str]) -> dict[str, tuple[str, str | None]]:
    parsed = {}
    for name, expr in values.items():
        match = _AGGREGATE.match(expr)
        assert match, f"the checker does not know aggregate {expr!r}"
        parsed[name] = (match.group(1).lower(), None if match.group(2) == "*" else match.group(2))
    return parsed


def _fold(current: dict, row: dict, aggregates: dict[str, tuple[str, str | None]]) -> None:
    """Spark's semantics: nulls are ignored, count(*) counts rows, an all-null sum/min/max is null."""
    for name, (fn, column) in aggregates.items():
        if fn == "count":
            current[name] = current.get(name, 0) + (1 if column is None or row.get(column) is not None else 0)
            continue
        value = row.get(column)
        if value is None:
            current.setdefault(name, None)
            continue
        old = current.get(name)
        if old is None:
            current[name] = value
        elif fn == "sum":
            current[name] = old + value
        else:
            current[name] = min(old, value) if fn == "min" else max(old, value)


def read_ranges(bootstrap: str, ranges: list[tuple[str, int, int, int]], timeout_s: float = 120) -> list[Record]:
    """The records of ``(topic, partition, start, end)`` ranges, in order, with kafka-python's own
    assign + seek + poll (not the engine's reader); every offset in each range must be there."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, client_id="changelog-check"
    )
    out: list[Record] = []
    try:
        for topic, partition, start, end in ranges:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)
            got: list[Record] = []
            deadline = time.monotonic() + timeout_s
            while consumer.position(tp) < end:
                assert time.monotonic() < deadline, (
                    f"{topic}[{partition}]: no offset {consumer.position(tp)} "
                    f"within {timeout_s}s, reading [{start}, {end})"
                )
                for rec in consumer.poll(timeout_ms=500, max_records=5_000).get(tp, []):
                    if start <= rec.offset < end:
                        got.append(Record(topic, partition, rec.offset, rec.key, rec.value))
            offsets = [r.offset for r in got]
            assert offsets == list(range(start, end)), (
                f"{topic}[{partition}] [{start}, {end}): kafka-python returned offsets {offsets[:5]}..{offsets[-5:]}"
            )
            out.extend(got)
    finally:
        consumer.close()
    return out


def topic_offsets(
    bootstrap: str, topic: str, near: dict[int, int] | None = None, timeout_s: float = 60
) -> tuple[dict[int, int], dict[int, int]]:
    """(earliest, end) offset of every partition of ``topic``. The end is a fetch's high
    watermark (a fetch from ``near``, e.g. where the chain claims to end): the embedded broker's
    ListOffsets under-reports the end when producer batches hold several records."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        client_id="changelog-check",
        max_partition_fetch_bytes=1024,
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        assert partitions, f"topic {topic} has no partitions"
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        earliest = {tp.partition: o for tp, o in consumer.beginning_offsets(tps).items()}
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, max(earliest[tp.partition], (near or {}).get(tp.partition, 0) - 1))
        ends: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(tps):
            assert time.monotonic() < deadline, f"{topic}: no fetch high watermark within {timeout_s}s"
            consumer.poll(timeout_ms=200, max_records=1)
            ends.update({tp.partition: hw for tp in tps if (hw := consumer.highwater(tp)) is not None})
        return earliest, ends
    finally:
        consumer.close()


def _parts(store, refs: list[dict], where: str) -> list[dict]:
    rows: list[dict] = []
    for ref in refs:
        data = store.get(ref["key"])
        assert len(data) == ref["bytes"], (
            f"{where}: part {ref['key']} has {len(data)} bytes, marker says {ref['bytes']}"
        )
        assert hashlib.sha256(data).hexdigest() == ref["sha256"], f"{where}: part {ref['key']} fails its SHA-256"
        if ref["key"].endswith(".parquet"):
            part = pq.read_table(io.BytesIO(data)).to_pylist()
        else:
            part = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
        assert len(part) == ref["rows"], f"{where}: part {ref['key']} has {len(part)} rows, marker says {ref['rows']}"
        rows.extend(part)
    return rows


def _marker(store, epoch: int, commit, where: str) -> list[dict]:
    """The epoch's ``_SUCCESS`` file list, which must be the one the manifest committed."""
    key = f"epoch={epoch}/_SUCCESS"
    assert commit.marker == key and commit.epoch == epoch, f"{where}: manifest names marker {commit.marker}"
    try:
        marker = json.loads(store.get(key))
    except NotFound:
        raise AssertionError(f"{where}: committed, but {key} is missing") from None
    assert marker["epoch"] == epoch, f"{where}: {key} says epoch {marker['epoch']}"
    committed = [f.model_dump(mode="json") for f in commit.files]
    assert marker["files"] == committed, (
        f"{where}: {key} lists {[f['key'] for f in marker['files']]}, the manifest {[f['key'] for f in committed]}"
    )
    return marker["files"]


def _listing_markers_beyond(store, last: int) -> dict[int, list[str]]:
    """Epochs past ``last`` whose marker lists part files. A marker listing none is a retraction
    (a run that starts over empties every epoch it finds, and the one after them)."""
    beyond = {}
    for key in store.list():
        if (m := _MARKER.match(key)) and int(m.group(1)) > last:
            files = json.loads(store.get(key))["files"]
            if files:
                beyond[int(m.group(1))] = [f["key"] for f in files]
    return beyond


def _compare(epoch: int, committed: list[dict], expected: dict[tuple, dict], key: tuple[str, ...]) -> None:
    got: dict[tuple, dict] = {}
    for row in committed:
        k = tuple(row.get(c) for c in key)
        assert k not in got, f"epoch {epoch}: key {k} committed twice: {got[k]} and {row}"
        got[k] = row
    missing = sorted(expected.keys() - got.keys(), key=repr)
    extra = sorted(got.keys() - expected.keys(), key=repr)
    wrong = sorted((k for k in expected.keys() & got.keys() if got[k] != expected[k]), key=repr)
    if missing or extra or wrong:
        lines = [
            f"epoch {epoch}: committed output differs from the reference ({len(missing)} key(s) missing, "
            f"{len(extra)} extra, {len(wrong)} wrong, of {len(expected)} the epoch touched)"
        ]
        lines += [f"  missing key {k}: reference {expected[k]}" for k in missing[:SHOWN]]
        lines += [f"  extra key {k}: committed {got[k]}, the epoch's records do not touch it" for k in extra[:SHOWN]]
        lines += [f"  wrong key {k}: committed {got[k]}, reference {expected[k]}" for k in wrong[:SHOWN]]
        raise AssertionError("\n".join(lines))


def assert_every_epoch_exact(
    env: dict,
    job_name: str,
    sink_uri: str,
    checkpoint_uri: str,
    bootstrap: str,
    *,
    pipeline: str = "main",
    flow: str | None = None,
    key: tuple[str, ...] = ("user",),
    values: dict[str, str] = SPEND_VALUES,
    reference: Callable[[Record], dict | None] = json_row,
    first_offsets: dict[int, int] | None = None,
    dead_letter_uri: str | None = None,
    is_bad: Callable[[Record], bool] | None = None,
) -> list[EpochCheck]:
    """Check the whole committed history of one stateful flow; return what each epoch read.

    ``reference`` maps a record to the row the aggregate reads (after the flow's transforms, in
    plain Python) or None when a filter drops it. ``first_offsets``: where epoch 1 starts per
    partition (default: the earliest offsets). With ``dead_letter_uri`` each epoch's dead letters
    must be exactly its records for which ``is_bad`` holds, and those never reach ``reference``.
    The head must retain every epoch (``checkpoint.retain`` >= epochs)."""
    settings = ConnectionSettings.from_env(env)
    snapshots = SnapshotStore.open(checkpoint_uri, job_name, pipeline, settings)
    head, _ = snapshots.read_head()
    assert head is not None and head.history, f"job {job_name} pipeline {pipeline} has no committed head"
    chain = [snapshots.load_manifest(e.snapshot_id, e.manifest_sha256) for e in reversed(head.history)]
    epochs = [m.epoch for m in chain]
    assert epochs == list(range(1, len(chain) + 1)), (
        f"head retains epochs {epochs}, not 1..N: set checkpoint.retain to at least the number of epochs"
    )
    topic = chain[0].topic
    earliest, _ = topic_offsets(bootstrap, topic)
    cursor = dict(first_offsets if first_offsets is not None else earliest)
    assert set(cursor) == set(earliest), f"first offsets {cursor} do not name the partitions of {topic}"
    previous = None
    for m in chain:
        where = f"epoch {m.epoch} ({m.snapshot_id})"
        assert m.topic == topic, f"{where} read topic {m.topic}, epoch 1 read {topic}"
        base = m.lineage.base_snapshot
        assert base == (previous.snapshot_id if previous else None), (
            f"{where}: planned on {base}, the chain's previous snapshot is {previous.snapshot_id if previous else None}"
        )
        assert m.lineage.ranges, f"{where} read nothing"
        for r in m.lineage.ranges:
            assert r.topic == topic, f"{where}: a range of topic {r.topic}"
            assert r.start == cursor[r.partition], (
                f"{where}: {topic}[{r.partition}] starts at {r.start}, the previous epoch ended at "
                f"{cursor[r.partition]} ({'gap' if r.start > cursor[r.partition] else 'overlap'})"
            )
            assert r.end > r.start, f"{where}: empty range {r}"
            cursor[r.partition] = r.end
        assert m.positions == cursor, f"{where}: positions {m.positions}, its ranges end at {cursor}"
        assert m.lineage.records_read == sum(r.size for r in m.lineage.ranges), f"{where}: records_read"
        previous = m
    final = chain[-1]
    stops = final.stop_offsets if final.stop_offsets is not None else topic_offsets(bootstrap, topic, cursor)[1]
    assert cursor == {p: stops[p] for p in cursor}, (
        f"the last epoch {final.epoch} ends at {cursor}, the topic's {'stop' if final.stop_offsets else 'end'} "
        f"offsets are {stops}"
    )

    flow = flow or next(iter(final.flows))
    aggregates = _aggregates(values)
    sink = open_store(sink_uri, settings)
    dead = open_store(parse_location(dead_letter_uri).child(pipeline), settings) if dead_letter_uri else None
    state: dict[tuple, dict] = {}
    checks = []
    for m in chain:
        where = f"epoch {m.epoch} ({m.snapshot_id}) of flow {flow}"
        records = read_ranges(bootstrap, [(r.topic, r.partition, r.start, r.end) for r in m.lineage.ranges])
        bad = [r for r in records if is_bad is not None and is_bad(r)]
        touched: set[tuple] = set()
        for record in records:
            if is_bad is not None and is_bad(record):
                continue
            row = reference(record)
            if row is None:
                continue
            k = tuple(row[c] for c in key)
            _fold(state.setdefault(k, {}), row, aggregates)
            touched.add(k)
        expected = {k: {**dict(zip(key, k)), **state[k]} for k in touched}
        _compare(m.epoch, _parts(sink, _marker(sink, m.epoch, m.flows[flow].sink, where), where), expected, key)
        assert m.bad_records == len(bad), (
            f"{where}: manifest counts {m.bad_records} bad records, the reference {len(bad)}"
        )
        if dead is not None:
            assert m.dead_letters is not None, f"{where}: no dead-letter commit"
            letters = _parts(dead, _marker(dead, m.epoch, m.dead_letters, f"{where} dead letters"), where)
            got = sorted((row["topic"], row["partition"], row["offset"]) for row in letters)
            want = sorted((r.topic, r.partition, r.offset) for r in bad)
            assert got == want, f"epoch {m.epoch}: dead letters {got}, the epoch's bad records {want}"
            raw = {(r.topic, r.partition, r.offset): r.value for r in bad}
            for row in letters:
                value = base64.b64decode(row["raw_base64"]) if row["raw_base64"] is not None else None
                assert value == raw[(row["topic"], row["partition"], row["offset"])], (
                    f"epoch {m.epoch}: dead letter {row['topic']}[{row['partition']}]@{row['offset']} raw bytes differ"
                )
        checks.append(EpochCheck(m.epoch, records, len(touched), bad))
    n = final.epoch
    for store, what in [(sink, f"sink of flow {flow}"), *([(dead, "dead-letter sink")] if dead else [])]:
        beyond = _listing_markers_beyond(store, n)
        assert not beyond, f"{what}: _SUCCESS markers beyond the committed epochs 1..{n} list parts: {beyond}"
    return checks
