"""The Kafka-sink benchmark (`pipeline-lib bench kafka-sink`) at a tiny size, on a stack of its own
with Apache Kafka: both jobs run in both engines, every output topic read back with read_committed
passes its check (ours exactly once, Spark's at least once), and the figures are printed.
Measurements only: no timing is asserted. Minutes long (Apache Kafka and four Spark processes),
so under ``full``; how the outputs are judged is pinned down fast in
tests/unit/test_kafka_sink_bench_check.py."""

from __future__ import annotations

import json

import pytest

from benchmarks.kafka_sink import kafka_sink_bench


@pytest.mark.full
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kafka_sink_bench_smoke(tmp_path, capsys):
    code = kafka_sink_bench(events=4_000, users=300, per_epoch=1_000, partitions=2, keep=tmp_path / "logs")
    out = capsys.readouterr().out
    assert code == 0, out
    figures = json.loads(out.strip().splitlines()[-1])
    assert set(figures) == {"stateless", "aggregate"}
    for kind in figures.values():
        assert kind["wrong"] == {"ours": [], "spark": []}
        assert kind["ours_s"] > 0 and kind["spark_s"] > 0 and kind["our_epochs"] == 4
        assert "publish" in kind["our_phase_means_s"]
    assert "speed-up" in out
