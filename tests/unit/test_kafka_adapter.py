"""Each kafka-python internal the adapter (pipeline_lib.kafka_adapter) relies on, exercised against
the installed kafka-python: an upgrade that moves, renames or changes one fails the test named
after it, before any read goes wrong. No broker: batches come from kafka-python's own builders,
fetch responses are built from its protocol classes, and consumers are made with ``api_version``
set, which skips the bootstrap.
"""

from __future__ import annotations

import gzip
import inspect
import struct
import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import CompletedFetch, Fetcher
from kafka.errors import CorruptRecordError, KafkaTimeoutError
from kafka.protocol.consumer import FetchResponse, IsolationLevel
from kafka.protocol.metadata import MetadataResponse
from kafka.record.default_records import DefaultRecordBatch
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords

import pipeline_lib.kafka_adapter as adapter
from pipeline_lib.kafka_adapter import version
from tests.unit.test_kafka_batches import build
from tests.unit.test_transactional_batches import ABORT, COMMIT, Aborted, _batch, _marker

TP = TopicPartition("t", 0)
OFFLINE = {"bootstrap_servers": "127.0.0.1:1", "api_version": (2, 8), "request_timeout_ms": 2000}


@pytest.fixture
def consumer():
    """A KafkaConsumer that never connects (``api_version`` given: no bootstrap), assigned t[0] at 0."""
    made = KafkaConsumer(**OFFLINE)
    made.assign([TP])
    made.seek(TP, 0)
    yield made
    made.close()


def _fetch(consumer: KafkaConsumer, records: bytes, high_watermark: int = 5, last_stable_offset: int = 3):
    """What the consumer's fetcher makes of a fetch response for t[0] at offset 0 (Fetcher._parse_fetched_data)."""
    data = FetchResponse.FetchableTopicResponse.PartitionData(
        version=12,
        partition_index=0,
        error_code=0,
        high_watermark=high_watermark,
        last_stable_offset=last_stable_offset,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=records,
    )
    return consumer._fetcher._parse_fetched_data(CompletedFetch(TP, 0, 12, data, None))


# -- the version check -----------------------------------------------------------------------------------------


def test_the_installed_kafka_python_is_a_tested_release():
    import kafka

    assert kafka.__version__ in version.TESTED_VERSIONS
    version.check_installed()


def test_an_untested_release_fails_naming_installed_and_supported_releases_and_what_to_do():
    with pytest.raises(ImportError) as refused:
        version.check_version("99.0.0")
    message = str(refused.value)
    assert "kafka-python 99.0.0 is installed" in message
    assert all(tested in message for tested in version.TESTED_VERSIONS)
    assert "pip install 'kafka-python==" in message and "tests/unit/test_kafka_adapter.py" in message
    assert isinstance(refused.value, adapter.KafkaPythonVersionError)


def test_importing_the_adapter_checks_the_installed_release(monkeypatch):
    import importlib

    import kafka

    monkeypatch.setattr(kafka, "__version__", "3.0.13")
    with pytest.raises(adapter.KafkaPythonVersionError, match="kafka-python 3.0.13 is installed"):
        importlib.reload(adapter)
    monkeypatch.undo()
    importlib.reload(adapter)


# -- record batches (kafka.record) -----------------------------------------------------------------------------


def test_batch_bytes_is_the_whole_v2_batch_and_the_whole_legacy_set():
    """DefaultRecordBatch._buffer and LegacyRecordBatch._buffer hold the batch as fetched, header included."""
    v2 = build([(0, 5, b"k", b"v", [])], base_offset=7)
    assert bytes(adapter.batch_bytes(DefaultRecordBatch(v2))) == v2
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    builder.append(0, timestamp=9, key=b"k", value=b"v")
    legacy = bytes(builder.build())
    assert bytes(adapter.batch_bytes(LegacyRecordBatch(legacy, 1))) == legacy


@pytest.mark.parametrize("compression", [0, 1], ids=["plain", "gzip"])
def test_records_bytes_is_the_v2_records_section_after_the_header(compression):
    """DefaultRecordBatch._buffer[_pos:]: the (compressed) records, which kafka-python decodes the same way."""
    records = [(i, 5 + i, b"k%d" % i, b"value-%d" % i + b"x" * 200, []) for i in range(3)]
    data = build(records, compression=compression)
    assert DefaultRecordBatch(data).compression_type == compression
    section = bytes(adapter.records_bytes(DefaultRecordBatch(data)))
    header = DefaultRecordBatch.HEADER_STRUCT.size
    assert section == data[header:]
    plain = gzip.decompress(section) if compression else section
    assert plain == build(records)[header:]  # the same records, uncompressed
    assert [r.value for r in DefaultRecordBatch(data)] == [r[3] for r in records]


