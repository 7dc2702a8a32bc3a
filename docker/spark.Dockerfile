# Spark standalone master and worker for docker-compose.yml. Build context: the repository root.
#
# The executors run this project's Kafka data source (kafka-python inside the Python workers),
# so they need the same pyspark and pipeline_lib as the driver in the Airflow image. The Python
# minor version (3.11) must equal the Airflow image's. Checked by tests/unit/test_compose.py.
FROM python:3.11.14-slim-bookworm

ARG PYSPARK_VERSION=4.3.0

# Java 17 (the same major as the Airflow image's driver); procps for Spark's scripts (ps).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The constraints file (tools/image_constraints.py) holds every package at the version the tests
# passed with, the same as in the Airflow image.
COPY pyproject.toml README.md docker/constraints.txt /opt/pipeline-lib/
COPY pipeline_lib /opt/pipeline-lib/pipeline_lib
RUN pip install --no-cache-dir --constraint /opt/pipeline-lib/constraints.txt \
        "pyspark==${PYSPARK_VERSION}" /opt/pipeline-lib \
    && rm -rf /opt/pipeline-lib

# pip's pyspark is a complete Spark distribution: spark-class and the jars live in the package.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=python3 \
    SPARK_WORKER_DIR=/opt/spark/work

# Run as an unprivileged user; the worker's scratch space is the only folder it writes.
RUN useradd --create-home --uid 1001 --gid 0 spark \
    && mkdir -p /opt/spark/work \
    && chown -R spark:0 /opt/spark
USER spark
WORKDIR /opt/spark
