"""Bad input under the on_error policy: malformed JSON, schema mismatches, oversized records and
tombstones are dead-lettered (topic, partition, offset, raw bytes, error) or skipped and counted,
exactly once across a crash, while the good records give exactly the right result; under the
default policy a bad record fails the run, naming it, and commits nothing for its epoch."""

from __future__ import annotations

import base64
import json

import pytest

from pipeline_lib.checkpoint import layout
from pipeline_lib.samples import create_topic, payment_events, produce_raw, spend_per_user
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.sink.files_sink import SuccessMarker
from pipeline_lib.sink.table_reader import committed_epochs, read_append_rows
from pipeline_lib.storage import open_store, parse_location
from tests.support import result_table, run_cli, spend_spec, write_spec

BAD = {
    b"{oops": "malformed JSON",
    b'{"user": "a", "amount": "12"}': "field 'amount': expected an integer",
    b"[1, 2]": "expected a JSON object",
    b'{"user": 7, "amount": 1}': "field 'user': expected a string",
    b'{"user": "big", "amount": 1, "pad": "' + b"x" * 3000 + b'"}': "exceeds max_record_bytes 1000",
    None: "tombstone",
}


def produce_dirty_topic(bootstrap: str, topic: str, seed: int) -> tuple[str, list[dict], dict[int, bytes | None]]:
    """Partition 0: good records with the bad ones at known offsets (10, 61, 112, …); partition 1:
    good only. Returns (topic, good events, offset of each bad record in partition 0 -> its bytes)."""
    create_topic(bootstrap, topic, 2)
    good0, good1 = payment_events(300, 40, seed=seed), payment_events(200, 40, seed=seed + 1)
    values: list = []
    bad_offsets: dict[int, bytes | None] = {}
    bad = list(BAD)
    for i, event in enumerate(good0):
        if i % 50 == 10 and bad:
            bad_offsets[len(values)] = bad[0]
            value = bad.pop(0)
            values.append((b"tombstone", None) if value is None else value)
        values.append(json.dumps(event).encode())
    produce_raw(bootstrap, topic, values, partition=0)
    produce_raw(bootstrap, topic, [json.dumps(e).encode() for e in good1], partition=1)
    return topic, good0 + good1, bad_offsets


@pytest.fixture(scope="module")
def dirty_topic(local_stack):
    return produce_dirty_topic(local_stack.kafka_bootstrap, "dirty-e2e", seed=5)


def _spec(tmp_path, name, topic, policy):
    extra = {"on_error": policy, "max_record_bytes": 1000}
    if policy == "dead_letter":
        extra["dead_letter"] = {"path": f"s3://results/{name}-dead"}
    return write_spec(
        tmp_path,
        spend_spec(name, topic, f"s3://results/{name}", f"s3://checkpoints/{name}", per_epoch=150, extra=extra),
    )


def _manifests(env, name):
    store = open_store(
        parse_location(f"s3://checkpoints/{name}").child("pipelines/main"), ConnectionSettings.from_env(env)
    )
    return [json.loads(store.get(k)) for k in store.list(layout.MANIFESTS_PREFIX)]


