"""Stream-static joins' version pins, without Spark: a table's pin (Parquet files with their
version tokens, a Delta version), the pin in the plan's digest, a changed table logged, and a
pinned file that changed refused rather than joined."""

from __future__ import annotations

import hashlib
import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from pipeline_lib.errors import PipelineError, SpecError
from pipeline_lib.execution.engine import table_join
from pipeline_lib.execution.engine.table_join import read_pinned_file
from pipeline_lib.execution.engine.table_pinning import is_data_file, pin_table, pin_tables
from pipeline_lib.plan.offsets import plan_epoch
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.flow_spec import TransformSpec
from pipeline_lib.spec.join_spec import JoinSpec
from pipeline_lib.spec.loader import parse_spec, read_yaml

pytestmark = pytest.mark.unit

SETTINGS = ConnectionSettings()


def _users(path, name: str, users: list[str], country: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"user": users, "country": [country] * len(users)}), path / name)


@pytest.fixture(autouse=True)
def _no_worker_cache():
    table_join._FILES.clear()
    yield
    table_join._FILES.clear()


def test_a_parquet_folder_is_pinned_by_its_data_files_with_their_versions(tmp_path):
    table = tmp_path / "users"
    _users(table, "a.parquet", ["u1", "u2"], "fr")
    _users(table / "_delta_log", "x.parquet", ["zz"], "zz")
    (table / ".hidden").write_bytes(b"not parquet")
    join = JoinSpec(table=f"file://{table}/", on=["user"])
    pin = pin_table(join, SETTINGS)
    assert pin.location == f"file://{table}" and pin.format == "parquet" and pin.version is None
    assert [f.key for f in pin.files] == ["a.parquet"]
    assert pin.files[0].size == (table / "a.parquet").stat().st_size and pin.files[0].version
    assert read_pinned_file(pin, pin.files[0], SETTINGS).column("user").to_pylist() == ["u1", "u2"]
    assert is_data_file("part/x.parquet") and not is_data_file("_SUCCESS") and not is_data_file("a/.x")


def test_a_pinned_file_that_changed_is_refused_naming_the_table_and_file(tmp_path):
    table = tmp_path / "users"
    _users(table, "a.parquet", ["u1", "u2"], "fr")
    pin = pin_table(JoinSpec(table=f"file://{table}", on=["user"]), SETTINGS)
    _users(table, "a.parquet", ["u1", "u3"], "de")  # the same key, other rows: a replay must not join these
    with pytest.raises(PipelineError, match=r"join table file://.*/users: file a\.parquet is gone or changed"):
        read_pinned_file(pin, pin.files[0], SETTINGS)
    (table / "a.parquet").unlink()
    with pytest.raises(PipelineError, match="a.parquet is gone or changed"):
        read_pinned_file(pin, pin.files[0], SETTINGS)


def test_a_changed_table_gets_a_new_pin_and_is_logged(tmp_path, caplog):
    table = tmp_path / "users"
    _users(table, "a.parquet", ["u1"], "fr")
    joins = {f"file://{table}": JoinSpec(table=f"file://{table}", on=["user"])}
    first = pin_tables(joins, SETTINGS, {}, "pipeline p epoch 1")
    assert pin_tables(joins, SETTINGS, first, "pipeline p epoch 2") == first
    _users(table, "b.parquet", ["u2"], "de")
    with caplog.at_level(logging.INFO):
        third = pin_tables(joins, SETTINGS, first, "pipeline p epoch 3")
    assert [f.key for f in third[f"file://{table}"].files] == ["a.parquet", "b.parquet"]
    assert "pipeline p epoch 3: join table changed" in caplog.text and "2 files" in caplog.text


def test_the_pins_are_part_of_the_plan_digest_and_a_plan_without_joins_keeps_its_own(tmp_path):
    table = tmp_path / "users"
    _users(table, "a.parquet", ["u1"], "fr")
    join = JoinSpec(table=f"file://{table}", on=["user"])
    plan = plan_epoch(1, None, "t", {0: 0}, {0: 10}, 100)
    v1 = plan.model_copy(update={"tables": {join.location: pin_table(join, SETTINGS)}})
    _users(table, "b.parquet", ["u2"], "de")
    v2 = plan.model_copy(update={"tables": {join.location: pin_table(join, SETTINGS)}})
    assert len({plan.digest(), v1.digest(), v2.digest()}) == 3
    legacy = json.dumps(plan.model_dump(mode="json", include={"epoch", "positions", "ranges"}), sort_keys=True)
    assert plan.digest() == hashlib.sha256(legacy.encode()).hexdigest()
    same = type(plan).model_validate_json(v1.model_dump_json())
    assert same == v1 and same.digest() == v1.digest()  # a saved plan is replayed with its pins


