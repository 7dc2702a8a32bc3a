#!/bin/bash
# java with Kafka's jars and log4j2 settings: the release's kafka-run-class.sh, reduced to what the
# other scripts of this folder use (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS).
base="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck disable=SC2086
exec java ${KAFKA_HEAP_OPTS:--Xmx256M} ${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -Djava.awt.headless=true} \
  ${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base/config/tools-log4j2.properties} ${KAFKA_OPTS:-} \
  -cp "$base/libs/*" "$@"
