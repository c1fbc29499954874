#!/usr/bin/env bash
# The main job on the embedded default: install what the demo needs (scripts/setup.sh: python, jars), then run the demo:
# Airflow (SQLite metadata DB) runs the ingest DAG over a few cycles on local Spark and local Delta,
# a region failure is injected, the recovery DAG rescales, the restart checks run, and the reports
# are written; then the same DAG ingests two Kafka topics from the project's own broker while
# messages keep arriving. The last line printed is `report: <path of the index of both reports>`.
#
#   bash scripts/run.sh                 # fresh demo workspace under var/demo
#   bash scripts/run.sh --workspace DIR # somewhere else
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/setup.sh
exec "$ROOT/.venv/bin/python" -m splitkeeper_tools.demo "$@"
