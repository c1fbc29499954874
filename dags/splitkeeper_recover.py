"""splitkeeper_recover: recovery after an incident, triggered by hand.

Params (validated when the run is triggered): checkpoint_id ('latest' or an
id), mode (auto, global, partial), parallelism (null keeps it; another value
rescales), dry_run (only print the plan), release (quarantined split ids to
put back; status lists them), rewind + confirm + reason (go back to
the older checkpoint checkpoint_id, state and sink together), reset_split + reset_to (set one
split's offset). A rewind or a reset is planned by the first step (its plan in the log) and
applied by the writing step only with confirm. Tasks are the recovery steps:
restore enumerator state -> collect reader reports -> classify every split
(the audit trail) -> reassign and rebalance -> validate -> resume. One DAG per
configured pipeline (see splitkeeper_ingest).

The writing step (reassign and rebalance) queues for the pipeline's pool slot.
With checkpoint_id 'latest' it restores the latest checkpoint when it gets the
slot: a run that held the slot may have committed newer ones than the first
steps showed. An explicit id that is no longer the latest fails, naming it.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from splitkeeper.config.limits import MAX_PARALLELISM
from splitkeeper.orchestration import tasks
from splitkeeper.orchestration.airflow import DagPipeline, dag_pipelines


def recover_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_recover"),
        description="Hand-triggered recovery: global restore, partial failover or rescale, with the audit "
        "trail",
        schedule=None,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        default_args=pipeline.default_args(),
        doc_md=__doc__,
        params={
            "checkpoint_id": Param(
                "latest",
                type="string",
                pattern=r"^(latest|[1-9][0-9]*)$",
                description="'latest' or the id of a completed checkpoint",
            ),
            "mode": Param(
                "auto", type="string", enum=list(tasks.RECOVERY_MODES), description="recovery mode"
            ),
            "parallelism": Param(
                None,
                type=["null", "integer"],
                minimum=1,
                maximum=MAX_PARALLELISM,
                description="new parallelism (a rescale); null keeps it",
            ),
            "dry_run": Param(False, type="boolean", description="only print the recovery plan"),
            "rewind": Param(
                False,
                type="boolean",
                description="go back to checkpoint_id (an older retained checkpoint): state, sink, dead "
                "letters and change tables as they were there; planned only unless confirm",
            ),
            "confirm": Param(False, type="boolean", description="apply the rewind or the offset reset"),
            "reason": Param("", type="string", description="why (kept in the audit trail)"),
            "reset_split": Param(
                None, type=["null", "string"], description="set this split's offset (with reset_to)"
            ),
            "reset_to": Param(
                None,
                type=["null", "string"],
                pattern=r"^(offset:[0-9]+|timestamp:[0-9]+|earliest|latest|shift:-?[0-9]+)$",
                description="offset:N, timestamp:MS, earliest, latest or shift:K",
            ),
            "release": Param(
                [],
                type="array",
                items={"type": "string"},
                description="quarantined splits to put back (status lists them); read again from their "
                "position",
            ),
        },
        tags=["splitkeeper"],
    ) as dag:
        path = pipeline.config_path

        @task
        def restore_enumerator_state(params: dict | None = None) -> dict:
            return tasks.restore_enumerator_state(params or {}, path)

        @task
        def collect_reader_reports(restored: dict) -> dict:
            return tasks.collect_reader_reports(restored, path)

        @task
        def classify_splits(reports: dict) -> dict:
            return tasks.classify_splits(reports, path)

        @task(pool=pipeline.writer_pool(), outlets=pipeline.assets())
        def reassign_and_rebalance(reports: dict, classified: dict) -> dict:
            return tasks.reassign_and_rebalance(reports, path)

        @task
        def validate(reassigned: dict) -> dict:
            if reassigned.get("dry_run"):
                return {"skipped": "dry run"}
            return tasks.validate(path)

        @task
        def resume(validated: dict) -> str:
            if validated.get("skipped"):
                return "dry run: nothing to resume"
            return tasks.report(path, title="splitkeeper recovery report")

        reports = collect_reader_reports(restore_enumerator_state())
        resume(validate(reassign_and_rebalance(reports, classify_splits(reports))))
    return dag


dags = {d.dag_id: d for d in map(recover_dag, dag_pipelines())}
dag = list(dags.values())[-1]
