"""Keyed state merging, state files, manifests and record decoding: pure logic."""

import json
import math
import random
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

from pipeline_lib.checkpoint.manifest import FlowCommit, Lineage, Manifest, SinkCommit, validate_snapshot_id
from pipeline_lib.checkpoint.state_files import decode_state_file, encode_state_table
from pipeline_lib.errors import PipelineError, RecordError
from pipeline_lib.execution.source.record_decoding import JsonRecordDecoder
from pipeline_lib.execution.state.keyed_state import KeyedAggregateState
from pipeline_lib.plan.keygroups import key_group_of
from pipeline_lib.plan.offsets import OffsetRange
from pipeline_lib.spec.aggregates import parse_aggregate


def _partials(columns: dict[str, pa.DataType], rows: list[tuple]) -> pa.Table:
    """An epoch's partial aggregate as Spark's toArrow gives it: one row per key."""
    values = list(zip(*rows)) if rows else [()] * len(columns)
    return pa.Table.from_arrays([pa.array(v, type=t) for v, t in zip(values, columns.values())], names=list(columns))


SPEND = {"user": pa.string(), "total": pa.int64(), "n": pa.int64()}
SPEND_FNS = {"total": parse_aggregate("sum(amount)"), "n": parse_aggregate("count(*)")}


def test_merging_epoch_partials_equals_one_big_aggregate():
    rng = random.Random(7)
    events = [(f"u{rng.randint(0, 30)}", rng.choice([None, rng.randint(-50, 50)])) for _ in range(3000)]
    fns = {
        "total": parse_aggregate("sum(amount)"),
        "n": parse_aggregate("count(*)"),
        "lo": parse_aggregate("min(amount)"),
        "hi": parse_aggregate("max(amount)"),
        "nn": parse_aggregate("count(amount)"),
    }
    columns = {"user": pa.string(), **{name: pa.int64() for name in fns}}
    state = KeyedAggregateState(["user"], fns, 16)
    for start in range(0, len(events), 700):  # epochs of 700 events, partials like Spark's groupBy
        partial: dict = {}
        for user, amount in events[start : start + 700]:
            t, n, lo, hi, nn = partial.get(user, (None, 0, None, None, 0))
            if amount is not None:
                t = amount if t is None else t + amount
                lo = amount if lo is None else min(lo, amount)
                hi = amount if hi is None else max(hi, amount)
                nn += 1
            partial[user] = (t, n + 1, lo, hi, nn)
        changed = state.merge(_partials(columns, [(u, *v) for u, v in partial.items()]))
        assert sorted(state.keys()[s] for s in changed) == sorted((u,) for u in partial)
    for user in {u for u, _ in events}:
        amounts = [a for u, a in events if u == user]
        real = [a for a in amounts if a is not None]
        expected = [
            sum(real) if real else None,
            len(amounts),
            min(real, default=None),
            max(real, default=None),
            len(real),
        ]
        assert state.value((user,)) == expected


@pytest.mark.parametrize("max_parallelism", [16, 32_768])
def test_slots_by_key_group_orders_like_numpy_s_unique_and_stable_argsort(max_parallelism):
    """The hand-written order (a presence mask, a 16-bit radix sort) against the library's plain
    one: every slot or each given slot once, by key group, arrival order within one."""
    rng = np.random.default_rng(3)
    state = KeyedAggregateState(["user"], SPEND_FNS, max_parallelism)
    for _ in range(3):
        users = rng.integers(0, 5_000, 2_000)
        state.merge(_partials(SPEND, [(f"u{u}", 1, 1) for u in dict.fromkeys(users.tolist())]))
    groups = state.key_groups()
    order, sorted_groups = state.slots_by_key_group()
    expected = np.argsort(groups, kind="stable")
    assert np.array_equal(order, expected) and np.array_equal(sorted_groups, groups[expected])
    slots = rng.integers(0, len(state), 3_000)  # with repeats
    order, sorted_groups = state.slots_by_key_group(slots)
    unique = np.unique(slots)
    expected = unique[np.argsort(groups[unique], kind="stable")]
    assert np.array_equal(order, expected) and np.array_equal(sorted_groups, groups[expected])
    assert groups.max() >= 256 or max_parallelism == 16  # the 16-bit sort meets key groups past one byte


