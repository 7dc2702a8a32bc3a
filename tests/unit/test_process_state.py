"""A process function's keyed state (execution.state.process_state) and its spec: the handle's
value, list and map states, snapshot rows and restore, ttl on the epoch clock, dedup, errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from pipeline_lib.api.tables import read_table
from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.state.process_state import ProcessState
from pipeline_lib.settings import ConnectionSettings
from pipeline_lib.spec.durations import parse_duration_ms
from pipeline_lib.spec.flow_spec import FlowSpec, StateSpec
from pipeline_lib.spec.process_spec import DEDUP_FUNCTION, ProcessSpec
from tests.process_example import RUNNING_TOTALS_OUTPUT, failing, running_totals, unstorable


def _rows(users: list[str], amounts: list[int], clock: int = 1_000, first_offset: int = 0) -> pa.Table:
    n = len(users)
    return pa.table(
        {
            "user": users,
            "amount": pa.array(amounts, pa.int64()),
            "_partition": pa.array([0] * n, pa.int32()),
            "_offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "_timestamp_ms": pa.array([clock] * n, pa.int64()),
        }
    )


def _totals(maxp: int = 16) -> ProcessState:
    spec = ProcessSpec(key=["user"], function="tests.process_example:running_totals", output=RUNNING_TOTALS_OUTPUT)
    return ProcessState(spec, maxp, running_totals)


def _snapshot_rows(state: ProcessState) -> tuple[pa.Table, np.ndarray]:
    slots, _ = state.slots_by_key_group()
    return state.table(slots, state.schema()), state.key_groups(slots)


def test_value_list_and_map_states_carry_across_epochs_and_a_restore():
    state = _totals()
    changed, out, _ = state.process(_rows(["a", "b", "a"], [1, 2, 4]), epoch=1)
    assert len(changed) == 2
    assert out.to_pylist() == [
        {"user": "a", "total": 5, "n": 2, "recent": "1,4", "evens": 1},
        {"user": "b", "total": 2, "n": 1, "recent": "2", "evens": 1},
    ]
    table, groups = _snapshot_rows(state)
    restored = _totals()
    restored.load(table, groups)
    for s in (state, restored):
        _, out, _ = s.process(_rows(["a", "a"], [7, 9], first_offset=3), epoch=2)
        assert out.to_pylist() == [{"user": "a", "total": 21, "n": 4, "recent": "4,7,9", "evens": 1}]
    assert _snapshot_rows(state)[0].equals(_snapshot_rows(restored)[0])


def test_rows_reach_the_function_in_read_order_whatever_order_they_came_in():
    state = _totals()
    rows = _rows(["a", "a", "a"], [1, 2, 3]).take(pa.array([2, 0, 1]))
    _, out, _ = state.process(rows, epoch=1)
    assert out.column("recent").to_pylist() == ["1,2,3"]


def test_ttl_drops_a_key_on_the_epoch_clock_and_its_span_is_written_whole():
    spec = ProcessSpec(key=["user"], function="tests.process_example:running_totals", output=RUNNING_TOTALS_OUTPUT)
    state = ProcessState(spec.model_copy(update={"ttl": "10 seconds"}), 16, running_totals)
    state.process(_rows(["a", "b"], [1, 2], clock=1_000), epoch=1)
    state.dropped_groups()
    state.process(_rows(["b"], [3], clock=10_999), epoch=2)  # a: 9.999 s old, kept
    assert len(state) == 2 and not state.dropped_groups()
    changed, _, _ = state.process(_rows(["b"], [3], clock=11_000), epoch=3)  # a: 10 s old, gone
    assert len(state) == 1 and state.stored(("a",)) is None
    assert state.dropped_groups() == {int(state.key_groups(np.array([0]))[0])}
    _, out, _ = state.process(_rows(["a"], [5], clock=11_001), epoch=4)
    assert out.to_pylist()[0]["total"] == 5  # starts over


def test_a_ttl_needs_the_records_timestamps():
    spec = ProcessSpec(key=["user"], function="tests.process_example:running_totals", ttl="1 minute")
    with pytest.raises(PipelineError, match="_timestamp_ms"):
        ProcessState(spec, 16, running_totals).process(_rows(["a"], [1]).drop_columns(["_timestamp_ms"]), 1)


def test_the_functions_errors_name_the_key_and_the_epoch():
    spec = ProcessSpec(key=["user"], function="tests.process_example:failing")
    with pytest.raises(PipelineError, match=r"failing for key \('user-000007',\) in epoch 4 failed: ValueError"):
        ProcessState(spec, 16, failing).process(_rows(["user-000001", "user-000007"], [1, 2]), epoch=4)
    spec = ProcessSpec(key=["user"], function="tests.process_example:unstorable")
    with pytest.raises(PipelineError, match=r"key \('a',\) in epoch 2 left a state value JSON cannot hold"):
        ProcessState(spec, 16, unstorable).process(_rows(["a"], [1]), epoch=2)


def test_output_that_does_not_fit_the_declared_schema_names_the_key():
    spec = ProcessSpec(key=["user"], function="tests.process_example:running_totals", output="user string, x bigint")
    with pytest.raises(PipelineError, match=r"for key \('a',\) in epoch 1 returned rows that do not fit"):
        ProcessState(spec, 16, running_totals).process(_rows(["a"], [1]), epoch=1)


def test_dedup_passes_each_id_once_across_epochs_and_a_restore():
    flow = FlowSpec.model_validate(
        {
            "name": "ids",
            "source": "main",
            "transforms": [{"filter": "amount > 0"}, {"dedup": {"key": ["user"], "within": "10 minutes"}}],
            "sink": {"files": {"path": "file:///tmp/x"}},
        }
    )
    assert [t.filter for t in flow.transforms] == ["amount > 0"]
    assert flow.state is not None and flow.state.process is not None
    assert flow.state.process.function == DEDUP_FUNCTION and flow.state.process.ttl_ms() == 600_000
    state = ProcessState(flow.state.process, 16)
    _, out, _ = state.process(_rows(["a", "b", "a"], [1, 2, 3]), epoch=1)
    assert out.column("amount").to_pylist() == [1, 2]
    restored = ProcessState(flow.state.process, 16)
    restored.load(*_snapshot_rows(state))
    _, out, _ = restored.process(_rows(["b", "c"], [4, 5], clock=2_000, first_offset=3), epoch=2)
    assert out.column("user").to_pylist() == ["c"]


def test_process_spec_is_checked_where_written():
    with pytest.raises(ValidationError, match="package.module:function|pattern"):
        StateSpec.model_validate({"process": {"key": ["u"], "function": "not a function"}})
    with pytest.raises(ValidationError, match="is not a duration"):
        StateSpec.model_validate({"process": {"key": ["u"], "function": "m:f", "ttl": "soon"}})
    with pytest.raises(ValidationError, match="exactly one of aggregate, process"):
        StateSpec.model_validate(
            {"process": {"key": ["u"], "function": "m:f"}, "aggregate": {"key": ["u"], "values": {"n": "count(*)"}}}
        )
    with pytest.raises(ValidationError, match="output"):
        StateSpec.model_validate({"process": {"key": ["u"], "function": "m:f", "output": "a strin g,"}})
    assert parse_duration_ms("500 ms") == 500 and parse_duration_ms("2 hours") == 7_200_000
    agg = StateSpec.model_validate({"aggregate": {"key": ["u"], "values": {"n": "count(*)"}}})
    assert agg.aggregate.key == ["u"] and agg.model_dump(exclude_defaults=True)["aggregate"] == {
        "key": ["u"],
        "values": {"n": "count(*)"},
    }


def test_dedup_is_last_or_followed_by_stateless_transforms_and_an_aggregate():
    base = {"name": "f", "source": "main", "sink": {"files": {"path": "file:///tmp/x"}}}
    with pytest.raises(ValidationError, match="after a dedup come stateless transforms"):
        FlowSpec.model_validate({**base, "transforms": [{"dedup": {"key": ["id"], "within": "1 h"}}, {"filter": "x"}]})
    with pytest.raises(ValidationError, match="after a dedup come stateless transforms"):
        FlowSpec.model_validate(
            {
                **base,
                "transforms": [{"dedup": {"key": ["id"], "within": "1 h"}}],
                "state": {"process": {"key": ["u"], "function": "m:f"}},
            }
        )
    chained = FlowSpec.model_validate(
        {
            **base,
            "transforms": [{"dedup": {"key": ["id"], "within": "1 h"}}],
            "state": {"aggregate": {"key": ["u"], "values": {"n": "count(*)"}}},
        }
    )
    assert chained.transforms[0].dedup is not None and chained.state is not None  # split by the job (flow_chain)


def _dedup_runner(root, restore: str = "latest"):
    from pipeline_lib.samples import spend_job_spec
    from pipeline_lib.spec import parse_spec
    from tests.commit_harness import TOPIC, new_attempt

    spec = spend_job_spec("job", TOPIC, f"file://{root}/out", f"file://{root}/ckpt")
    del spec["state"]
    spec["transforms"] = [{"dedup": {"key": ["user"], "within": "10 seconds"}}]
    spec["checkpoint"]["key_groups_per_state_file"] = 128  # one span: expired keys share it with live ones
    return new_attempt(parse_spec(spec), restore)


def _commit(runner, rows: pa.Table, history: list, version):
    from pipeline_lib.execution.runtime.runner_types import EpochRead
    from pipeline_lib.execution.state.process_state import ProcessInput

    epoch = history[0].epoch + 1 if history else 1
    base = history[0].snapshot_id if history else None
    plan = runner.plan(epoch, base, {0: (epoch - 1) * 10, 1: 0}, {0: epoch * 10, 1: 0}, None)
    read = EpochRead(plan, None, {flow.spec.name: ProcessInput(rows, epoch) for flow in runner.flows})
    _, head, version = runner.run_epoch(read, history, version)
    return head.history, version


def test_keys_past_their_ttl_leave_the_snapshot_and_a_restore(tmp_path):
    """Dedup's keys a and b expire in epoch 2 while c arrives in the same span: the span is
    written whole (a delta of c would leave a and b in its base), so a restore holds c alone
    and lets a through again."""
    runner = _dedup_runner(tmp_path)
    history, version = _commit(runner, _rows(["a", "b"], [1, 2], clock=1_000), [], None)
    history, version = _commit(runner, _rows(["c"], [3], clock=20_000), history, version)
    restored = _dedup_runner(tmp_path)
    state = restored.flows[0].state
    assert isinstance(state, ProcessState) and len(state) == 1 and state.stored(("c",)) is not None
    _, out, _ = state.process(_rows(["a", "c"], [4, 5], clock=21_000), epoch=3)
    assert out.column("user").to_pylist() == ["a"]
    written = read_table(f"file://{tmp_path}/out", ConnectionSettings())
    assert sorted(r["user"] for r in written) == ["a", "b", "c"]  # each row in one subtask's part


def test_a_stored_key_without_a_state_is_refused():
    state = _totals()
    with pytest.raises(PipelineError, match="stored without a state"):
        state.load(pa.table({"user": ["a"], "_state": pa.array([None], pa.string())}))


def _clears(key: tuple, rows: pa.Table, state) -> None:
    state.clear()


def test_an_owner_writes_a_span_that_lost_a_key_whole_not_as_a_delta():
    from pipeline_lib.checkpoint.state_spans import SpanWrites
    from pipeline_lib.execution.state.process_owner import whole_where_dropped

    state = ProcessState(ProcessSpec(key=["user"], function="m:f"), 16, _clears)
    state.load(pa.table({"user": ["a", "b"], "_state": ['{"u":0,"v":{"x":1}}', '{"u":0,"v":{"x":2}}']}))
    state.process(_rows(["a"], [1]), epoch=2)
    group = int(state.key_groups(np.array([0]))[0])
    span, other = (group, group + 1), (group + 1, group + 2)
    writes = SpanWrites(bases=frozenset(), deltas={span: "ref", other: "ref2"}, kept={})  # type: ignore[dict-item]
    after = whole_where_dropped(writes, state, 1, 16)
    assert after.bases == {span} and set(after.deltas) == {other}


def test_validate_says_hooks_must_be_stateless_and_points_to_process_functions(tmp_path):
    from tests.unit.test_cli_errors import invoke, write_spec

    result = invoke(["validate", str(write_spec(tmp_path, transforms=[{"python": "tests.hooks_example:add_cents"}]))])
    assert result.exit_code == 0, result.output
    assert "tests.hooks_example:add_cents) must be stateless" in " ".join(result.output.split())
    assert "state.process" in result.output
