"""The mergeable sketches of ``approx_count_distinct`` (an Apache DataSketches HLL sketch) and
``approx_percentile`` (a DataSketches KLL sketch of doubles), kept serialized (bytes) as a key's
partial and running value. One set of functions for every place a partial is made or merged (a
worker's batch, a Spark SQL group, the driver's state), so both paths build the same bytes from
the same values; the size of a sketch is bounded by its parameters, not by the records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from datasketches import hll_sketch, hll_union, kll_doubles_sketch, tgt_hll_type

from pipeline_lib.errors import PipelineError

# HLL with 2**12 buckets: relative standard error 1.04 / sqrt(4096) ≈ 1.6% (Spark's
# hll_sketch_agg default). Serialized as HLL_8 (one byte a bucket: 4 KiB at most per key).
HLL_LG_K = 12
HLL_RSE = 1.04 / math.sqrt(2**HLL_LG_K)
# KLL with k = 200: the rank of the value a quantile query returns is within 1.33% of q with
# 99% confidence (DataSketches' single-sided normalized rank error for k = 200).
KLL_K = 200
KLL_RANK_ERROR = kll_doubles_sketch.get_normalized_rank_error(KLL_K, False)

SKETCH_FUNCTIONS = ("approx_count_distinct", "approx_percentile")


def _hll_value(value: object, where: str) -> int | float | str:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float | str):
        return value
    raise PipelineError(
        f"{where}: values of type {type(value).__name__} are not supported; "
        "use an integer, floating-point or string column (cast it in a transform)"
    )


def hll_of(values: Iterable[object], where: str = "approx_count_distinct") -> bytes | None:
    """The HLL sketch of ``values`` (nulls skipped), serialized; None when there are none."""
    sketch, seen = hll_sketch(HLL_LG_K, tgt_hll_type.HLL_8), False
    for value in values:
        if value is not None:
            sketch.update(_hll_value(value, where))
            seen = True
    return sketch.serialize_compact() if seen else None


def hll_merge(sketches: Sequence[bytes | None]) -> bytes | None:
    """The union of serialized HLL sketches (None: no values on that side)."""
    present = [s for s in sketches if s is not None]
    if len(present) <= 1:
        return present[0] if present else None
    union = hll_union(HLL_LG_K)
    for data in present:
        union.update(hll_sketch.deserialize(data))
    return union.get_result(tgt_hll_type.HLL_8).serialize_compact()


def hll_estimate(data: bytes | None) -> int:
    """The distinct count a serialized HLL sketch estimates (0 for no values, as Spark's)."""
    return 0 if data is None else int(round(hll_sketch.deserialize(data).get_estimate()))


def kll_of(values: Iterable[object], where: str = "approx_percentile") -> bytes | None:
    """The KLL sketch of ``values`` as doubles (nulls and NaN skipped), serialized; None when none."""
    sketch = kll_doubles_sketch(KLL_K)
    for value in values:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PipelineError(f"{where}: values of type {type(value).__name__} are not numbers")
        if value == value:
            sketch.update(float(value))
    return None if sketch.is_empty() else sketch.serialize()


def kll_merge(sketches: Sequence[bytes | None]) -> bytes | None:
    """The merge of serialized KLL sketches (None: no values on that side)."""
    present = [s for s in sketches if s is not None]
    if len(present) <= 1:
        return present[0] if present else None
    merged = kll_doubles_sketch.deserialize(present[0])
    for data in present[1:]:
        merged.merge(kll_doubles_sketch.deserialize(data))
    return merged.serialize()


def kll_quantile(data: bytes | None, q: float) -> float | None:
    """The smallest value whose inclusive rank is at least ``q`` (Spark's percentile_approx
    definition; exact while the sketch holds every value), None for no values."""
    return None if data is None else kll_doubles_sketch.deserialize(data).get_quantile(q, True)


def sketch_of(fn: str, values: Iterable[object], where: str) -> bytes | None:
    """The partial of sketch function ``fn`` over one group's values."""
    return hll_of(values, where) if fn == "approx_count_distinct" else kll_of(values, where)


def sketch_merge(fn: str, sketches: Sequence[bytes | None]) -> bytes | None:
    """The merge of partials of sketch function ``fn``."""
    return hll_merge(sketches) if fn == "approx_count_distinct" else kll_merge(sketches)
