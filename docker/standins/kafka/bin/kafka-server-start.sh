#!/bin/bash
# kafka-server-start.sh CONFIG: the broker, with the release script's default heap.
base="$(cd "$(dirname "$0")/.." && pwd)"
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base/config/log4j2.properties}"
exec "$base/bin/kafka-run-class.sh" kafka.Kafka "$@"
