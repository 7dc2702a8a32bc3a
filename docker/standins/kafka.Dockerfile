# Stand-in for apache/kafka:4.1.1 (tests/compose only; docker/standins/README.md).
#
# Reproduced: Kafka 4.1.1 in /opt/kafka (libs/ the jars, bin/ the scripts the compose file and its
# healthcheck call: kafka-broker-api-versions.sh, kafka-server-start.sh, kafka-storage.sh,
# kafka-topics.sh); the user appuser (uid 1000) owning /var/lib/kafka/data and /opt/kafka/config;
# CMD /etc/kafka/docker/run, which configures the broker from the environment as the official
# image does (every KAFKA_* variable but the JVM and log4j ones becomes a property: prefix dropped,
# lower case, `___` -> `-`, `__` -> `_`, `_` -> `.`; with none, the default server.properties),
# formats the KRaft storage with CLUSTER_ID (--ignore-formatted) and starts the broker.
# Differs: Debian's OpenJDK 17 JRE (the official image: Eclipse Temurin 21 on Alpine); the jars are
# Maven Central's (docker/standins/kafka/pom.xml), not the release tarball's; bin/ holds only the
# scripts above, written here (kafka/bin/); log4j2 logs INFO to stdout from one properties file;
# no /etc/kafka/docker/ssl or secrets handling (the compose file uses PLAINTEXT only).
ARG ROOTFS
FROM ${ROOTFS}
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home appuser \
    && mkdir -p /opt/kafka/config /var/lib/kafka/data /etc/kafka/docker \
    && chown appuser /opt/kafka/config /var/lib/kafka/data
COPY libs /opt/kafka/libs
COPY --chmod=0755 kafka/bin /opt/kafka/bin
COPY --chmod=0755 kafka/run /etc/kafka/docker/run
COPY --chown=appuser kafka/config /opt/kafka/config
ENV PATH=/opt/kafka/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER appuser
WORKDIR /opt/kafka
CMD ["/etc/kafka/docker/run"]
