"""splitkeeper_rescale: change a pipeline's parallelism (protocol rule 2.8).

Restores the latest checkpoint at the new parallelism, redistributing operator
state even-split or union and splits even-split, keeps the restored assignment
until the first checkpoint at the new parallelism (which it then takes), and
validates. One DAG per configured pipeline (see splitkeeper_ingest).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from splitkeeper.config.limits import MAX_PARALLELISM
from splitkeeper.orchestration import tasks
from splitkeeper.orchestration.airflow import DagPipeline, dag_pipelines


def rescale_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_rescale"),
        description="Change parallelism with operator-state redistribution (even-split or union)",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=pipeline.default_args(),
        doc_md=__doc__,
        params={
            "parallelism": Param(
                2, type="integer", minimum=1, maximum=MAX_PARALLELISM, description="the new parallelism"
            ),
            "redistribution": Param("even-split", type="string", enum=["even-split", "union"]),
        },
        tags=["splitkeeper"],
    ) as dag:
        path = pipeline.config_path

        @task
        def restore(params: dict | None = None) -> dict:
            params = params or {}
            restored = tasks.restore_enumerator_state(
                {"checkpoint_id": "latest", "mode": "global", "parallelism": params.get("parallelism")},
                path,
            )
            return {**restored, "redistribution": params.get("redistribution", "even-split")}

        @task(pool=pipeline.writer_pool(), outlets=pipeline.assets())
        def redistribute(restored: dict) -> dict:
            return tasks.rescale(tasks.collect_reader_reports(restored, path), path)

        @task
        def validate(redistributed: dict) -> dict:
            return tasks.validate(path)

        @task
        def report(validated: dict) -> str:
            return tasks.report(path, title="splitkeeper rescale report")

        report(validate(redistribute(restore())))
    return dag


dags = {d.dag_id: d for d in map(rescale_dag, dag_pipelines())}
dag = list(dags.values())[-1]
