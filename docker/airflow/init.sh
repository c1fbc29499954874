#!/usr/bin/env bash
# airflow-init (docker-compose.yml): runs once before the other Airflow services start.
# Migrates the metadata database, writes the simple auth manager's passwords file (0600) from
# the users' passwords in the environment, and checks that the splitkeeper package, its jars
# and its expectation suites are in place. The Spark connection the DAGs use comes from
# AIRFLOW_CONN_SPARK_DEFAULT (docker-compose.yml), not from the database.
set -euo pipefail

echo "[airflow-init] airflow db migrate"
airflow db migrate

passwords="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?}"
echo "[airflow-init] passwords of the Airflow users (admin, operator) -> $passwords"
mkdir -p "$(dirname "$passwords")"
(
    umask 077
    python - "$passwords" <<'PY'
import json, os, sys
users = {"admin": os.environ["AIRFLOW_ADMIN_PASSWORD"], "operator": os.environ["AIRFLOW_OPERATOR_PASSWORD"]}
with open(sys.argv[1], "w") as out:
    json.dump(users, out)
PY
)

echo "[airflow-init] splitkeeper: package, jars, expectation suites"
python - <<'PY'
from splitkeeper.quality.checks import load_suite_specs
from splitkeeper.spark import jars

spark_jars = jars.spark_jars()
suites = load_suite_specs()
print(f"  {len(spark_jars)} Spark jars, suites: {', '.join(sorted(suites))}")
PY

for dir in /var/splitkeeper/staging /var/splitkeeper/reports; do
    [[ -w "$dir" ]] || { echo "[airflow-init] $dir is not writable by $(id -u)" >&2; exit 1; }
done
echo "[airflow-init] done"
