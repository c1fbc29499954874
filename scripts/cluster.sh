#!/usr/bin/env bash
# A splitkeeper cluster on this machine, every port on 127.0.0.1, no Docker: a Spark
# standalone master and 2 workers (Spark authentication on), PostgreSQL, Airflow 3 on it
# (api-server, scheduler with the LocalExecutor, dag-processor, triggerer; authentication on),
# an S3-compatible object store (versitygw) and the project's Kafka broker.
#
#   bash scripts/cluster.sh up        # start (about a minute); prints each service and its health
#   bash scripts/cluster.sh status    # probe each service; exit 0 all healthy, 1 some not, 3 none running
#   bash scripts/cluster.sh down      # stop everything; no process is left (add --purge to delete the data)
#   source var/cluster/env            # point splitkeeper, spark-submit, deltalake and airflow at it
#
# Credentials are generated per cluster folder into var/cluster/credentials.env (mode 0600);
# logs are in var/cluster/logs/. Options: --dir DIR (or SPLITKEEPER_CLUSTER_DIR), --json
# (status), --worker-cores N, --worker-memory 1g, --executor-memory 768m, --timeout S (up).
# The Airflow services get SPLITKEEPER_PIPELINE_CONFIG (and SPLITKEEPER_REPORTS_DIR) from the
# environment of `up`: the pipeline the DAGs run, or several separated by ':' (one set of DAGs
# each); `up` creates each pipeline's one-slot writer pool through the REST API.
# SPLITKEEPER_AIRFLOW_SCHEDULES=0 at `up`: the scheduler runs triggered DAG runs only. Needs
# `bash scripts/setup.sh` and `bash scripts/setup.sh cluster` first.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
[[ -x "$PY" ]] || { echo "no .venv: run 'bash scripts/setup.sh' first" >&2; exit 1; }

case "${1:-}" in
    up|status|down) ;;
    *) echo "usage: bash scripts/cluster.sh up|status|down [--dir DIR] [--json] [--purge]" >&2; exit 2 ;;
esac
exec "$PY" -m splitkeeper_tools.cluster "$@"