def test_a_delta_table_is_pinned_by_its_version(tmp_path):
    table = tmp_path / "dims"
    write_deltalake(str(table), pa.table({"user": ["u1"], "country": ["fr"]}))
    join = JoinSpec(table=f"file://{table}", format="delta", on=["user"])
    first = pin_table(join, SETTINGS)
    write_deltalake(str(table), pa.table({"user": ["u2"], "country": ["de"]}), mode="append")
    second = pin_table(join, SETTINGS)
    assert (first.version, second.version) == (0, 1) and len(first.files) == 1 and len(second.files) == 2
    rows = [read_pinned_file(second, f, SETTINGS).column("user").to_pylist() for f in second.files]
    assert sorted(sum(rows, [])) == ["u1", "u2"]
    parted = tmp_path / "parted"
    write_deltalake(str(parted), pa.table({"user": ["u1"], "country": ["fr"]}), partition_by=["country"])
    with pytest.raises(PipelineError, match="partition columns"):
        pin_table(JoinSpec(table=f"file://{parted}", format="delta", on=["user"]), SETTINGS)


def test_the_join_transform_is_validated_naming_the_field():
    with pytest.raises(ValueError, match="exactly one of filter, select, python, dedup, join"):
        TransformSpec.model_validate({"filter": "x > 1", "join": {"table": "s3://dims/users", "on": ["user"]}})
    with pytest.raises(ValueError, match="not a plain column name"):
        JoinSpec.model_validate({"table": "s3://dims/users", "on": ["a b"]})
    with pytest.raises(ValueError, match="how"):
        JoinSpec.model_validate({"table": "s3://dims/users", "on": ["user"], "how": "outer"})
    with pytest.raises(SpecError, match=r"transforms\.0\.join\.format"):
        text = (
            "name: j\nsource: {kafka: {topic: t, format: json, schema: 'user string'}}\n"
            "transforms:\n  - join: {table: 's3://dims/users', format: csv, on: [user]}\n"
            "sink: {files: {path: 's3://results/j'}}\ncheckpoint: {store: 's3://checkpoints/j'}\n"
        )
        parse_spec(read_yaml(text, "j.yaml")[0], "j.yaml")


def test_the_planner_pins_each_new_plan_and_a_replayed_plan_keeps_its_pin(tmp_path):
    """The runner's real planner on local stores: epoch 1's plan pins the table; the table
    changes; epoch 1 planned again from the same positions (a replay) keeps the old pin, so it
    joins what the first run joined; epoch 2 is planned anew and takes the new version."""
    from pipeline_lib.execution.runtime.runner_types import RunOptions
    from pipeline_lib.samples import spend_job_spec
    from tests.runner_fakes import TestRunner

    table = tmp_path / "users"
    _users(table, "a.parquet", ["u1"], "fr")
    raw = spend_job_spec("job", "pay", f"file://{tmp_path}/out", f"file://{tmp_path}/ckpt")
    raw["transforms"] = [{"join": {"table": f"file://{table}", "on": ["user"]}}]
    planner = TestRunner(parse_spec(raw), RunOptions(), SETTINGS).planner
    first = planner.plan(1, None, {0: 0}, {0: 10}, None)
    _users(table, "b.parquet", ["u2"], "de")
    replay = planner.plan(1, None, {0: 0}, {0: 10}, None)
    second = planner.plan(2, "s1", {0: 10}, {0: 20}, None)
    location = f"file://{table}"
    assert [f.key for f in first.tables[location].files] == ["a.parquet"]
    assert replay.tables == first.tables and replay.digest() == first.digest()
    assert [f.key for f in second.tables[location].files] == ["a.parquet", "b.parquet"]


def test_dedup_then_join_then_aggregate_runs_as_a_dedup_stage_and_the_flow_reading_it():
    """The issue's spec form: the flow becomes its dedup stage (a process state, writing only
    markers under the checkpoint store) and the flow (the join, the aggregate by a column of the
    table) reading the stage's rows; other forms around a dedup are refused, naming the field."""
    text = (
        "name: orders\nsource: {kafka: {topic: t, format: json, schema: 'id string, user string, amount long'}}\n"
        "transforms:\n  - dedup: {key: [id], within: '10 minutes'}\n"
        "  - join: {table: 's3://dims/users/', format: parquet, on: [user], how: left}\n"
        "state: {aggregate: {key: [country], values: {total: sum(amount), n: count(*)}}}\n"
        "sink: {files: {path: 's3://results/orders'}}\ncheckpoint: {store: 's3://checkpoints/orders'}\n"
    )
    job = parse_spec(read_yaml(text, "orders.yaml")[0], "orders.yaml")
    stage, flow = job.all_flows()
    assert (stage.name, stage.after, flow.name, flow.after) == ("orders-dedup", None, "orders", "orders-dedup")
    assert stage.state is not None and stage.state.process is not None and stage.state.key == ["id"]
    assert stage.sink.path == "s3://checkpoints/orders/stages/orders" and stage.transforms == []
    assert [t.join is not None for t in flow.transforms] == [True] and flow.state.aggregate.key == ["country"]
    for bad, field in (
        (text.replace("state: {aggregate:", "state: {process: {key: [id], function: 'm:f'}, x:"), "state"),
        (text.replace("  - join:", "  - dedup: {key: [user], within: '1 hour'}\n  - join:"), "transforms.1.dedup"),
        (
            text.replace("state: {aggregate: {key: [country], values: {total: sum(amount), n: count(*)}}}\n", ""),
            "state",
        ),
    ):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            parse_spec(read_yaml(bad, "orders.yaml")[0], "orders.yaml")
