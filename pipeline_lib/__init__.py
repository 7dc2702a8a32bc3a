"""Stream and batch pipelines that survive failure.

The package follows the data's way through the system:
``spec`` (YAML → validated models) → ``plan`` (offset ranges per epoch, key groups)
→ ``execution`` (Spark reads, transforms, keyed state) → ``sink`` (epoch files)
→ ``checkpoint`` (manifests, head pointer, restore) on top of ``storage`` (S3 / local dir).
``localstack`` runs the embedded broker + S3 server for laptops and tests.

The Python API (docs/python-api.md) is importable from here: ``load_spec``, ``job_from_dict``,
``run_job``, ``read_table``, and the ``RunSummary`` and ``PipelineRun`` a run returns; the
in-memory test runner is ``pipeline_lib.testing``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name and the module of pipeline_lib.api that defines it. ``import pipeline_lib``
# stays cheap (every layer imports it for __version__; a Python worker unpickling a spec must not
# load Spark): a name is imported on first use, by importlib, so that the package root itself
# depends on nothing of the library.
_PUBLIC = {
    "load_spec": "pipeline_lib.api.specs",
    "job_from_dict": "pipeline_lib.api.specs",
    "JobSpec": "pipeline_lib.api.specs",
    "run_job": "pipeline_lib.api.run",
    "RunSummary": "pipeline_lib.api.summary",
    "PipelineRun": "pipeline_lib.api.summary",
    "read_table": "pipeline_lib.api.tables",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    """The public names of pipeline_lib.api on first use (``from pipeline_lib import run_job``)."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported public ones included (for completion in a REPL)."""
    return sorted({*globals(), *_PUBLIC})