def test_set_legacy_messages_makes_a_compressed_set_iterate_over_the_given_inner_messages():
    """LegacyRecordBatch._buffer replaced and _decompressed set: kafka-python iterates over those
    messages and does not decompress the wrapper itself."""
    wrapper = LegacyRecordBatchBuilder(magic=1, compression_type=1, batch_size=1 << 20)
    for i in range(2):
        wrapper.append(i, timestamp=9, key=None, value=b"compressed-%d" % i)
    inner = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(2):
        inner.append(i, timestamp=9, key=None, value=b"given-%d" % i)
    batch = LegacyRecordBatch(bytes(wrapper.build()), 1)
    assert batch.compression_type == 1
    adapter.set_legacy_messages(batch, bytes(inner.build()))
    assert [r.value for r in batch] == [b"given-0", b"given-1"]


def test_next_batch_names_the_offset_of_a_batch_whose_header_cannot_be_read():
    """MemoryRecords._next_slice: the batch next_batch is about to frame, whose first 8 bytes are its offset."""
    first, second = build([(0, 5, None, b"a", [])], base_offset=0), build([(0, 5, None, b"b", [])], base_offset=1)
    cut = bytearray(second[:30])  # shorter than a v2 header, framed as a batch of 30 bytes
    struct.pack_into(">i", cut, 8, len(cut) - LegacyRecordBatch.LOG_OVERHEAD)
    records = MemoryRecords(first + bytes(cut))
    assert adapter.record_batches.next_batch(TP, records).base_offset == 0
    with pytest.raises(CorruptRecordError, match=r"t\[0\]: batch at offset 1 cannot be read: "):
        adapter.record_batches.next_batch(TP, records)
    assert adapter.record_batches.next_batch(TP, MemoryRecords(first + second)).base_offset == 0


def test_log_append_time_is_the_timestamp_type_of_a_batch_with_the_broker_s_time():
    data = build([(0, 5, None, b"a", [])], log_append_time=True)
    assert DefaultRecordBatch(data).timestamp_type == adapter.LOG_APPEND_TIME == 1


# -- the fetcher's per-partition records (kafka.consumer.fetcher) ------------------------------------------------


def test_a_reader_s_yields_are_what_a_poll_takes_and_nothing_is_skipped_by_offset():
    """Fetcher.PartitionRecords calls _unpack_records(tp, records, key_deserializer, value_deserializer)
    lazily, drops what _maybe_skip_record says (here nothing: the items have no offset), and take()
    returns the rest."""
    seen = []

    def reader(fetched):
        seen.append(fetched.tp)
        yield from ("a", "b")

    records = adapter.partition_records_type(reader)(0, TP, MemoryRecords(b""))
    assert seen == []  # not read before the poll takes it
    assert records.take(1) == ["a"] and records.take() == ["b"] and seen == [TP]


def test_a_fetched_partition_reads_and_writes_the_fetch_s_bookkeeping():
    """fetch_offset, next_fetch_offset, records_read, bytes_read, leader_epoch, check_crcs,
    isolation_level and drain() of Fetcher.PartitionRecords, as the adapter names them."""
    got = {}

    def reader(fetched):
        got.update(
            fetch_offset=fetched.fetch_offset,
            next=fetched.next_fetch_offset,
            crcs=fetched.check_crcs,
            committed=fetched.read_committed,
        )
        batch = fetched.next_batch()
        fetched.set_leader_epoch(batch.leader_epoch)
        fetched.next_fetch_offset = 12
        fetched.count_read(3, 100)
        yield "chunk"
        assert fetched.next_batch() is None
        fetched.drain()

    records = adapter.partition_records_type(reader)(
        4,
        TP,
        MemoryRecords(build([(0, 5, None, b"a", [])], base_offset=4)),
        check_crcs=False,
        isolation_level=IsolationLevel.READ_COMMITTED,
    )
    assert records.take() == ["chunk"]
    assert got == {"fetch_offset": 4, "next": 4, "crcs": False, "committed": True}
    assert records.next_fetch_offset == 12 and records.records_read == 3 and records.bytes_read == 100
    assert records.leader_epoch == DefaultRecordBatch(build([(0, 5, None, b"a", [])])).leader_epoch
    assert not records  # drained: kafka-python may fetch the partition again
    assert isinstance(Fetcher.PartitionRecords(0, TP, MemoryRecords(b"")).leader_epoch, int)


