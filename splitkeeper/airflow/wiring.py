"""Airflow wiring shared by the DAG files: defaults, and the epoch task (in-process or spark-submit).

Imported by :mod:`splitkeeper.airflow` (the generated DAGs). On the embedded default the PySpark jobs run
in-process inside the task; when ``SPLITKEEPER_SPARK_MASTER`` names a cluster
(spark://, k8s://, yarn) the epoch task is a ``SparkSubmitOperator`` running
``jobs/epoch_job.py`` (package data: :func:`splitkeeper.resources.epoch_job`) on that cluster, and
the other tasks' Spark work runs as ``jobs/task_job.py`` applications there
(:mod:`splitkeeper.airflow.submitted`), both with :func:`submit_settings`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from splitkeeper import resources
from splitkeeper.airflow.files import config_paths

DEFAULT_ARGS: dict[str, Any] = {
    "owner": "splitkeeper",
    "retries": 0,  # recovery is splitkeeper's business: a blind retry would hide what happened
    "execution_timeout": timedelta(hours=2),
}


def pool_name(pipeline_name: str) -> str:
    """The one-slot Airflow pool of a pipeline's writing tasks: ``splitkeeper-<pipeline name>``."""
    return f"splitkeeper-{pipeline_name}"


def _load(path: str) -> Any:
    """The pipeline of ``path``, or None when it does not load (a DAG file must parse; the task
    itself then reports the bad config)."""
    try:
        from splitkeeper.config.settings import load_config

        return load_config(path)
    except Exception:  # noqa: BLE001
        return None


def pipeline_param() -> Any:
    """The ingest DAG's ``pipeline`` Param: this run's overrides of the config's tuning sections.

    Its JSON Schema is generated from the config models (``splitkeeper config schema``), so the
    trigger form (and the API) rejects an unknown key or a wrong type before the run starts; the
    run then validates the merged config with the file (the core's ranges, cross-key rules).
    """
    from airflow.sdk import Param

    from splitkeeper.config.models import overrides_json_schema

    return Param(
        {},
        description="override config sections for this run only, e.g. "
        '{"backlog": {"normal_epoch_records": 5000}}: '
        + ", ".join(overrides_json_schema()["properties"])
        + " (values as they are: no ${NAME}; metrics.otlp_endpoint and notifications.on_failure only where "
        "the pipeline file's overrides.allow lists them)",
        **overrides_json_schema(),
    )


def _asset_uri(location: str) -> str:
    if "://" in location:
        return "s3://" + location.split("://", 1)[1] if location.startswith("s3a://") else location
    return "file://" + os.path.abspath(location)


