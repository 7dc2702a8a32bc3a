"""The Avro schema of a Kafka sink with ``format: avro``, read on the driver.

The driver reads the ``.avsc`` file once, when the pipeline starts, and sends its text with each
writer task (a few hundred bytes, whatever the rows): executors of a cluster need no copy of the
file. A schema fastavro cannot parse, or one that is not a record (a row is a record of its
columns), fails the start naming the flow and the file.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.errors import PipelineError


def avro_schema_text(flow: str, path: str) -> str:
    """The schema of ``flow``'s Kafka sink, read from ``path`` and checked, as compact JSON."""
    import fastavro  # loads for an Avro Kafka sink only, not at every run's start

    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
        fastavro.parse_schema(schema)
    except (OSError, ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as error:
        raise PipelineError(f"flow {flow}: sink.kafka.schema {path!r} is not a readable Avro schema: {error}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise PipelineError(f"flow {flow}: sink.kafka.schema {path!r} must be an Avro record (one field per column)")
    return json.dumps(schema, separators=(",", ":"))