def test_merging_non_numeric_columns_and_nan_like_spark():
    fns = {
        "total": parse_aggregate("sum(amount)"),
        "first": parse_aggregate("min(name)"),
        "last": parse_aggregate("max(name)"),
        "lo": parse_aggregate("min(x)"),
        "hi": parse_aggregate("max(x)"),
    }
    columns = {
        "k": pa.int32(),
        "total": pa.decimal128(10, 2),
        "first": pa.string(),
        "last": pa.string(),
        "lo": pa.float64(),
        "hi": pa.float64(),
    }
    nan = float("nan")
    state = KeyedAggregateState(["k"], fns, 8)
    state.merge(_partials(columns, [(1, Decimal("1.10"), "m", "m", 1.0, 1.0), (2, None, None, None, nan, nan)]))
    state.merge(
        _partials(columns, [(1, Decimal("2.05"), "a", "z", nan, nan), (2, Decimal("0.01"), "b", "b", 3.0, 3.0)])
    )
    one, two = state.value((1,)), state.value((2,))
    assert one[:4] == [Decimal("3.15"), "a", "z", 1.0] and math.isnan(one[4])  # max(1, NaN) is NaN, min is 1
    assert two[:4] == [Decimal("0.01"), "b", "b", 3.0] and math.isnan(two[4])
    back = state.table(np.arange(2), pa.schema(list(columns.items())))
    assert back.column("k").to_pylist() == [1, 2] and back.column("total").type == pa.decimal128(10, 2)


def test_an_overflowing_sum_names_the_key_and_changes_nothing_silently():
    state = KeyedAggregateState(["user"], SPEND_FNS, 16)
    state.merge(_partials(SPEND, [("a", 2**62, 1), ("b", 2**62, 1)]))
    with pytest.raises(PipelineError, match=r"sum of column 'total' overflows int64 for key \('b',\)"):
        state.merge(_partials(SPEND, [("a", 1, 1), ("c", 5, 1), ("b", 2**62, 1)]))
    assert len(state) == 2 and state.value(("a",)) == [2**62, 1] and state.value(("b",)) == [2**62, 1]


def test_state_file_round_trip_keeps_types_and_nulls():
    schema = pa.schema([("user", pa.string()), ("total", pa.int64()), ("avg", pa.float64())])
    rows = [("a", 2**62, 1.5), (None, None, None), ("c", -1, float("inf"))]
    table = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in rows], schema=schema)
    back, groups = decode_state_file(encode_state_table(table, np.array([1, 2, 3])))
    assert back.equals(table) and groups.tolist() == [1, 2, 3]
    assert back.schema.field("total").type == pa.int64()


def test_restore_loads_the_stored_key_groups_and_refuses_a_key_twice():
    written = KeyedAggregateState(["user"], SPEND_FNS, 128)
    slots = written.merge(_partials(SPEND, [(f"u{i}", i, 1) for i in range(500)]))
    schema = pa.schema(list(SPEND.items()))
    table, groups = decode_state_file(encode_state_table(written.table(slots, schema), written.key_groups(slots)))
    assert groups.tolist() == [key_group_of((f"u{i}",), 128) for i in range(500)]
    restored, recomputed = KeyedAggregateState(["user"], SPEND_FNS, 128), KeyedAggregateState(["user"], SPEND_FNS, 128)
    restored.load(table, groups)
    recomputed.load(table)  # e.g. after max_parallelism changed: computed again
    for state in (restored, recomputed):
        assert state.keys() == written.keys()
        assert state.key_groups().tolist() == written.key_groups().tolist()
        assert state.table(np.arange(500), schema).equals(written.table(slots, schema))
    with pytest.raises(ValueError, match=r"key \('u7',\) restored twice"):
        restored.load(_partials(SPEND, [("u7", 1, 1)]), np.array([key_group_of(("u7",), 128)]))
    assert len(restored) == 500


