"""Keyed state merging, state files, manifests and record decoding: pure logic."""

import random

import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import FlowCommit, Lineage, Manifest, SinkCommit
from pipeline_lib.checkpoint.state_files import decode_state_file, decode_state_rows, encode_state_rows
from pipeline_lib.errors import RecordError
from pipeline_lib.execution.keyed_state import KeyedAggregateState
from pipeline_lib.execution.record_decoding import JsonRecordDecoder
from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.spec.aggregates import parse_aggregate


def test_merging_epoch_partials_equals_one_big_aggregate():
    rng = random.Random(7)
    events = [(f"u{rng.randint(0, 30)}", rng.choice([None, rng.randint(-50, 50)])) for _ in range(3000)]
    fns = {"total": parse_aggregate("sum(amount)"), "n": parse_aggregate("count(*)"),
           "lo": parse_aggregate("min(amount)"), "hi": parse_aggregate("max(amount)"),
           "nn": parse_aggregate("count(amount)")}
    state = KeyedAggregateState(["user"], fns, 16)
    for start in range(0, len(events), 700):  # epochs of 700 events, partials like Spark's groupBy
        partial: dict = {}
        for user, amount in events[start:start + 700]:
            t, n, lo, hi, nn = partial.get(user, (None, 0, None, None, 0))
            if amount is not None:
                t = amount if t is None else t + amount
                lo = amount if lo is None else min(lo, amount)
                hi = amount if hi is None else max(hi, amount)
                nn += 1
            partial[user] = (t, n + 1, lo, hi, nn)
        state.merge([(u, *v) for u, v in partial.items()])
    for user in {u for u, _ in events}:
        amounts = [a for u, a in events if u == user]
        real = [a for a in amounts if a is not None]
        expected = [sum(real) if real else None, len(amounts), min(real, default=None), max(real, default=None), len(real)]
        assert state.values[(user,)] == expected


def test_state_file_round_trip_keeps_types_and_nulls():
    schema = pa.schema([("user", pa.string()), ("total", pa.int64()), ("avg", pa.float64())])
    rows = [("a", 2**62, 1.5), (None, None, None), ("c", -1, float("inf"))]
    back_schema, back = decode_state_rows(encode_state_rows(rows, [1, 2, 3], schema))
    assert back == rows
    assert back_schema.field("total").type == pa.int64()


def test_restore_loads_the_stored_key_groups_and_refuses_a_key_twice():
    fns = {"total": parse_aggregate("sum(amount)"), "n": parse_aggregate("count(*)")}
    written = KeyedAggregateState(["user"], fns, 128)
    written.merge([(f"u{i}", i, 1) for i in range(500)])
    keys = list(written.values)
    schema = pa.schema([("user", pa.string()), ("total", pa.int64()), ("n", pa.int64())])
    data = encode_state_rows(written.rows(keys), [written.key_groups[k] for k in keys], schema)
    _, rows, groups = decode_state_file(data)
    assert groups == [key_group_of(k, 128) for k in keys]
    restored, recomputed = KeyedAggregateState(["user"], fns, 128), KeyedAggregateState(["user"], fns, 128)
    restored.load_rows(rows, groups)
    recomputed.load_rows(rows)  # e.g. after max_parallelism changed: computed again
    assert restored.values == recomputed.values == written.values
    assert restored.key_groups == recomputed.key_groups == written.key_groups
    with pytest.raises(ValueError, match=r"key \('u7',\) restored twice"):
        restored.load_rows([("u7", 1, 1)], [key_group_of(("u7",), 128)])


def test_manifest_checksum_detects_tampering():
    m = Manifest(
        job="j", snapshot_id="0000000001-a1", epoch=1, attempt=1, created_at="2026-01-01T00:00:00Z",
        pipeline="main", spec_fingerprint="x", topic="t", positions={0: 5},
        flows={"j": FlowCommit(state=None, rows_written=0, sink=SinkCommit(location="file:///tmp/s", epoch=1, marker="epoch=1/_SUCCESS", files=[]))},
        lineage=Lineage(base_snapshot=None, plan_digest="d", ranges=[], records_read=5),
    ).sealed()
    assert Manifest.from_bytes(m.to_bytes()).verify_checksum()
    tampered = Manifest.from_bytes(m.to_bytes().replace(b'"0": 5', b'"0": 6'))
    assert not tampered.verify_checksum()
    with pytest.raises(ValueError):
        m.model_copy(update={}).model_validate({**m.model_dump(), "snapshot_id": "../../etc"})


@pytest.mark.parametrize(
    "value,reason",
    [
        (b"{not json", "malformed JSON"),
        (b"[1,2]", "expected a JSON object"),
        (b'{"user": 5, "amount": 1}', "field 'user': expected a string"),
        (b'{"user": "a", "amount": "12"}', "field 'amount': expected an integer"),
        (b'{"user": "a", "amount": 9223372036854775808}', "out of range"),
        (None, "tombstone"),
    ],
)
def test_bad_records_are_named_by_topic_partition_offset(value, reason):
    decoder = JsonRecordDecoder([("user", "string"), ("amount", "bigint")])
    with pytest.raises(RecordError) as info:
        decoder.decode("payments", 3, 1234, value)
    assert str(info.value).startswith("bad record at payments[3]@1234: ")
    assert reason in str(info.value)


def test_good_records_decode_in_schema_order_with_missing_as_null():
    decoder = JsonRecordDecoder([("user", "string"), ("amount", "bigint"), ("ok", "boolean")])
    assert decoder.decode("t", 0, 0, b'{"amount": 3, "user": "x", "extra": 1}') == ("x", 3, None)


def test_keys_by_group_follows_merges_and_restores():
    fns = {"total": parse_aggregate("sum(amount)"), "n": parse_aggregate("count(*)")}
    state = KeyedAggregateState(["user"], fns, 16)
    state.merge([(f"u{i}", i, 1) for i in range(200)])
    state.merge([(f"u{i}", i, 1) for i in range(100, 300)])  # half known, half new keys
    expected: dict[int, set] = {}
    for key, kg in state.key_groups.items():
        expected.setdefault(kg, set()).add(key)
    assert {kg: set(keys) for kg, keys in state.keys_by_group.items()} == expected
    assert sum(len(keys) for keys in state.keys_by_group.values()) == len(state) == 300
    assert set(state.keys_in(range(0, 16))) == set(state.values)
    restored = KeyedAggregateState(["user"], fns, 16)
    keys = state.keys_in(range(4, 9))
    restored.load_rows(state.rows(keys), [state.key_groups[k] for k in keys])
    assert set(restored.keys_in(range(0, 16))) == set(keys) == {k for k, g in state.key_groups.items() if 4 <= g < 9}
