"""A flow with ``dedup`` followed by transforms and an aggregate, run as two flows of one pipeline.

``transforms: [..., dedup, join, ...]`` with ``state.aggregate`` becomes a **stage** flow
``<flow>-dedup`` (the transforms up to the dedup, the dedup as its process state) and the flow
itself (the transforms after the dedup, the aggregate), which reads the stage's rows of each epoch
instead of the source's (``FlowSpec.after``). Both keep their keyed state in the pipeline's
snapshots, committed together: exactly once across restarts, rescaled, verified and repaired like
any flow. The stage writes no rows: its sink (under the checkpoint store, ``stages/<flow>``) holds
only each epoch's commit marker.
"""

from __future__ import annotations

from pipeline_lib.spec.flow_spec import FilesSinkSpec, FlowSpec, SinkSpec

STAGE_SUFFIX = "-dedup"


def stage_name(flow: str) -> str:
    """The dedup stage's flow name (within the 63 characters of a flow's name)."""
    return flow[: 63 - len(STAGE_SUFFIX)] + STAGE_SUFFIX


def split_chain(flow: FlowSpec, store: str) -> list[FlowSpec]:
    """``[flow]``, or for a dedup followed by an aggregate ``[stage, flow reading the stage]``."""
    at = next((i for i, t in enumerate(flow.transforms) if t.dedup is not None), None)
    if at is None:
        return [flow]
    sink = SinkSpec(files=FilesSinkSpec(path=f"{store.rstrip('/')}/stages/{flow.name}", format="parquet"))
    stage = FlowSpec(name=stage_name(flow.name), source=flow.source, transforms=flow.transforms[: at + 1], sink=sink)
    main = FlowSpec(
        name=flow.name, source=flow.source, transforms=flow.transforms[at + 1 :], state=flow.state, sink=flow.sink
    )
    main._after = stage.name
    return [stage, main]