def test_aborted_follows_the_fetch_s_aborted_transactions_and_the_abort_marker():
    """_consume_aborted_transactions_up_to, aborted_producer_ids and _is_batch_aborted: producer 8's
    transaction from offset 3 is aborted until its ABORT marker; producer 7's is not."""
    log = [
        _batch(0, 7, [b"A0"]),
        _marker(1, 7, COMMIT),
        _batch(3, 8, [b"B0"]),
        _marker(4, 8, ABORT),
        _batch(5, 8, [b"B5"]),
    ]
    answers = []

    def reader(fetched):
        while (batch := fetched.next_batch()) is not None:
            answers.append(fetched.aborted(batch, lambda tp, marker: next(marker).abort))
        yield from ()

    records = adapter.partition_records_type(reader)(
        0,
        TP,
        MemoryRecords(b"".join(log)),
        isolation_level=IsolationLevel.READ_COMMITTED,
        aborted_transactions=[Aborted(8, 3)],
    )
    assert records.take() == []
    assert answers == [False, False, True, False, False]  # markers are never "aborted" batches


def test_read_fetches_with_gives_a_consumer_s_fetched_partitions_to_the_reader(consumer):
    """The fetcher builds each fetched partition from its PartitionRecords attribute (Fetcher._parse_fetched_data)."""
    reading = []

    def reader(fetched):
        reading.append(fetched)
        yield ("batch at", fetched.next_batch().base_offset)

    adapter.read_fetches_with(consumer, reader)
    assert adapter.fetch_reader(consumer) is reader
    assert _fetch(consumer, build([(0, 5, None, b"a", [])])).take() == [("batch at", 0)]
    assert len(reading) == 1


def test_keep_last_stable_offsets_keeps_what_a_fetch_response_reports(consumer):
    """Fetcher._parse_fetched_data(completed_fetch), wrapped: the partition data's error_code and last_stable_offset."""
    assert adapter.last_stable_offset(consumer, TP) is None
    adapter.keep_last_stable_offsets(consumer)
    _fetch(consumer, b"", last_stable_offset=3)
    assert adapter.last_stable_offset(consumer, TP) == 3
    assert consumer.highwater(TP) == 5


def test_drop_fetched_records_reads_nothing_and_keeps_the_watermark(consumer):
    adapter.drop_fetched_records(consumer)
    corrupt = bytearray(build([(0, 5, None, b"a", [])]))
    corrupt[-1] ^= 1
    assert _fetch(consumer, bytes(corrupt), high_watermark=9).take() == []
    assert consumer.highwater(TP) == 9
    assert adapter.fetching.UnreadPartitionRecords(0, TP, MemoryRecords(bytes(corrupt))).take() == []


def test_bound_fetches_below_leaves_out_a_partition_at_or_past_its_bound(consumer):
    """Fetcher._fetchable_partitions (wrapped) and Fetcher._subscriptions.assignment[tp].position.offset."""
    adapter.bound_fetches_below(consumer)
    assert consumer._fetcher._fetchable_partitions() == [TP]
    adapter.fetch_below(consumer, TP, 1, 4096)
    assert consumer._fetcher._fetchable_partitions() == [TP]  # position 0 < 1
    consumer.seek(TP, 1)
    assert consumer._fetcher._fetchable_partitions() == []


def test_fetch_below_sets_the_partition_fetch_size_fetch_requests_read(consumer):
    """Fetcher.config['max_partition_fetch_bytes'] is read each time a fetch request is built."""
    adapter.bound_fetches_below(consumer)
    adapter.fetch_below(consumer, TP, 10, 4096)
    assert consumer._fetcher.config["max_partition_fetch_bytes"] == 4096
    assert "partition_max_bytes=self.config['max_partition_fetch_bytes']" in inspect.getsource(Fetcher)


# -- clients and metadata (kafka.client_async, kafka.cluster) -----------------------------------------------------


def test_close_started_closes_the_parts_a_constructor_starts():
    """A consumer's _client (its IO thread) and _metrics, a producer's _metrics: what kafka_clients
    closes when a constructor fails after starting them."""
    consumer = KafkaConsumer(**OFFLINE)
    assert all(callable(getattr(consumer, part).close) for part in adapter.clients.STARTED_PARTS)
    adapter.close_started(consumer)
    with pytest.raises(RuntimeError, match="closed"):  # its network loop is gone
        consumer._net.run(consumer._manager.wait_for, consumer._cluster.request_update(), 100)
    producer = KafkaProducer(**OFFLINE)
    try:
        assert callable(producer._metrics.close)
    finally:
        producer.close()
    adapter.close_started(object())  # a constructor that failed before starting anything


def test_apply_auto_create_setting_reaches_the_metadata_requests(consumer):
    """ClusterMetadata.config['allow_auto_create_topics'] is what its metadata requests carry."""
    consumer.config["allow_auto_create_topics"] = False
    consumer._client.cluster.add_topic("t")
    adapter.apply_auto_create_setting(consumer)
    assert consumer._client.cluster.metadata_request().allow_auto_topic_creation is False


