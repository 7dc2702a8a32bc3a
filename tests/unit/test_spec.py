"""Job specs: the documented form loads; bad specs are rejected with the field path and reason."""

import copy

import pytest

from pipeline_lib.errors import SpecError
from pipeline_lib.spec import load_spec, parse_spec

GOOD = {
    "name": "spend-per-user",
    "source": {"kafka": {"topic": "payments", "format": "json", "schema": "user string, amount long"}},
    "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)", "n": "count(*)"}}},
    "sink": {"files": {"path": "s3://results/spend-per-user", "format": "jsonl"}},
    "checkpoint": {"store": "s3://checkpoints/spend-per-user"},
    "trigger": {"max_records_per_epoch": 20000},
    "parallelism": 2,
}


def with_change(path: str, value):
    spec = copy.deepcopy(GOOD)
    node = spec
    *parents, last = path.split(".")
    for p in parents:
        node = node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return spec


def test_documented_spec_loads(tmp_path):
    import yaml

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    spec = load_spec(path)
    assert spec.name == "spend-per-user"
    assert spec.state.aggregate.functions()["n"].column is None
    assert spec.source.kafka.columns()[:2] == ["user", "amount"]


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("name", "Bad Name", "name:"),
        ("name", "../escape", "name:"),
        ("source.kafka.format", "avro", "source.kafka.format:"),
        ("source.kafka.schema", "user strng", "unknown type"),
        ("source.kafka.schema", KeyError, "needs a schema"),
        ("source.kafka.bootstrap", "localhost:9092", "environment variables"),
        ("state.aggregate.values", {"total": "median(amount)"}, "state.aggregate.values"),
        ("state.aggregate.values", {"total": "sum(*)"}, "only count(*)"),
        ("state.aggregate.key", ["nope"], "columns ['nope']"),
        ("state.aggregate.key", [], "state.aggregate.key"),
        ("state.aggregate.key", ["user\n"], "key column 'user\\n' is not a plain column name"),
        ("state.aggregate.values", {"total\n": "sum(amount)"}, "output name 'total\\n' is not a plain column name"),
        ("sink.files.path", "s3://results/../other", "sink.files.path"),
        ("sink.files.path", "relative/path", "sink.files.path"),
        ("sink.files.format", "csv", "sink.files.format"),
        ("checkpoint.store", "file://relative", "checkpoint.store"),
        ("trigger.max_records_per_epoch", 0, "trigger.max_records_per_epoch"),
        ("parallelism", 0, "parallelism"),
        ("parallelism", 1000, "exceeds checkpoint.max_parallelism"),
        ("surprise", 1, "surprise: unknown field"),
        ("on_error", "dead_letter", "on_error: dead_letter needs dead_letter.path"),
        ("on_error", "retry", "on_error:"),
        ("dead_letter", {"path": "s3://results/dlq"}, "dead_letter is set but on_error is not dead_letter"),
        ("max_record_bytes", 0, "max_record_bytes:"),
        ("checkpoint.key_groups_per_state_file", 0, "checkpoint.key_groups_per_state_file"),
        ("checkpoint.key_groups_per_state_file", 129, "key_groups_per_state_file 129 exceeds max_parallelism 128"),
    ],
)
def test_bad_spec_names_field_and_reason(path, value, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(with_change(path, value), "job.yaml")
    assert expected in str(info.value)
    assert str(info.value).startswith("job.yaml: invalid job spec")


def test_transforms_need_exactly_one_kind():
    spec = copy.deepcopy(GOOD)
    spec["transforms"] = [{"filter": "amount > 0", "select": ["user"]}]
    with pytest.raises(SpecError, match=r"transforms\.0: a transform has exactly one"):
        parse_spec(spec)
    spec["transforms"] = [{"python": "not a reference"}]
    with pytest.raises(SpecError, match="module:function"):
        parse_spec(spec)


def test_select_transform_skips_column_check_and_python_hook_accepted():
    spec = copy.deepcopy(GOOD)
    spec["transforms"] = [
        {"filter": "amount > 0"},
        {"select": ["user", "amount * 2 AS doubled"]},
        {"python": "mypkg.hooks:enrich"},
    ]
    spec["state"]["aggregate"]["values"] = {"total": "sum(doubled)"}
    assert parse_spec(spec).transforms[2].python == "mypkg.hooks:enrich"


def test_yaml_errors_are_reported(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")


def test_max_batch_bytes_reaches_the_kafka_reader_of_each_epoch():
    """The spec's cap on what one Kafka batch may decompress to is what the epoch's reader uses
    (unset: the reader derives it from max_record_bytes)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from pipeline_lib.execution.source.epoch_reader import epoch_range_reader
    from pipeline_lib.execution.source.kafka_source import max_batch_bytes_for
    from pipeline_lib.plan.offsets import plan_epoch
    from pipeline_lib.samples import spend_job_spec

    plan = plan_epoch(1, None, "payments", {0: 0}, {0: 10}, 100, None)
    schema = StructType([StructField("user", StringType())])
    for cap in (None, 2_048):
        job = parse_spec(
            spend_job_spec(
                "job", "payments", "file:///tmp/o", "file:///tmp/c", extra={"max_batch_bytes": cap} if cap else None
            )
        )
        source = job.all_sources()["main"].kafka
        reader = epoch_range_reader(
            "127.0.0.1:9", source, schema, plan, 1, job.on_error, job.max_record_bytes, job.max_batch_bytes
        )
        assert reader.max_batch_bytes == cap
    assert max_batch_bytes_for(1 << 20) == 64 << 20
    with pytest.raises(SpecError, match="max_batch_bytes"):
        parse_spec(spend_job_spec("job", "payments", "file:///tmp/o", "file:///tmp/c", extra={"max_batch_bytes": 10}))
