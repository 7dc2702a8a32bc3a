"""The one place the library touches kafka-python's internals.

kafka-python's public API cannot do what the library needs: decode a fetch's record batches into
columns (kafka_batches, batch_consumer), bound what a reader fetches, keep a fetch's last stable
offset, ask for one topic's metadata at once, close what a failed constructor started. Every use
of a private member or an internal module is a named function of this package, and each has its
test in tests/unit/test_kafka_adapter.py, run against the installed kafka-python: an upgrade that
breaks one fails a test named after it. The rest of the library calls these functions and uses
kafka-python's public API only (``KafkaConsumer``, ``TopicPartition``, ``kafka.errors``).

Importing the package checks the installed kafka-python is a release it was tested with
(version.TESTED_VERSIONS), before any internal is imported.
"""

from __future__ import annotations

from pipeline_lib.kafka_adapter.version import TESTED_VERSIONS, KafkaPythonVersionError, check_installed

check_installed()

from pipeline_lib.kafka_adapter.clients import (  # noqa: E402  (after the version check)
    apply_auto_create_setting,
    close_started,
    known_partitions,
    refresh_topic_metadata,
    topic_id,
)
from pipeline_lib.kafka_adapter.fetching import (  # noqa: E402
    FetchedPartition,
    bound_fetches_below,
    drop_fetched_records,
    fetch_below,
    fetch_reader,
    keep_last_stable_offsets,
    last_stable_offset,
    partition_records_type,
    read_fetches_with,
)
from pipeline_lib.kafka_adapter.partitioning import key_partition  # noqa: E402
from pipeline_lib.kafka_adapter.record_batches import (  # noqa: E402
    LOG_APPEND_TIME,
    DefaultRecordBatch,
    LegacyRecordBatch,
    batch_bytes,
    records_bytes,
    set_legacy_messages,
)

__all__ = [
    "LOG_APPEND_TIME",
    "TESTED_VERSIONS",
    "DefaultRecordBatch",
    "FetchedPartition",
    "KafkaPythonVersionError",
    "LegacyRecordBatch",
    "apply_auto_create_setting",
    "batch_bytes",
    "bound_fetches_below",
    "close_started",
    "drop_fetched_records",
    "fetch_below",
    "fetch_reader",
    "keep_last_stable_offsets",
    "key_partition",
    "known_partitions",
    "last_stable_offset",
    "partition_records_type",
    "read_fetches_with",
    "records_bytes",
    "refresh_topic_metadata",
    "set_legacy_messages",
    "topic_id",
]