def _metadata(topic_id: uuid.UUID) -> MetadataResponse:
    v = 10  # topic ids since v10 (KIP-516)
    topic = MetadataResponse.MetadataResponseTopic
    partition = topic.MetadataResponsePartition(
        version=v,
        error_code=0,
        partition_index=0,
        leader_id=0,
        leader_epoch=0,
        replica_nodes=[0],
        isr_nodes=[0],
        offline_replicas=[],
    )
    return MetadataResponse(
        version=v,
        throttle_time_ms=0,
        cluster_id="c",
        controller_id=0,
        brokers=[MetadataResponse.MetadataResponseBroker(version=v, node_id=0, host="h", port=1, rack=None)],
        topics=[topic(version=v, error_code=0, name="t", topic_id=topic_id, is_internal=False, partitions=[partition])],
    )


def test_known_partitions_and_topic_id_answer_from_the_consumer_s_metadata(consumer):
    """Consumer._cluster.partitions_for_topic and Consumer._client.cluster.topic_id (the same ClusterMetadata)."""
    assert adapter.known_partitions(consumer, "t") is None and adapter.topic_id(consumer, "t") is None
    made = uuid.uuid4()
    consumer._client.cluster.update_metadata(_metadata(made))
    assert adapter.known_partitions(consumer, "t") == {0}
    assert adapter.topic_id(consumer, "t") == made


@pytest.mark.parametrize("at_once", [True, False])
def test_refresh_topic_metadata_follows_the_topic_and_waits_for_the_answer(consumer, at_once):
    """ClusterMetadata.add_topic, _last_refresh_ms and request_update, waited for through
    Consumer._net.run(Consumer._manager.wait_for, future, timeout_ms): no broker answers here, so
    the wait ends in kafka-python's timeout."""
    cluster = consumer._cluster
    assert isinstance(cluster._last_refresh_ms, (int, float))
    with pytest.raises(KafkaTimeoutError):
        adapter.refresh_topic_metadata(consumer, "fresh", 200, at_once=at_once)
    assert "fresh" in cluster._topics


# -- login.py -------------------------------------------------------------------------------
def test_the_login_check_s_sasl_requests_encode_and_their_answers_parse():
    """A handshake and an authenticate request encode at the versions kafka_login uses, and a
    broker's handshake answer, framed as on the wire, parses back to its mechanisms."""
    from kafka.protocol.sasl import SaslHandshakeResponse

    from pipeline_lib.kafka_adapter.login import authenticate_request, handshake_request, sasl_mechanism, sasl_protocol
    from pipeline_lib.kafka_login import _SASL_AUTHENTICATE_VERSION, _SASL_HANDSHAKE_VERSION

    protocol = sasl_protocol("pipeline-lib-test")
    protocol.send_request(handshake_request("SCRAM-SHA-256", _SASL_HANDSHAKE_VERSION))
    sent = protocol.send_bytes()
    assert sent[4:6] == struct.pack(">h", 17) and b"SCRAM-SHA-256" in sent  # api key 17: SaslHandshake
    correlation = struct.unpack(">i", sent[8:12])[0]
    answer = SaslHandshakeResponse[_SASL_HANDSHAKE_VERSION](error_code=0, mechanisms=["PLAIN", "SCRAM-SHA-256"])
    body = struct.pack(">i", correlation) + answer.encode()
    [(got_correlation, parsed)] = protocol.receive_bytes(struct.pack(">i", len(body)) + body)
    assert got_correlation == correlation and list(parsed.mechanisms) == ["PLAIN", "SCRAM-SHA-256"]
    protocol.send_request(authenticate_request(b"\0user\0password", _SASL_AUTHENTICATE_VERSION))
    assert struct.unpack(">h", protocol.send_bytes()[4:6])[0] == 36  # SaslAuthenticate
    plain = sasl_mechanism(
        "PLAIN",
        "127.0.0.1",
        {"sasl_plain_username": "user", "sasl_plain_password": "pw", "security_protocol": "SASL_PLAINTEXT"},
    )
    assert plain.auth_bytes() == b"user\0user\0pw"  # authorization id, user name, password


def test_key_partition_is_the_java_client_s_murmur2():
    """``key_partition`` (kafka.partitioner.default.murmur2): the partition Kafka's Java client
    gives a key, from Utils.murmur2's values in Kafka's own tests."""
    for key, java in ((b"21", -973932308), (b"foobar", -790332482), (b"abc", 479470107)):
        assert adapter.key_partition(key, 2**31 - 1) == (java & 0x7FFFFFFF) % (2**31 - 1)
        assert adapter.key_partition(key, 7) == (java & 0x7FFFFFFF) % 7
