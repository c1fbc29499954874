#!/usr/bin/env bash
# A local Apache Kafka broker (KRaft, one node, 127.0.0.1) for demos and manual runs.
#
#   bash scripts/kafka.sh start     # prints bootstrap.servers; data kept across restarts
#   bash scripts/kafka.sh status    # exit 0 running, 3 stopped
#   bash scripts/kafka.sh stop
#
# Environment:
#   SPLITKEEPER_KAFKA_DIR    data/log/pid folder (default: <repo>/var/kafka)
#   SPLITKEEPER_KAFKA_PORT   broker port (default: the previous run's if free, else 9092 if free, else any)
#   KAFKA_HEAP_OPTS          JVM heap (default: -Xmx512m -Xms256m)
# Needs `bash scripts/setup.sh` first (jars in .jars/kafka/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "no .venv: run 'bash scripts/setup.sh' first" >&2; exit 1; }

action="${1:-}"
case "$action" in
    start|stop|status) ;;
    *) echo "usage: bash scripts/kafka.sh start|stop|status" >&2; exit 2 ;;
esac
args=("$action" --data-dir "${SPLITKEEPER_KAFKA_DIR:-$ROOT/var/kafka}")
if [[ "$action" == "start" && -n "${SPLITKEEPER_KAFKA_PORT:-}" ]]; then
    args+=(--port "$SPLITKEEPER_KAFKA_PORT")
fi
exec "$PY" -m splitkeeper_tools.kafka_broker "${args[@]}"
