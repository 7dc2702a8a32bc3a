# The one image behind every Airflow service of docker-compose.yml (api-server, scheduler,
# dag-processor, triggerer, init). Build context: the repository root (see .dockerignore).
#
# Versions are pinned here and checked against pyproject.toml by tests/unit/test_compose.py:
# the Airflow version must equal the project's `apache-airflow==` pin (3.3.2), and the image's
# Python (3.11) must equal the Spark image's, because PySpark refuses a driver and executors
# whose Python minor versions differ.
ARG AIRFLOW_VERSION=3.3.2
FROM apache/airflow:${AIRFLOW_VERSION}-python3.11

ARG AIRFLOW_VERSION
# apache-airflow-providers-postgres brings psycopg2 for the postgresql+psycopg2 metadata DB URL.
ARG POSTGRES_PROVIDER_VERSION=7.1.1

# Java 17 for Spark: the Airflow task is the Spark driver (client mode against the standalone
# master, or local[N] when no master is configured). The image is Debian bookworm based.
# /opt/airflow/auth holds the simple auth manager's password file; a named volume is mounted
# there, and a new volume copies this ownership, so the airflow user can write it.
# /opt/pipeline-lib is where pip builds this project (as the airflow user).
USER root
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /opt/airflow/auth /opt/pipeline-lib \
    && chown airflow:0 /opt/airflow/auth /opt/pipeline-lib \
    && chmod 0770 /opt/airflow/auth
ENV JAVA_HOME=/usr/lib/jvm/java-17

# This project (the pipeline library, its CLI and PySpark), installed as the airflow user as the
# image's docs require. Pinning apache-airflow to the image's own version keeps pip from
# upgrading or downgrading Airflow while it resolves the project's dependencies; the constraints
# file (tools/image_constraints.py) holds every other package at the version the tests passed with.
USER airflow
COPY --chown=airflow:0 pyproject.toml README.md docker/constraints.txt /opt/pipeline-lib/
COPY --chown=airflow:0 pipeline_lib /opt/pipeline-lib/pipeline_lib
RUN pip install --no-cache-dir --constraint /opt/pipeline-lib/constraints.txt \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "apache-airflow-providers-postgres==${POSTGRES_PROVIDER_VERSION}" \
        /opt/pipeline-lib

# Every Airflow service starts through a check that refuses empty or change-me secrets
# (docker/airflow-entrypoint.sh), then the base image's entrypoint (dumb-init stays PID 1).
COPY --chmod=0755 docker/airflow-entrypoint.sh /opt/pipeline-lib/airflow-entrypoint.sh
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/opt/pipeline-lib/airflow-entrypoint.sh"]
