"""The Spark SQL path's half of ``on_late: dead_letter``: a flow's rows after its transforms,
those that may be late (event time behind the watermark) handed to the tasks' ``LateLetters``,
which judge them with the Arrow path's own rule and write their dead letters (late_letters)."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from pipeline_lib.errors import PipelineError
from pipeline_lib.execution.engine.arrow_fit import large_var_types
from pipeline_lib.execution.engine.late_letters import EVENT_MS, LETTER_COLUMNS, LateLetters, LateRoute
from pipeline_lib.sink.task_parts import WRITTEN_DDL, WrittenParts, collected


def arrow_schema_of(spark, frame: DataFrame) -> pa.Schema:
    """The Arrow schema of ``frame``'s rows, as the Arrow path casts its parts (bad records' schema)."""
    return to_arrow_schema(frame.schema, timezone="UTC", prefers_large_types=large_var_types(spark))


def late_letters(rows: DataFrame, route: LateRoute, schema: pa.Schema | None, where: str = "") -> WrittenParts:
    """Write the late records of ``rows`` (a flow's rows after its transforms) as dead letters,
    in the tasks; what they wrote. The transforms must keep the columns that name a record."""
    missing = [c for c in LETTER_COLUMNS if c not in rows.columns]
    if missing:
        raise PipelineError(
            f"{where}on_late: dead_letter names each late record by {', '.join(LETTER_COLUMNS)}, and the "
            f"transforms dropped {', '.join(missing)}: keep them in the select"
        )
    column = F.col(route.column)
    event = F.floor(F.unix_micros(column.cast("timestamp")) / 1000).cast("long")
    behind = (
        rows.where(column.isNotNull())
        .select(*LETTER_COLUMNS, event.alias(EVENT_MS))
        .where(F.col(EVENT_MS) < F.lit(route.watermark_ms))  # a late record's event time is behind it
    )
    return collected(behind.mapInArrow(LateLetters(route, schema), WRITTEN_DDL).toArrow())