def test_dead_letters_hold_each_bad_record_once_across_a_crash(stack_env, tmp_path, dirty_topic):
    topic, good, bad_offsets = dirty_topic
    name = "dead-letters"
    spec = _spec(tmp_path, name, topic, "dead_letter")
    crashed = run_cli(["run", str(spec)], {**stack_env, "PIPELINE_FAULT_POINTS": "after_sink_success@2"})
    assert crashed.returncode == -9
    result = run_cli(["run", str(spec)], stack_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bad record(s) dead-lettered, first dirty-e2e[0]@" in result.stderr
    assert result_table(stack_env, f"s3://results/{name}") == spend_per_user(good)

    letters = read_append_rows(open_store(f"s3://results/{name}-dead/main", ConnectionSettings.from_env(stack_env)))
    assert sorted((r["partition"], r["offset"]) for r in letters) == sorted((0, o) for o in bad_offsets)
    for row in letters:
        raw = bad_offsets[row["offset"]]
        assert row["topic"] == topic
        assert (base64.b64decode(row["raw_base64"]) if row["raw_base64"] is not None else None) == raw
        assert BAD[raw] in row["error"]
    committed = {m["epoch"]: m["bad_records"] for m in _manifests(stack_env, name)}
    assert sum(committed.values()) == len(BAD)

    intact = run_cli(["verify", str(spec)], stack_env)
    assert intact.returncode == 0 and " 0 lost or damaged" in intact.stdout, intact.stdout + intact.stderr
    dead = open_store(f"s3://results/{name}-dead/main", ConnectionSettings.from_env(stack_env))
    markers = [SuccessMarker.model_validate_json(dead.get(f"epoch={e}/_SUCCESS")) for e in committed_epochs(dead)]
    part = next(f for m in reversed(markers) for f in m.files)  # the newest epoch with dead letters
    assert "/part-d" in part.key  # written by a read task
    dead.delete(part.key)
    damaged = run_cli(["verify", str(spec), "--json"], stack_env)
    assert damaged.returncode == 1
    lost = [(f["what"], f["status"]) for f in json.loads(damaged.stdout) if f["status"] != "ok"]
    assert ("dead letters", "LOST") in lost and ("snapshot", "LOST") in lost


def test_skip_policy_counts_bad_records_and_writes_no_dead_letters(stack_env, tmp_path, dirty_topic):
    topic, good, _ = dirty_topic
    name = "skip-bad"
    result = run_cli(["run", str(_spec(tmp_path, name, topic, "skip"))], stack_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bad record(s) skipped" in result.stderr
    assert result_table(stack_env, f"s3://results/{name}") == spend_per_user(good)
    assert sum(m["bad_records"] for m in _manifests(stack_env, name)) == len(BAD)
    assert all(m["dead_letters"] is None for m in _manifests(stack_env, name))


TRICKY_GOOD = [  # what msgspec refuses or could misread but the reference decoder accepts
    b'{"user":"t-\xc3\xa9","amount":3.0}',
    b'{"user":"t-\\ud83d\\ude00","amount":1E2}',
    b'{"amount":7,"user":"t-dup","user":"t-dup2"}',
    b'\xef\xbb\xbf{"user":"t-bom","amount":2}',
    b'{"user":"t-x","amount":5,"extra":NaN,"deep":[[[1]]]}',
    b' {"user" : "t-ws" , "amount" : -5 } ',
    '{"user":"t-utf16","amount":4}'.encode("utf-16"),
    b'{"user":"t-max","amount":9223372036854775807}',
]
TRICKY_BAD = [
    b'{"user":"t-b1","amount":true}',
    b'{"user":"t-b2","amount":9223372036854775808}',
    b'{"user":"\\ud800","amount":1}',
    b'{"user":"t-b3","amount":1,"x":"\xff"}',
    b'{"user":"t-b4","amount":2}x',
    b'{"user":"t-b5","amount":[1]}',
    b'"just a string"',
    b'{"user":"t-b6","amount":1.5}',
]


def test_tricky_records_are_read_as_the_reference_decoder_reads_them(stack_env, local_stack, tmp_path):
    """The fast read path (msgspec, Arrow batches) in real Spark workers: every row and every
    dead letter (offset, reason, raw bytes) is what the per-record reference decoder gives."""
    from pipeline_lib.errors import RecordError
    from pipeline_lib.execution.source.record_decoding import JsonRecordDecoder

    topic = "tricky-e2e"
    create_topic(local_stack.kafka_bootstrap, topic, 1)
    good = payment_events(400, 30, seed=8)
    tricky = TRICKY_GOOD + TRICKY_BAD
    values = []
    for i, event in enumerate(good):
        values.append(json.dumps(event).encode())
        if i % 25 == 3 and tricky:
            values.append(tricky.pop(0))
    produce_raw(local_stack.kafka_bootstrap, topic, values, partition=0)

    reference = JsonRecordDecoder([("user", "string"), ("amount", "bigint")])
    rows, reasons = [], {}
    for offset, value in enumerate(values):
        try:
            user, amount = reference.decode(topic, 0, offset, value)
            rows.append({"user": user, "amount": amount})
        except RecordError as exc:
            reasons[offset] = exc.reason
    assert len(reasons) == len(TRICKY_BAD) and len(rows) == len(good) + len(TRICKY_GOOD)

    name = "tricky"
    result = run_cli(["run", str(_spec(tmp_path, name, topic, "dead_letter"))], stack_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result_table(stack_env, f"s3://results/{name}") == spend_per_user(rows)
    letters = read_append_rows(open_store(f"s3://results/{name}-dead/main", ConnectionSettings.from_env(stack_env)))
    assert {row["offset"]: row["error"] for row in letters} == reasons
    assert all(base64.b64decode(row["raw_base64"]) == values[row["offset"]] for row in letters)
    assert any("lone surrogate" in r for r in reasons.values()) and any("malformed JSON" in r for r in reasons.values())


@pytest.mark.parametrize("locations", ["s3"], indirect=True)
def test_bad_record_fails_the_run_naming_it_and_commits_nothing_for_its_epoch(
    stack_env, tmp_path, local_stack, locations
):
    name, sink, store_uri = locations
    topic = f"bad-input-{name}"
    create_topic(local_stack.kafka_bootstrap, topic, 1)
    produce_raw(local_stack.kafka_bootstrap, topic, [b'{"user":"a","amount":1}'] * 5 + [b'{"user":"a","amount":"x"}'])
    spec = write_spec(tmp_path, spend_spec(name, topic, sink, store_uri, per_epoch=100))
    failed = run_cli(["run", str(spec)], stack_env)
    assert failed.returncode != 0
    assert f"bad record at {topic}[0]@5: field 'amount': expected an integer" in failed.stderr
    assert "Traceback" not in failed.stderr
    # the start-over took epoch 1 with an empty marker (it fences an older attempt) and reset the
    # head to no snapshot; no part file was written and no snapshot committed
    settings = ConnectionSettings.from_env(stack_env)
    out = open_store(sink, settings)
    markers = ["_staging/epoch=1/_SUCCESS", "epoch=1/_SUCCESS"]  # staged, and published for readers
    assert sorted(out.list()) == markers and all(json.loads(out.get(m))["files"] == [] for m in markers)
    pipeline_store = open_store(parse_location(store_uri).child(layout.pipeline_root("main")), settings)
    assert json.loads(pipeline_store.get(layout.HEAD_KEY))["history"] == []
