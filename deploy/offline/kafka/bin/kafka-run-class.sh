#!/bin/sh
# kafka-run-class.sh of the stand-in: the distribution's environment variables, the jars in /opt/kafka/libs.
base=$(dirname "$0")/..
: "${KAFKA_HEAP_OPTS:=-Xmx256M}"
: "${KAFKA_JVM_PERFORMANCE_OPTS:=-server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true}"
: "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=$base/config/tools-log4j2.properties}"
# shellcheck disable=SC2086  # the *_OPTS are lists of flags, as in the distribution's script
exec java $KAFKA_HEAP_OPTS $KAFKA_JVM_PERFORMANCE_OPTS $KAFKA_LOG4J_OPTS $KAFKA_OPTS -cp "$base/libs/*" "$@"
