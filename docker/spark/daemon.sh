#!/usr/bin/env bash
# Entry point of the Spark master and workers (docker-compose.yml): writes Spark's
# authentication settings into a properties file only this user can read (the secret never
# reaches a command line, so `ps` does not show it) and runs the daemon class in the foreground.
#
#   daemon.sh org.apache.spark.deploy.master.Master --host spark-master --port 7077 ...
set -euo pipefail
: "${SPARK_AUTH_SECRET:?SPARK_AUTH_SECRET is required: the master and workers only accept authenticated peers}"
umask 077
conf="$(mktemp -d)/spark-daemon.conf"
printf '%s\n' \
    "spark.authenticate true" \
    "spark.authenticate.secret ${SPARK_AUTH_SECRET}" \
    "spark.master.rest.enabled false" \
    "spark.worker.cleanup.enabled true" > "$conf"
unset SPARK_AUTH_SECRET
class="$1"
shift
exec /opt/spark/bin/spark-class "$class" --properties-file "$conf" "$@"
