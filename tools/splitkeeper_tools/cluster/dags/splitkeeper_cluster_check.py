"""splitkeeper_cluster_check: one task that says where Airflow ran it (triggered by hand).

After `bash scripts/cluster.sh up`, trigger it from the UI or the REST API to see the
deployment work end to end: the scheduler picks the run, its executor starts the task,
and the task returns what it saw: the executor, host, its process and parent processes,
and the Spark master, object store and Kafka its environment points at. No Spark job, no
writes, no secret in the result.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, task

from splitkeeper.airflow.wiring import DEFAULT_ARGS

with DAG(
    dag_id="splitkeeper_cluster_check",
    description="Where does a task run? Executor, host, process chain and the cluster it points at",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args={**DEFAULT_ARGS, "execution_timeout": timedelta(minutes=5)},
    tags=["splitkeeper"],
) as dag:

    @task
    def where_am_i() -> dict:
        import os
        import socket
        from pathlib import Path

        ancestors: list[int] = []
        pid = os.getpid()
        while pid > 1 and len(ancestors) < 16:
            ancestors.append(pid)
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rpartition(")")[2].split()[1])
        return {
            "executor": os.environ.get("AIRFLOW__CORE__EXECUTOR", "(airflow.cfg)"),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "ancestors": ancestors,
            "spark_master": os.environ.get("SPLITKEEPER_SPARK_MASTER"),
            "s3_endpoint": os.environ.get("AWS_ENDPOINT_URL"),
            "kafka": os.environ.get("SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS"),
        }

    where_am_i()
