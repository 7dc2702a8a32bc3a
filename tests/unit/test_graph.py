"""Execution graph and pipelines: connected parts, topological order, subtasks."""

import copy

import pytest

from pipeline_lib.errors import SpecError
from pipeline_lib.graph import build_graph
from pipeline_lib.spec import parse_spec

SCHEMA = "user string, amount long"
MULTI = {
    "name": "shop",
    "sources": {
        "payments": {"kafka": {"topic": "payments", "schema": SCHEMA}},
        "refunds": {"kafka": {"topic": "refunds", "schema": SCHEMA, "stop": "latest"}},
    },
    "flows": [
        {
            "name": "spend",
            "source": "payments",
            "state": {"aggregate": {"key": ["user"], "values": {"total": "sum(amount)"}}},
            "sink": {"files": {"path": "s3://results/spend"}},
        },
        {
            "name": "raw",
            "source": "payments",
            "transforms": [{"filter": "amount > 1"}, {"select": ["user"]}],
            "sink": {"files": {"path": "s3://results/raw"}},
        },
        {"name": "refunds-out", "source": "refunds", "sink": {"files": {"path": "s3://results/refunds"}}},
    ],
    "checkpoint": {"store": "s3://checkpoints/shop"},
    "parallelism": 3,
}


def test_two_sources_give_two_pipelines_in_topological_order():
    graph = build_graph(parse_spec(MULTI))
    pipelines = graph.pipelines()
    assert [p.name for p in pipelines] == ["payments", "refunds"]
    assert pipelines[0].flows == ("spend", "raw")
    assert [v.id for v in pipelines[0].vertices] == [
        "source:payments",
        "flow:spend/state",
        "flow:spend/sink",
        "flow:raw/transform0",
        "flow:raw/transform1",
        "flow:raw/sink",
    ]
    assert [v.id for v in pipelines[1].vertices] == ["source:refunds", "flow:refunds-out/sink"]
    assert sum(v.parallelism for v in graph.vertices.values()) == 8 * 3
    assert graph.vertices["flow:spend/state"].subtasks() == [f"flow:spend/state#{i}" for i in range(3)]


def test_parallelism_override_and_single_flow_form():
    single = {
        "name": "one",
        "source": {"kafka": {"topic": "t", "schema": SCHEMA}},
        "sink": {"files": {"path": "file:///tmp/one"}},
        "checkpoint": {"store": "file:///tmp/ck"},
    }
    graph = build_graph(parse_spec(single), parallelism=5)
    (pipeline,) = graph.pipelines()
    assert pipeline.name == "main" and pipeline.flows == ("one",)
    assert all(v.parallelism == 5 for v in pipeline.vertices)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda s: s["flows"][2].update(source="nope"), "source 'nope' is not defined"),
        (lambda s: s["flows"][1].update(name="spend"), "flow names repeat"),
        (lambda s: s["flows"].pop(2), "sources ['refunds'] feed no flow"),
        (lambda s: s["flows"][1]["sink"]["files"].update(path="s3://results/spend"), "also used by flow spend"),
        (
            lambda s: s.update(source={"kafka": {"topic": "x", "schema": SCHEMA}}),
            "either source/transforms/state/sink or sources/flows",
        ),
        (lambda s: s["sources"]["refunds"]["kafka"].update(stop={"0": -1}), "sources.refunds.kafka.stop"),
    ],
)
def test_bad_multi_flow_specs_are_rejected(change, message):
    spec = copy.deepcopy(MULTI)
    change(spec)
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(spec)
