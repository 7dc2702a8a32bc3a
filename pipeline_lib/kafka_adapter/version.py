"""The kafka-python releases this adapter was tested with, checked when it is imported.

The adapter leans on kafka-python's internals (private attributes, the fetcher's per-partition
records, the record batch classes), which a release may change without notice. A release the
adapter was not tested with fails at import, naming what is installed, what is supported and
what to do, instead of failing in the middle of a read in a way that looks like bad data.
"""

from __future__ import annotations

from pipeline_lib.errors import PipelineError

# kafka-python releases every test of tests/unit/test_kafka_adapter.py passed with.
TESTED_VERSIONS = ("3.0.12",)


class KafkaPythonVersionError(PipelineError, ImportError):
    """The installed kafka-python is not one the adapter was tested with."""


def check_version(installed: str) -> None:
    """Raise KafkaPythonVersionError unless ``installed`` is one of TESTED_VERSIONS."""
    if installed in TESTED_VERSIONS:  # guard: kafka-python-version-unchecked
        return
    raise KafkaPythonVersionError(
        f"kafka-python {installed} is installed, but pipeline_lib's Kafka adapter (pipeline_lib/kafka_adapter) "
        f"was tested with kafka-python {', '.join(TESTED_VERSIONS)} only: it relies on that release's internals. "
        f"Install a tested release (pip install 'kafka-python=={TESTED_VERSIONS[-1]}', as pyproject.toml and "
        "docker/constraints.txt pin it); to move to another release, run tests/unit/test_kafka_adapter.py with it, "
        "fix pipeline_lib/kafka_adapter until every test passes, then add the release to TESTED_VERSIONS."
    )


def check_installed() -> None:
    """Check the kafka-python that ``import kafka`` finds (its own ``__version__``)."""
    import kafka

    check_version(kafka.__version__)
