"""splitkeeper_maintain: daily compaction and VACUUM of a pipeline's state tables and sink.

Deletes state rows nothing reads any more, bin-packs small files and VACUUMs the files
commits removed more than history_hours ago (Param; default: the pipeline's
maintenance.history_hours), logging every file removed. It runs in the pipeline's writer
pool and holds its lease, so it queues behind an ingest instead of running beside it.
Never removes a file a kept checkpoint or an uncommitted epoch needs. One DAG per
configured pipeline (see splitkeeper_ingest). Logic lives in
splitkeeper.orchestration.tasks; this file only wires the task.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from splitkeeper.orchestration import tasks
from splitkeeper.orchestration.airflow import DagPipeline, dag_pipelines


def maintain_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_maintain"),
        description="Compaction and VACUUM of the state tables and the sink",
        schedule="@daily",
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=pipeline.default_args(),
        doc_md=__doc__,
        params={
            "history_hours": Param(
                None,
                type=["null", "number"],
                minimum=0,
                description="VACUUM keeps files removed less than this long ago; null: "
                "maintenance.history_hours",
            ),
        },
        tags=["splitkeeper"],
    ) as dag:
        path = pipeline.config_path

        @task(pool=pipeline.writer_pool(), outlets=pipeline.assets())
        def maintain(params: dict | None = None) -> dict:
            hours = (params or {}).get("history_hours")
            return tasks.maintain(path, history_hours=None if hours is None else float(hours))

        maintain()
    return dag


dags = {d.dag_id: d for d in map(maintain_dag, dag_pipelines())}
dag = list(dags.values())[-1]