@dataclass(frozen=True)
class DagPipeline:
    """One pipeline the DAG files build their DAGs for (a DAG file builds one DAG per pipeline).

    With one configured pipeline (or none, when Airflow only parses the files) the DAG ids are
    the plain ones (``splitkeeper_ingest``); with several, each DAG id ends with
    ``__<pipeline name>`` (``splitkeeper_ingest__orders-kafka``), so every pipeline has its own
    schedule, run history, ``max_active_runs`` and Params, and its own writer pool.
    """

    path: str  # "" when no pipeline is configured (parsing only)
    config: Any  # the loaded PipelineConfig, or None (not configured, or it does not load)
    suffix: str = ""  # "" for the only pipeline, else "__<name>"

    def dag_id(self, base: str) -> str:
        return base + self.suffix

    @property
    def config_path(self) -> str | None:
        """What the tasks get as their config path (None: ``$SPLITKEEPER_PIPELINE_CONFIG``)."""
        return self.path or None

    def writer_pool(self) -> str:
        """The Airflow pool of every task that writes this pipeline's state (one slot: one writer
        at a time).

        ``splitkeeper-<pipeline name>`` (``splitkeeper`` when none is configured, e.g. while only
        parsing). The ingest, recover, rescale and maintain DAGs put their writing task in it, so
        a second writer queues instead of failing (``max_active_runs`` is per DAG). It must exist:
        ``scripts/cluster.sh up`` creates one per configured pipeline; elsewhere
        ``airflow pools set splitkeeper-<name> 1 "one writer per pipeline"``. Airflow's
        ``dag.test()`` ignores pools; the pipeline lease still refuses a second writer there.
        """
        return "splitkeeper" if self.config is None else pool_name(self.config.name)

    def assets(self) -> list[Any]:
        """The pipeline's sink and state tables as Airflow Assets: the writing tasks' ``outlets``.

        So the Airflow UI shows the lineage: which DAG run last wrote the sink, and the state.
        Empty when no pipeline is configured (parsing only).
        """
        config = self.config
        if config is None:
            return []
        from airflow.sdk import Asset

        return [
            Asset(
                uri=_asset_uri(config.sink.path), name=f"splitkeeper-{config.name}-sink", group="splitkeeper"
            ),
            Asset(
                uri=_asset_uri(config.state.path),
                name=f"splitkeeper-{config.name}-state",
                group="splitkeeper",
            ),
        ]

    def notify_failure(self, context: Mapping[str, Any]) -> None:
        """``on_failure_callback`` of every task: calls the pipeline's ``notifications.on_failure``.

        The function gets one dict: pipeline, dag_id, task_id, run_id, try_number and the error
        (as text). A failing notification is logged, never raised: it must not hide the task's
        own failure. The report step's verdict (:func:`report_verdict`: it fails because another
        task of the run failed) is not notified again.
        """
        config = self.config
        if config is None or config.notifications.on_failure is None:
            return
        ti = context.get("ti") or context.get("task_instance")
        step = str(getattr(ti, "task_id", "")).rsplit(".", 1)[-1]  # in a task group: <group_id>.report
        if step in REPORT_STEPS and _other_failed_tasks(ti):
            return  # the report step's verdict (report_verdict): the failed task was notified already
        from splitkeeper.callables import Role, resolve_callable

        event = {
            "pipeline": config.name,
            "dag_id": getattr(ti, "dag_id", None),
            "task_id": getattr(ti, "task_id", None),
            "run_id": getattr(ti, "run_id", None),
            "try_number": getattr(ti, "try_number", None),
            "error": str(context.get("exception") or ""),
        }
        try:
            resolve_callable(config.notifications.on_failure, "notifications.on_failure", Role.NOTIFICATION)(
                event
            )
        except Exception:  # noqa: BLE001
            logging.getLogger("splitkeeper.airflow").exception(
                "notifications.on_failure %s failed", config.notifications.on_failure
            )

    def default_args(self) -> dict[str, Any]:
        """The DAGs' default_args: no blind retries, a 2 h timeout, the failure notification."""
        return {**DEFAULT_ARGS, "on_failure_callback": self.notify_failure}


def dag_pipelines(env: Mapping[str, str] | None = None, paths: list[str] | None = None) -> list[DagPipeline]:
    """The pipelines to build DAGs for: ``paths``, else ``$SPLITKEEPER_PIPELINE_CONFIG`` (see
    :class:`DagPipeline`).

    A config that does not load still gets its DAGs (the tasks report the error); among several,
    its DAG ids end with the file's stem instead of the pipeline name.
    """
    paths = config_paths(env) if paths is None else paths
    if len(paths) <= 1:
        path = paths[0] if paths else ""
        return [DagPipeline(path, _load(path) if path else None)]
    pipelines = []
    for path in paths:
        config = _load(path)
        name = config.name if config is not None else Path(path).stem
        pipelines.append(DagPipeline(path, config, f"__{name}"))
    return pipelines


def share_in_process_execution_api() -> None:
    """Make ``dag.test()`` runs of this process share one in-process Execution API.

    ``dag.test()`` (the demo, the DAG tests) runs each task against an in-process Execution API
    server that Airflow 3.1 builds anew for every task
    (``airflow.sdk.execution_time.supervisor.in_process_api_server``); building its FastAPI app,
    and Cadwyn's versioned routes on the app's first request, takes seconds per task, more than
    most of our tasks run. One server per process serves every task the same way (as one API
    server serves every task of a deployment); ``dag.test()`` still points it at a fresh DAG bag
    per task. Idempotent; a scheduler's or worker's task runs are not affected.
    """
    import functools

    from airflow.sdk.execution_time import supervisor

    build = supervisor.in_process_api_server
    if getattr(build, "__wrapped__", None) is None:
        supervisor.in_process_api_server = functools.cache(build)


def cluster_master() -> str | None:
    """The configured Spark master when it is a cluster, else None (in-process local Spark)."""
    from splitkeeper.airflow.hooks import SplitkeeperHook

    return SplitkeeperHook.cluster_master()


def submit_settings() -> dict[str, Any]:
    """What spark-submit gets for every splitkeeper application (the epoch job, the task job): the
    Spark connection (``$SPLITKEEPER_SPARK_CONN_ID``, default ``spark_default``: the master, and
    ``deploy-mode`` in its extra), the jars (``$SPLITKEEPER_SPARK_JARS``) and ``--py-files``
    (``$SPLITKEEPER_PY_FILES``)."""
    return {
        "conn_id": os.environ.get("SPLITKEEPER_SPARK_CONN_ID", "spark_default"),
        "jars": os.environ.get("SPLITKEEPER_SPARK_JARS"),
        "py_files": os.environ.get("SPLITKEEPER_PY_FILES"),
    }


