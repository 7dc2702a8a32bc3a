# Stand-in for apache/airflow:3.3.2-python3.11 (tests/compose only; docker/standins/README.md).
#
# Reproduced: the python stand-in as base (the official image is built on python:3.11-slim-bookworm);
# the user airflow, uid 50000, primary group 0, home /home/airflow; AIRFLOW_HOME=/opt/airflow (also
# the working directory) with dags, logs, plugins and config owned by airflow:0; Airflow 3.3.2
# installed for that user (PIP_USER=true, ~/.local/bin on PATH), as the official image does, so a
# derived image's `pip install` as airflow adds to it; curl (healthchecks), procps and util-linux;
# /usr/bin/dumb-init and /entrypoint, ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"], USER airflow.
# Differs: Airflow is installed with docker/constraints.txt, not Airflow's published constraints,
# and without the official image's preinstalled providers and extras; /entrypoint (airflow-entrypoint
# in this folder) only dispatches the command (bash, python, airflow or an airflow subcommand): it does
# not wait for the metadata DB, create a user (_AIRFLOW_WWW_USER_*), migrate (_AIRFLOW_DB_MIGRATE) or
# handle an arbitrary uid, none of which docker-compose.yml uses.
ARG BASE
FROM ${BASE}
ARG AIRFLOW_VERSION=3.3.2
ENV AIRFLOW_HOME=/opt/airflow \
    AIRFLOW_USER_HOME_DIR=/home/airflow \
    AIRFLOW_UID=50000 \
    PIP_USER=true \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/home/airflow/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
    && apt-get install -y --no-install-recommends curl dumb-init procps util-linux \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 50000 --gid 0 --create-home --home-dir /home/airflow --shell /bin/bash airflow \
    && mkdir -p /opt/airflow/dags /opt/airflow/logs /opt/airflow/plugins /opt/airflow/config \
    && chown -R airflow:0 /opt/airflow \
    && chmod -R g+rwX /opt/airflow
COPY --chmod=0755 airflow-entrypoint /entrypoint
COPY constraints.txt /opt/standin/constraints.txt
USER airflow
RUN pip install --no-cache-dir --constraint /opt/standin/constraints.txt "apache-airflow==${AIRFLOW_VERSION}"
WORKDIR /opt/airflow
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"]
CMD []
