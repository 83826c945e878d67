#!/bin/sh
: "${KAFKA_HEAP_OPTS:=-Xmx1G -Xms1G}"; export KAFKA_HEAP_OPTS
: "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=$(dirname "$0")/../config/log4j2.properties}"; export KAFKA_LOG4J_OPTS
exec "$(dirname "$0")/kafka-run-class.sh" kafka.Kafka "$@"