def spark_submit_epoch_task(
    task_id: str, pipeline: DagPipeline, epoch_args: Mapping[str, Any] | None = None
) -> Any:
    """The epoch job through SparkSubmitOperator (apache-airflow-providers-apache-spark).

    Every Param of the ingest DAG reaches the job: ``application_args`` are templated
    (epochs, until_caught_up, continuous, faults and the pipeline overrides as JSON). A
    cancelled continuous run ends on a global checkpoint before spark-submit is killed
    (:class:`~splitkeeper.airflow.spark_submit.EpochJobSubmitOperator`). ``epoch_args``: the
    values instead (a task group's, :func:`splitkeeper.airflow.splitkeeper_task_group`): the
    same templates read them from the task's ``epoch_args``, not from the DAG's Params.
    """
    from splitkeeper.airflow.spark_submit import EpochJobSubmitOperator

    source = "params" if epoch_args is None else "task.epoch_args"

    def read(template: str) -> str:
        return template.replace("params.", f"{source}.")

    return EpochJobSubmitOperator(
        pipeline_config=pipeline.path,
        epoch_args=epoch_args,
        task_id=task_id,
        application=str(resources.epoch_job()),
        **submit_settings(),
        application_args=[
            "--config",
            pipeline.path,
            read("{{ '--continuous' if params.continuous else '--epochs=' ~ params.epochs }}"),
            read(
                "{{ '--until-caught-up' if params.until_caught_up and not params.continuous "
                "else '--no-until-caught-up' }}"
            ),
            "--faults-json",
            read("{{ params.faults | tojson }}"),
            "--pipeline-json",
            read("{{ params.pipeline | tojson }}"),
            read("{{ '--reset-backlog' if params.reset_backlog else '--no-reset-backlog' }}"),
            read("--reader-mode={{ params.reader_mode or 'configured' }}"),
        ],
        name="splitkeeper-epochs",
        pool=pipeline.writer_pool(),
        outlets=pipeline.assets(),
    )


#: Task states of a DAG run that make it red (``upstream_failed``: a task after a failed one).
FAILED_STATES = ("failed", "upstream_failed")
#: The task ids of the DAGs' report steps (ingest and rescale: ``report``; recover: ``resume``).
REPORT_STEPS = ("report", "resume")


def verdict_scope(task: Any) -> frozenset[str] | None:
    """The task ids a report step's verdict (:func:`report_verdict`) looks at: those of the task
    group the step is in (a :func:`splitkeeper.airflow.splitkeeper_task_group` in a DAG of one's
    own: the other tasks of that DAG are not the pipeline's); None at a DAG's top level (the
    generated DAGs: every task of the run)."""
    group = getattr(task, "task_group", None)
    if group is None or group.is_root:
        return None
    return frozenset(t.task_id for t in group)


def _other_failed_tasks(ti: Any) -> dict[str, str]:
    """Task id -> state of the tasks of ``ti``'s DAG run, other than ``ti``'s, that failed; only
    those of ``ti``'s task group when it is in one (:func:`verdict_scope`)."""
    states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
    scope = verdict_scope(getattr(ti, "task", None))
    return {
        task: state
        for task, state in states.items()
        if task != ti.task_id and state in FAILED_STATES and (scope is None or task in scope)
    }


def report_verdict(report: str) -> str:
    """Called by a DAG's report step (trigger rule ``all_done``: it runs after a failed validate or
    ingest too) once the report is rendered: the report step decides the DAG run's state as its
    leaf, so it fails when another task of this run failed, naming it and the report, which says why.
    In a task group (:func:`splitkeeper.airflow.splitkeeper_task_group`) only the group's tasks
    count: it fails when one of them failed, and the tasks of the rest of the DAG are their own.
    The report's path is pushed as the step's XCom first, so the "Run report" link works either way.

    Not a teardown: Airflow keeps a run with a pending teardown alive, so marking a queued run failed
    would leave it queued, run the teardown later and end the run as a success."""
    from airflow.exceptions import AirflowFailException
    from airflow.sdk import get_current_context

    ti = get_current_context()["ti"]
    states = _other_failed_tasks(ti)
    failed = sorted(states)
    if failed:
        ti.xcom_push(key="return_value", value=report)
        named = ", ".join(f"{task} {states[task]}" for task in failed)
        group = getattr(getattr(ti, "task", None), "task_group", None)
        what = "this DAG run" if group is None or group.is_root else f"task group {group.group_id}"
        raise AirflowFailException(f"{what} failed ({named}); its run report says why: {report}")
    return report
