"""Airflow wiring shared by the DAG files: defaults, and the epoch task (in-process or spark-submit).

Imported only by ``dags/*.py``. On the embedded default the PySpark jobs run
in-process inside the task; when ``SPLITKEEPER_SPARK_MASTER`` names a cluster
(spark://, k8s://, yarn) the epoch task is a ``SparkSubmitOperator`` running
``jobs/epoch_job.py`` (package data: :func:`splitkeeper.resources.epoch_job`) on that cluster.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from splitkeeper import resources

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "splitkeeper",
    "retries": 0,  # recovery is splitkeeper's business: a blind retry would hide what happened
    "execution_timeout": timedelta(hours=2),
}


def cluster_master() -> str | None:
    """The configured Spark master when it is a cluster, else None (in-process local Spark)."""
    master = os.environ.get("SPLITKEEPER_SPARK_MASTER", "")
    return master if master and not master.startswith("local") else None


def spark_submit_epoch_task(task_id: str, epochs: int) -> Any:
    """The epoch job through SparkSubmitOperator (apache-airflow-providers-apache-spark)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        task_id=task_id,
        application=str(resources.epoch_job()),
        conn_id=os.environ.get("SPLITKEEPER_SPARK_CONN_ID", "spark_default"),
        application_args=[
            "--config",
            os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", ""),
            "--epochs",
            str(epochs),
            "--until-caught-up",  # Kafka: read what is there, as the in-process task does by default
        ],
        jars=os.environ.get("SPLITKEEPER_SPARK_JARS"),
        py_files=os.environ.get("SPLITKEEPER_PY_FILES"),
        name="splitkeeper-epochs",
    )
