"""Airflow wiring shared by the DAG files: defaults, and the epoch task (in-process or spark-submit).

Imported only by ``dags/*.py``. On the embedded default the PySpark jobs run
in-process inside the task; when ``SPLITKEEPER_SPARK_MASTER`` names a cluster
(spark://, k8s://, yarn) the epoch task is a ``SparkSubmitOperator`` running
``jobs/epoch_job.py`` (package data: :func:`splitkeeper.resources.epoch_job`) on that cluster.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from splitkeeper import resources

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "splitkeeper",
    "retries": 0,  # recovery is splitkeeper's business: a blind retry would hide what happened
    "execution_timeout": timedelta(hours=2),
}


def _pipeline_config() -> Any:
    """The pipeline named by ``$SPLITKEEPER_PIPELINE_CONFIG``, or None (unset, or not loadable:
    a DAG file must parse; the task itself then reports the bad config)."""
    path = os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", "")
    if not path:
        return None
    try:
        from splitkeeper.runtime.config import load_config

        return load_config(path)
    except Exception:  # noqa: BLE001
        return None


def _asset_uri(location: str) -> str:
    if "://" in location:
        return "s3://" + location.split("://", 1)[1] if location.startswith("s3a://") else location
    return "file://" + os.path.abspath(location)


def pipeline_assets() -> list[Any]:
    """The pipeline's sink and state tables as Airflow Assets: the writing tasks' ``outlets``.

    So the Airflow UI shows the lineage: which DAG run last wrote the sink, and the state.
    Empty when no pipeline config is set (parsing only).
    """
    config = _pipeline_config()
    if config is None:
        return []
    from airflow.sdk import Asset

    return [
        Asset(uri=_asset_uri(config.sink_path), name=f"splitkeeper-{config.name}-sink", group="splitkeeper"),
        Asset(
            uri=_asset_uri(config.state_path), name=f"splitkeeper-{config.name}-state", group="splitkeeper"
        ),
    ]


def notify_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback`` of every task: calls the pipeline's ``notifications.on_failure``.

    The function gets one dict: pipeline, dag_id, task_id, run_id, try_number and the error
    (as text). A failing notification is logged, never raised: it must not hide the task's
    own failure.
    """
    config = _pipeline_config()
    if config is None or config.on_failure is None:
        return
    from splitkeeper.runtime.transforms import resolve_callable

    ti = context.get("ti") or context.get("task_instance")
    event = {
        "pipeline": config.name,
        "dag_id": getattr(ti, "dag_id", None),
        "task_id": getattr(ti, "task_id", None),
        "run_id": getattr(ti, "run_id", None),
        "try_number": getattr(ti, "try_number", None),
        "error": str(context.get("exception") or ""),
    }
    try:
        resolve_callable(config.on_failure, "notifications.on_failure")(event)
    except Exception:  # noqa: BLE001
        logging.getLogger("splitkeeper.orchestration").exception(
            "notifications.on_failure %s failed", config.on_failure
        )


def default_args() -> dict[str, Any]:
    """The DAGs' default_args: no blind retries, a 2 h timeout, the failure notification."""
    return {**DEFAULT_ARGS, "on_failure_callback": notify_failure}


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
    config = _pipeline_config()
    return "splitkeeper" if config is None else f"splitkeeper-{config.name}"


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
        outlets=pipeline_assets(),
    )
