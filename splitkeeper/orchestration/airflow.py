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


def writer_pool() -> str:
    """The Airflow pool of every task that writes this pipeline's state (one slot: one writer at a time).

    ``splitkeeper-<pipeline name>`` for the pipeline named by ``$SPLITKEEPER_PIPELINE_CONFIG``
    (``splitkeeper`` when none is set, e.g. while only parsing). The ingest, recover, rescale
    and maintain DAGs put their writing task in it, so a second writer queues instead of
    failing (``max_active_runs`` is per DAG). Create it once per pipeline:
    ``airflow pools set splitkeeper-<name> 1 "one writer per pipeline"`` (``scripts/cluster.sh``
    does). Airflow's ``dag.test()`` ignores pools; the pipeline lease still refuses a second
    writer there.
    """
    path = os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", "")
    if not path:
        return "splitkeeper"
    try:
        from splitkeeper.runtime.config import load_config

        return f"splitkeeper-{load_config(path).name}"
    except Exception:  # noqa: BLE001 - a DAG file must parse; the task itself reports the bad config
        return "splitkeeper"


def cluster_master() -> str | None:
    """The configured Spark master when it is a cluster, else None (in-process local Spark)."""
    master = os.environ.get("SPLITKEEPER_SPARK_MASTER", "")
    return master if master and not master.startswith("local") else None


def spark_submit_epoch_task(task_id: str) -> Any:
    """The epoch job through SparkSubmitOperator (apache-airflow-providers-apache-spark).

    Every Param of the ingest DAG reaches the job: ``application_args`` are templated
    (epochs, until_caught_up, continuous, faults as JSON).
    """
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return SparkSubmitOperator(
        task_id=task_id,
        application=str(resources.epoch_job()),
        conn_id=os.environ.get("SPLITKEEPER_SPARK_CONN_ID", "spark_default"),
        application_args=[
            "--config",
            os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", ""),
            "{{ '--continuous' if params.continuous else '--epochs=' ~ params.epochs }}",
            "{{ '--until-caught-up' if params.until_caught_up and not params.continuous "
            "else '--no-until-caught-up' }}",
            "--faults-json",
            "{{ params.faults | tojson }}",
        ],
        jars=os.environ.get("SPLITKEEPER_SPARK_JARS"),
        py_files=os.environ.get("SPLITKEEPER_PY_FILES"),
        name="splitkeeper-epochs",
        pool=writer_pool(),
    )
