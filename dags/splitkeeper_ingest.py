"""splitkeeper_ingest: the scheduled ingest of one pipeline.

run epochs (the pipeline is opened once: an epoch the last run left half-done is
finished from its decision record, the latest checkpoint is restored, new splits
are discovered; epoch size follows the backlog state) -> Great Expectations
restart checks -> run report. The pipeline is the one named by the
SPLITKEEPER_PIPELINE_CONFIG environment variable; when it names several (separated
by ':'), there is one such DAG per pipeline, splitkeeper_ingest__<pipeline name>.
Logic lives in splitkeeper.orchestration.tasks; this file only wires tasks.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from splitkeeper.orchestration import tasks
from splitkeeper.orchestration.airflow import (
    DagPipeline,
    cluster_master,
    dag_pipelines,
    pipeline_param,
    spark_submit_epoch_task,
)


def ingest_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_ingest"),
        description="Scheduled exactly-once ingest with split ownership and regional checkpoints",
        schedule=timedelta(minutes=30),
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=pipeline.default_args(),
        doc_md=__doc__,
        params={
            "epochs": Param(
                3, type="integer", minimum=1, maximum=1000, description="epochs (checkpoints) per run"
            ),
            "until_caught_up": Param(
                True,
                type="boolean",
                description="Kafka: stop at the global checkpoint where every partition reached the end "
                "offset it had when the run began (at most `epochs` epochs); file sources end by themselves",
            ),
            "continuous": Param(
                False,
                type="boolean",
                description="run on the backlog/normal checkpoint intervals until the task is cancelled, "
                "then end on a global checkpoint (epochs and until_caught_up are then ignored)",
            ),
            "faults": Param(
                [],
                type="array",
                items={"type": "string", "pattern": r"^(fail|flaky|stall(:[0-9.]+)?):[0-9]+@[0-9]+$"},
                description="faults to inject (demos): fail:REGION@EPOCH, flaky:REGION@EPOCH or "
                "stall[:SECONDS]:REGION@EPOCH",
            ),
            "pipeline": pipeline_param(),
        },
        tags=["splitkeeper"],
    ) as dag:
        path = pipeline.config_path

        @task(pool=pipeline.writer_pool(), outlets=pipeline.assets())
        def run_epochs(params: dict | None = None) -> dict:
            params = params or {}
            return tasks.run_epochs(
                path,
                epochs=int(params.get("epochs", 3)),
                faults=tuple(params.get("faults", ())),
                until_caught_up=bool(params.get("until_caught_up", True)),
                continuous=bool(params.get("continuous", False)),
                pipeline=params.get("pipeline") or None,
            )

        @task
        def validate(ran: dict) -> dict:
            return tasks.validate(path)

        @task
        def report(validated: dict) -> str:
            out = tasks.report(path)
            print(f"report: {out}")
            return out

        if cluster_master():
            epochs = spark_submit_epoch_task("run_epochs", pipeline)
            report(validate(epochs.output))
        else:
            report(validate(run_epochs()))
    return dag


dags = {d.dag_id: d for d in map(ingest_dag, dag_pipelines())}
dag = list(dags.values())[-1]