def _one_manifest() -> Manifest:
    """A small unsealed manifest: one flow, no state, one partition."""
    return Manifest(
        job="j",
        snapshot_id="0000000001-a1",
        epoch=1,
        attempt=1,
        created_at="2026-01-01T00:00:00Z",
        pipeline="main",
        spec_fingerprint="x",
        topic="t",
        positions={0: 5},
        flows={
            "j": FlowCommit(
                state=None,
                rows_written=0,
                sink=SinkCommit(location="file:///tmp/s", epoch=1, marker="epoch=1/_SUCCESS", files=[]),
            )
        },
        lineage=Lineage(base_snapshot=None, plan_digest="d", ranges=[], records_read=5),
    )


def test_manifest_checksum_detects_tampering():
    m = _one_manifest().sealed()
    assert Manifest.from_bytes(m.to_bytes()).verify_checksum()
    assert b'"positions":{"offsets":[5],"partitions":[0]}' in m.to_bytes()
    tampered = Manifest.from_bytes(m.to_bytes().replace(b'"offsets":[5]', b'"offsets":[6]'))
    assert not tampered.verify_checksum()
    with pytest.raises(ValueError):
        m.model_copy(update={}).model_validate({**m.model_dump(), "snapshot_id": "../../etc"})


def test_a_manifest_s_topic_id_is_sealed_and_one_without_keeps_its_checksum():
    """A manifest written before manifests carried the topic's id verifies as it did; a topic id,
    when there is one, is covered by the checksum like any other field."""
    m = _one_manifest()
    older = json.loads(m.sealed().to_bytes())
    del older["topic_id"]  # as stored before the field existed
    assert Manifest.model_validate(older).verify_checksum()
    with_id = m.model_copy(update={"topic_id": "1b9a2f0e-5c1d-4a57-9f00-3c2b8e6d7a11"}).sealed()
    assert Manifest.from_bytes(with_id.to_bytes()).verify_checksum()
    swapped = with_id.to_bytes().replace(b"1b9a2f0e", b"2b9a2f0e")
    assert not Manifest.from_bytes(swapped).verify_checksum()


@pytest.mark.parametrize(
    "value",
    [
        "0000000001-a1\n",
        "0000000001-a1\r\n",
        "000000000\u0661-a1",
        "0000000001-a\uff11",
        "\u0969000000001-a1",
        " 0000000001-a1",
        "0000000001-a1 ",
    ],
)
def test_a_snapshot_id_is_ascii_digits_and_nothing_after(value):
    """Ids become object keys and restore targets: a trailing newline or an Arabic-Indic or
    full-width digit must not pass for an id."""
    assert validate_snapshot_id("0000000001-a1") == "0000000001-a1"
    with pytest.raises(ValueError, match="is not a snapshot id"):
        validate_snapshot_id(value)


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


def test_slots_by_key_group_follow_merges_and_restores():
    state = KeyedAggregateState(["user"], SPEND_FNS, 16)
    state.merge(_partials(SPEND, [(f"u{i}", i, 1) for i in range(200)]))
    state.merge(_partials(SPEND, [(f"u{i}", i, 1) for i in range(100, 300)]))  # half known, half new keys
    assert len(state) == 300 and state.value(("u150",)) == [300, 2]
    by_group = state.slots_by_key_group()
    keys = state.keys()
    for kg in range(16):
        assert {keys[s] for s in state.slots_in(by_group, range(kg, kg + 1))} == {
            k for k in keys if key_group_of(k, 16) == kg
        }
    assert sorted(state.slots_in(by_group, range(0, 16)).tolist()) == list(range(300))
    schema = pa.schema(list(SPEND.items()))
    span = state.slots_in(by_group, range(4, 9))
    restored = KeyedAggregateState(["user"], SPEND_FNS, 16)
    restored.load(state.table(span, schema), state.key_groups(span))
    again = restored.slots_by_key_group()
    assert (
        {restored.keys()[s] for s in restored.slots_in(again, range(0, 16))}
        == {k for k in keys if 4 <= key_group_of(k, 16) < 9}
        == {keys[s] for s in span}
    )


