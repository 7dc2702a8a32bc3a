"""Servers the tests, the benchmarks and the soak start, and the library never does; not part of the wheel.

minio_server (MinIO built from source, for the tests of the compose stack's MinIO policies),
postgres_server (Debian's PostgreSQL, the compose-parity test's Airflow metadata DB) and
spark_cluster (a Spark standalone master and workers on loopback: the cluster tests, ``pipeline-lib
bench cluster``/``driver`` and the cluster soak). The embedded stack of ``pipeline-lib stack up``
(broker, S3 server, Apache Kafka) stays in ``pipeline_lib.localstack``; these reuse its process
and port helpers.
"""
