"""kafka-python's internals stay inside pipeline_lib.kafka_adapter: a static check of the library's
imports, so that the adapter's tests (tests/unit/test_kafka_adapter.py, one per internal) cover
every internal the library relies on."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline_lib.kafka_adapter as adapter


def test_no_module_outside_the_adapter_imports_kafka_python_internals():
    """Only kafka_adapter may import kafka-python's internal modules; the rest uses its public API
    (``kafka``, ``kafka.errors``, ``kafka.admin``, ``kafka.structs``), so an upgrade's breakage is
    found by tests/unit/test_kafka_adapter.py, not in a job."""
    public = {"kafka", "kafka.errors", "kafka.admin", "kafka.structs"}
    root = Path(adapter.__file__).parents[1]
    offenders = []
    for path in root.rglob("*.py"):
        if "kafka_adapter" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            offenders += [
                f"{path.relative_to(root)}: {n}"
                for n in names
                if (n == "kafka" or n.startswith("kafka.")) and n not in public
            ]
    assert offenders == []