@pytest.mark.parametrize(
    "key_types", [[pa.string()], [pa.int64()], [pa.float64()], [pa.string(), pa.int32()], [pa.large_string()]]
)
def test_keys_are_found_again_whichever_lookup_their_type_takes(key_types):
    """One string/integer key column is looked up in Arrow, others in the dict: the same keys,
    None among them, are found again across epochs either way."""
    rng = random.Random(3)
    pick = {
        pa.string(): lambda: rng.choice([None, "a", "b", "é", ""]),
        pa.large_string(): lambda: rng.choice(["x", None]),
        pa.int64(): lambda: rng.choice([None, -1, 0, 7]),
        pa.float64(): lambda: rng.choice([None, -0.5, 0.0, 2.5]),
        pa.int32(): lambda: rng.choice([1, 2]),
    }
    names = [f"k{i}" for i in range(len(key_types))]
    state = KeyedAggregateState(names, SPEND_FNS, 16)
    expected: dict = {}
    for _ in range(6):
        partial = {tuple(pick[t]() for t in key_types): (rng.randint(1, 9), 1) for _ in range(8)}
        columns = {**dict(zip(names, key_types)), "total": pa.int64(), "n": pa.int64()}
        state.merge(_partials(columns, [(*k, *v) for k, v in partial.items()]))
        for k, (total, n) in partial.items():
            old = expected.get(k, [0, 0])
            expected[k] = [old[0] + total, old[1] + n]
    assert len(state) == len(expected)
    assert {k: state.value(k) for k in expected} == expected


def test_nan_and_decimal_keys_are_one_key_each_across_epochs_like_spark():
    """Spark groups every NaN into one key; distinct NaN objects never compare equal in Python,
    so the state must fold them. A decimal key has a stable key group."""
    nan = float("nan")
    floats = KeyedAggregateState(["k"], SPEND_FNS, 8)
    columns = {"k": pa.float64(), "total": pa.int64(), "n": pa.int64()}
    floats.merge(_partials(columns, [(nan, 1, 1), (1.0, 2, 1), (-0.0, 5, 1)]))
    floats.merge(_partials(columns, [(float("nan"), 3, 2), (0.0, 1, 1)]))
    assert len(floats) == 3
    assert floats.value((nan,)) == [4, 3] and floats.value((0.0,)) == [6, 2]
    decimals = KeyedAggregateState(["k"], SPEND_FNS, 8)
    columns = {"k": pa.decimal128(10, 2), "total": pa.int64(), "n": pa.int64()}
    decimals.merge(_partials(columns, [(Decimal("1.50"), 1, 1)]))
    decimals.merge(_partials(columns, [(Decimal("1.50"), 2, 1), (Decimal("2.00"), 1, 1)]))
    assert len(decimals) == 2 and decimals.value((Decimal("1.50"),)) == [3, 2]


def test_a_manifest_s_lost_data_is_sealed_and_one_without_keeps_its_checksum():
    """Ranges skipped under on_data_loss: skip are covered by the checksum; a manifest without
    any (stored before the field existed) verifies as it did."""
    m = _one_manifest()
    older = json.loads(m.sealed().to_bytes())
    del older["data_lost"]
    assert Manifest.model_validate(older).verify_checksum()
    lost = m.model_copy(update={"data_lost": [OffsetRange(topic="t", partition=0, start=2, end=5)]}).sealed()
    assert Manifest.from_bytes(lost.to_bytes()).verify_checksum()
    assert b'"starts":[2]' in lost.to_bytes()
    assert not Manifest.from_bytes(lost.to_bytes().replace(b'"starts":[2]', b'"starts":[3]')).verify_checksum()
