"""The spec of a stream join followed by transforms and an aggregate: split into the join's stage
``<flow>-join`` and the flow reading it (spec.flow_chain); a python hook, a dedup or a windowed
aggregate after the join is refused, naming the join (a left row without a match comes out when
the watermark passes its window, too late for an event-time window of its own)."""

from __future__ import annotations

import pytest

from tests.e2e.test_stream_join_aggregate import AGGREGATE, aggregate_spec


@pytest.mark.unit
def test_a_join_followed_by_a_python_hook_or_a_windowed_aggregate_is_refused_naming_the_join():
    from pipeline_lib.spec.models import JobSpec

    spec = aggregate_spec("refused")
    spec["transforms"] = spec["transforms"][:1] + [{"python": "tests.hooks_example:explode"}]
    with pytest.raises(ValueError, match="followed by stateless transforms"):
        JobSpec.model_validate(spec)
    windowed = aggregate_spec("refused")
    windowed["state"] = {"aggregate": {**AGGREGATE["aggregate"], "window": {"column": "ts", "size": "1 hour"}}}
    windowed["transforms"][1]["select"].append("ts")
    with pytest.raises(ValueError, match="followed by stateless transforms"):
        JobSpec.model_validate(windowed)
    flows = JobSpec.model_validate(aggregate_spec("split")).all_flows()
    assert [f.name for f in flows] == ["split-join", "split"]
    assert flows[0].state is not None and flows[0].state.process is not None
    assert flows[0].state.process.stream_join is not None and flows[1].after == "split-join"
