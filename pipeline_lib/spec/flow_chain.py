"""A flow with ``dedup`` (or a stream join) followed by transforms and an aggregate, run as two
flows of one pipeline.

``transforms: [..., dedup, join, ...]`` with ``state.aggregate`` becomes a **stage** flow
``<flow>-dedup`` (the transforms up to the dedup, the dedup as its process state) and the flow
itself (the transforms after the dedup, the aggregate), which reads the stage's rows of each epoch
instead of the source's (``FlowSpec.after``). Both keep their keyed state in the pipeline's
snapshots, committed together: exactly once across restarts, rescaled, verified and repaired like
any flow. A stream join (``- join: {stream: ...}``) splits the same way into ``<flow>-join``,
whose rows are the join's matches. The stage writes no rows: its sink (under the checkpoint
store, ``stages/<flow>``) holds only each epoch's commit marker.
"""

from __future__ import annotations

from pipeline_lib.spec.flow_spec import FlowSpec
from pipeline_lib.spec.sink_spec import FilesSinkSpec, SinkSpec
from pipeline_lib.spec.stream_join_spec import is_stream_join

STAGE_SUFFIX = "-dedup"
JOIN_STAGE_SUFFIX = "-join"


def stage_name(flow: str, suffix: str = STAGE_SUFFIX) -> str:
    """The stage's flow name (within the 63 characters of a flow's name)."""
    return flow[: 63 - len(suffix)] + suffix


def split_chain(flow: FlowSpec, store: str) -> list[FlowSpec]:
    """``[flow]``, or for a dedup or stream join followed by an aggregate ``[stage, flow reading
    the stage]``."""
    at = next((i for i, t in enumerate(flow.transforms) if t.dedup is not None or is_stream_join(t)), None)
    if at is None:
        return [flow]
    suffix = JOIN_STAGE_SUFFIX if is_stream_join(flow.transforms[at]) else STAGE_SUFFIX
    sink = SinkSpec(files=FilesSinkSpec(path=f"{store.rstrip('/')}/stages/{flow.name}", format="parquet"))
    stage = FlowSpec(
        name=stage_name(flow.name, suffix), source=flow.source, transforms=flow.transforms[: at + 1], sink=sink
    )
    main = FlowSpec(
        name=flow.name, source=flow.source, transforms=flow.transforms[at + 1 :], state=flow.state, sink=flow.sink
    )
    main._after = stage.name
    return [stage, main]
