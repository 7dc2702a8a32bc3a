"""The ``sink.kafka`` spec: the external form loads, its staging files sink is filled in, and a
bad field is named (file and line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_lib.errors import SpecError
from pipeline_lib.spec import load_spec

pytestmark = pytest.mark.unit

STATELESS = """\
name: orders
source:
  kafka:
    topic: orders
    schema: "user string, amount long"
transforms:
  - filter: "amount > 500"
sink:
  kafka:
    topic: orders-kept
    key: user
    format: json
checkpoint:
  store: s3://checkpoints/orders
"""

AGGREGATE = """\
name: totals
sources:
  orders: {kafka: {topic: orders, schema: "user string, amount long"}}
flows:
  - name: per-user
    source: orders
    state: {aggregate: {key: [user], values: {total: sum(amount)}}}
    sink:
      kafka: {topic: totals, key: [user], headers: [total]}
checkpoint: {store: "s3://checkpoints/totals"}
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return load_spec(path)


def _error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SpecError) as info:
        _load(tmp_path, text)
    return str(info.value)


def test_the_external_form_loads_with_its_staging_under_the_checkpoint_store(tmp_path):
    sink = _load(tmp_path, STATELESS).sink
    assert sink is not None and sink.kafka is not None
    assert (sink.kafka.topic, sink.kafka.key_columns(), sink.kafka.format) == ("orders-kept", ["user"], "json")
    assert (sink.files.path, sink.files.format) == ("s3://checkpoints/orders/kafka-staging/orders", "parquet")
    flow = _load(tmp_path, AGGREGATE).all_flows()[0]
    assert flow.sink.files.path == "s3://checkpoints/totals/kafka-staging/per-user"
    assert flow.sink.kafka is not None and flow.sink.kafka.headers == ["total"]


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("format: json", "format: json\n    partitioner: random", "sink.kafka.partitioner"),
        ("format: json", "format: xml", "sink.kafka.format"),
        ("    key: user\n", "", "sink.kafka.key"),
        ("topic: orders-kept", "topic: 'orders kept'", "sink.kafka.topic"),
        ("key: user", "key: [user, user]", "sink.kafka.key"),
        ("key: user", "key: []", "sink.kafka.key"),
        ("key: user", "key: user\n    tombstone: 'a b'", "sink.kafka.tombstone"),
        ("key: user", "key: user\n    tombstone: deleted", "sink.kafka.tombstone"),
    ],
)
def test_a_bad_field_is_named(tmp_path, old, new, named):
    assert old in STATELESS
    assert named in _error(tmp_path, STATELESS.replace(old, new))


def test_an_aggregate_is_keyed_by_its_own_columns(tmp_path):
    message = _error(tmp_path, AGGREGATE.replace("key: [user], headers", "key: [amount], headers"))
    assert "flows.0.sink.kafka.key" in message and "amount" in message


def test_a_filtered_flow_is_keyed_by_the_source_s_columns(tmp_path):
    message = _error(tmp_path, STATELESS.replace("key: user", "key: customer"))
    assert "sink.kafka.key" in message and "customer" in message
    assert _load(tmp_path, STATELESS.replace("key: user", "key: [user, _partition]")).sink is not None
