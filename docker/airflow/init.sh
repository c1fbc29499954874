#!/usr/bin/env bash
# airflow-init (docker-compose.yml): runs once before the other Airflow services start.
# Migrates the metadata database, registers the Spark connection the DAGs may use, and
# checks that the splitkeeper package, its jars and its expectation suites are in place.
set -euo pipefail

echo "[airflow-init] airflow db migrate"
airflow db migrate

echo "[airflow-init] connection spark_default -> ${SPLITKEEPER_SPARK_MASTER}"
airflow connections delete spark_default >/dev/null 2>&1 || true
airflow connections add spark_default \
    --conn-type spark \
    --conn-host "${SPLITKEEPER_SPARK_MASTER%:*}" \
    --conn-port "${SPLITKEEPER_SPARK_MASTER##*:}"

echo "[airflow-init] splitkeeper: package, jars, expectation suites"
python - <<'PY'
from splitkeeper.quality.checks import load_suite_specs
from splitkeeper.runtime import jars

spark_jars = jars.spark_jars()
suites = load_suite_specs()
print(f"  {len(spark_jars)} Spark jars, suites: {', '.join(sorted(suites))}")
PY

for dir in /var/splitkeeper/staging /var/splitkeeper/reports; do
    [[ -w "$dir" ]] || { echo "[airflow-init] $dir is not writable by $(id -u)" >&2; exit 1; }
done
echo "[airflow-init] done"
