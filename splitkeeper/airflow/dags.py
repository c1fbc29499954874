"""The DAGs :func:`splitkeeper.airflow.splitkeeper_dags` builds for one pipeline.

One builder per kind, each taking a :class:`~splitkeeper.airflow.wiring.DagPipeline`.
The scheduled steps are the splitkeeper operators (:mod:`splitkeeper.airflow.operators`); the
recovery and rescale DAGs keep one task per recovery step (the audit trail), each a call of
:mod:`splitkeeper.airflow.tasks`. Nothing here starts or imports Spark: the scheduler
parses DAG files constantly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, AssetWatcher, Param, TaskGroup, chain, task

from splitkeeper.airflow import tasks
from splitkeeper.airflow.operators import (
    SplitkeeperIngestOperator,
    SplitkeeperMaintainOperator,
    SplitkeeperReportOperator,
    SplitkeeperValidateOperator,
)
from splitkeeper.airflow.submitted import spark_task
from splitkeeper.airflow.triggers import SplitkeeperNewDataTrigger
from splitkeeper.airflow.wiring import (
    DagPipeline,
    cluster_master,
    pipeline_param,
    report_verdict,
    spark_submit_epoch_task,
)
from splitkeeper.config.limits import MAX_PARALLELISM
from splitkeeper.config.models import DEFAULT_SCHEDULE, ON_NEW_DATA
from splitkeeper.errors import InvalidParameterError

INGEST_DOC = """splitkeeper_ingest: the scheduled ingest of one pipeline.

run epochs (the pipeline is opened once: an epoch the last run left half-done is
finished from its decision record, the latest checkpoint is restored and proven by
the in-run restart checks, new splits are discovered; epoch size follows the backlog
state) -> Great Expectations restart checks -> run report (trigger rule all_done: it runs, and
says so, when the checks or the run failed; the DAG run then stays red). Scheduled by the pipeline file's
airflow.schedule (default every 30 minutes; on_new_data: when the source has
something new, seen by an Asset watcher that polls it without Spark). With several pipeline files there is
one such DAG per pipeline, splitkeeper_ingest__<pipeline name>. Built by
splitkeeper.airflow.splitkeeper_dags from the splitkeeper operators.
"""

RECOVER_DOC = """splitkeeper_recover: recovery after an incident, triggered by hand.

Params (validated when the run is triggered): checkpoint_id ('latest' or an
id), mode (auto, global, partial) and readers (partial: the readers that restart
alone, through the enumerator's partial failover, protocol rule 1.3), parallelism
(null keeps it; another value rescales), dry_run (only print the plan), release (quarantined split ids to
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

RESCALE_DOC = """splitkeeper_rescale: change a pipeline's parallelism (protocol rule 2.8).

Restores the latest checkpoint at the new parallelism, redistributing operator
state even-split or union and splits even-split, keeps the restored assignment
until the first checkpoint at the new parallelism (which it then takes), and
validates. One DAG per configured pipeline (see splitkeeper_ingest).
"""

MAINTAIN_DOC = """splitkeeper_maintain: daily compaction and VACUUM of a pipeline's state tables and sink.

Deletes state rows nothing reads any more, bin-packs small files and VACUUMs the files
commits removed more than history_hours ago (Param; default: the pipeline's
maintenance.history_hours), logging every file removed. It runs in the pipeline's writer
pool and holds its lease, so it queues behind an ingest instead of running beside it.
Never removes a file a kept checkpoint or an uncommitted epoch needs. One DAG per
configured pipeline (see splitkeeper_ingest). Built by
splitkeeper.airflow.splitkeeper_dags.
"""


REPORT_RUNS_ALWAYS = """The report task of every DAG runs last with trigger rule all_done: it runs when
validate, or the step before it, failed, and its page says so (the restart checks' verdict is read
from the validations table). As the DAG's leaf it decides the run's state: once the page is written
it fails when another task of the run failed (splitkeeper.airflow.wiring.report_verdict), so
a run whose restart checks failed is red with its report rendered, and a run marked failed by hand
is failed at once (a teardown would keep it queued to run the report)."""


def reader_mode_param() -> Param:
    """The ``reader_mode`` Param of the ingest and recovery DAGs: this run's ``source.reader_mode``."""
    return Param(
        None,
        type=["null", "string"],
        enum=[None, "deferred", "legacy"],
        description="readers on recovery: deferred (they wait for the enumerator to assign, FLIP-537), "
        "legacy (they keep and read what they restored); null: the pipeline file's source.reader_mode",
    )


def schedule_of(pipeline: DagPipeline) -> Any:
    """The ingest DAG's schedule: the pipeline file's ``airflow.schedule`` (default every 30 minutes).

    ``on_new_data``: the pipeline's new-data Asset (:func:`new_data_asset`), which its watcher
    updates when the source has something new; an idle slot runs no task and no Spark."""
    if pipeline.config is None:
        return DEFAULT_SCHEDULE
    if pipeline.config.airflow.schedule == ON_NEW_DATA:
        return [new_data_asset(pipeline)]
    return pipeline.config.airflow.schedule


def new_data_asset(pipeline: DagPipeline) -> Asset:
    """``splitkeeper-<name>-new-data``: an Asset watched by :class:`SplitkeeperNewDataTrigger`, which
    looks at the source every ``airflow.poll_interval_s`` (no Spark) and fires when a run would read:
    one event per batch of new data, its cursor kept for the ingest DAG (see its module's rules)."""
    config = pipeline.config
    assert config is not None
    trigger = SplitkeeperNewDataTrigger(
        pipeline.path,
        poll_interval=config.airflow.poll_interval_s,
        dag_id=pipeline.dag_id("splitkeeper_ingest"),
    )
    name = f"splitkeeper-{config.name}-new-data"
    return Asset(
        name=name,
        uri=f"splitkeeper://{config.name}/new-data",
        group="splitkeeper",
        watchers=[AssetWatcher(name=name, trigger=trigger)],
    )


def _shared(pipeline: DagPipeline) -> dict[str, Any]:
    """What every splitkeeper DAG of a pipeline sets alike: no backfill, one run at a time, the
    pipeline's default task arguments, the tag."""
    return {
        "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
        "catchup": False,
        "max_active_runs": 1,
        "default_args": pipeline.default_args(),
        "tags": ["splitkeeper"],
    }


def ingest_params() -> dict[str, Param]:
    """The ingest DAG's Params. :func:`splitkeeper.airflow.splitkeeper_task_group` checks its
    arguments against the same ones (epochs, until_caught_up, reset_backlog, reader_mode, pipeline)."""
    return {
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
        "reset_backlog": Param(
            False,
            type="boolean",
            description="Kafka: the end offsets now become every partition's backlog boundary "
            "(throughput epoch size and interval until caught up; run --reset-backlog)",
        ),
        "reader_mode": reader_mode_param(),
        "pipeline": pipeline_param(),
    }


#: The ingest DAG's epoch-task arguments: its Params, rendered when a run starts.
PARAM_TEMPLATES: dict[str, str] = {
    "epochs": "{{ params.epochs }}",
    "until_caught_up": "{{ params.until_caught_up }}",
    "continuous": "{{ params.continuous }}",
    "faults": "{{ params.faults | tojson }}",
    "pipeline": "{{ params.pipeline | tojson }}",
    "reset_backlog": "{{ params.reset_backlog }}",
    "reader_mode": "{{ params.reader_mode }}",
}


def ingest_steps(
    pipeline: DagPipeline,
    epoch_args: Mapping[str, Any] | None = None,
    *,
    validate: bool = True,
    report: bool = True,
) -> list[Any]:
    """The ingest's steps, in the DAG or TaskGroup being defined: run_epochs -> validate -> report.

    The one definition of them: :func:`ingest_dag` and
    :func:`splitkeeper.airflow.splitkeeper_task_group` both build their steps here. ``run_epochs``
    writes in the pipeline's pool (its outlets the sink and state tables); on a cluster master it
    is spark-submit (:func:`~splitkeeper.airflow.wiring.spark_submit_epoch_task`). ``report`` has
    trigger rule all_done (see REPORT_RUNS_ALWAYS). ``epoch_args``: the epoch task's arguments (the
    keys of :data:`PARAM_TEMPLATES`) as values; None: the ingest DAG's Params. Returns the steps
    built, in order, each downstream of the one before.
    """
    path = pipeline.config_path
    args = PARAM_TEMPLATES if epoch_args is None else epoch_args
    if cluster_master():
        epochs: Any = spark_submit_epoch_task("run_epochs", pipeline, epoch_args)
    else:
        epochs = SplitkeeperIngestOperator(
            task_id="run_epochs",
            pipeline_config=path,
            **args,
            pool=pipeline.writer_pool(),
            outlets=pipeline.assets(),
        )
    steps = [epochs]
    if validate:
        steps.append(
            SplitkeeperValidateOperator(
                task_id="validate", pipeline_config=path, reader_mode=args["reader_mode"]
            )
        )
    if report:
        steps.append(
            SplitkeeperReportOperator(task_id="report", pipeline_config=path, trigger_rule="all_done")
        )
    chain(*steps)  # see REPORT_RUNS_ALWAYS
    return steps


def ingest_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_ingest"),
        description="Scheduled exactly-once ingest with split ownership and regional checkpoints",
        schedule=schedule_of(pipeline),
        **_shared(pipeline),
        doc_md=INGEST_DOC,
        params=ingest_params(),
    ) as dag:
        ingest_steps(pipeline)
    return dag


def ingest_group(
    pipeline: DagPipeline,
    group_id: str,
    epoch_args: Mapping[str, Any],
    *,
    validate: bool = True,
    report: bool = True,
    tooltip: str = "",
    default_args: Mapping[str, Any] | None = None,
) -> TaskGroup:
    """The ingest's steps (:func:`ingest_steps`) as a TaskGroup of the DAG being defined; what
    :func:`splitkeeper.airflow.splitkeeper_task_group` returns. The group's tasks get the
    pipeline's default arguments (no blind retry, the timeout, the failure notification), then
    ``default_args`` over them; ``epoch_args`` are checked already."""
    from airflow.exceptions import DuplicateTaskIdFound

    defaults: Any = {**pipeline.default_args(), **(default_args or {})}
    try:
        group = TaskGroup(group_id=group_id, tooltip=tooltip, default_args=defaults)
    except DuplicateTaskIdFound as err:
        raise InvalidParameterError(
            "group_id",
            group_id,
            "an id no other task or task group of this DAG has",
            hint=f"Airflow: {err}; give each splitkeeper_task_group of a DAG its own group_id=",
        ) from err
    except ValueError as err:  # Airflow's check of a group key
        raise InvalidParameterError(
            "group_id",
            group_id,
            "letters, digits, dashes and underscores (at most 200)",
            hint=f"Airflow: {err}",
        ) from err
    except RuntimeError as err:  # TaskGroup's check: no DAG is being defined
        raise InvalidParameterError(
            "dag",
            None,
            "a DAG being defined",
            hint="Call splitkeeper_task_group inside `with DAG(...):` or a @dag function",
        ) from err
    with group:
        ingest_steps(pipeline, epoch_args, validate=validate, report=report)
    return group


def recover_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_recover"),
        description="Hand-triggered recovery: global restore, partial failover or rescale, with the audit "
        "trail",
        schedule=None,
        **_shared(pipeline),
        doc_md=RECOVER_DOC,
        params={
            "checkpoint_id": Param(
                "latest",
                type="string",
                pattern=r"^(latest|[1-9][0-9]*)$",
                description="'latest' or the id of a completed checkpoint",
            ),
            "mode": Param(
                "auto",
                type="string",
                enum=list(tasks.RECOVERY_MODES),
                description="global: every reader restarts from the checkpoint; partial: after that "
                "restore only `readers` restart, through the enumerator's partial failover (protocol "
                "rule 1.3); auto: partial when readers are given, else global",
            ),
            "readers": Param(
                [],
                type="array",
                items={"type": "integer", "minimum": 0},
                description="mode partial: the readers to restart (status shows each reader's load)",
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
            "reader_mode": reader_mode_param(),
        },
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
            return spark_task("reassign_and_rebalance", path, reports=reports)

        @task
        def validate(reassigned: dict, params: dict | None = None) -> dict:
            if reassigned.get("dry_run"):
                return {"skipped": "dry run"}
            return spark_task("validate", path, reader_mode=(params or {}).get("reader_mode"))

        @task(trigger_rule="all_done")
        def resume(params: dict | None = None) -> str:
            if (params or {}).get("dry_run"):
                return report_verdict("dry run: nothing to resume")
            return report_verdict(tasks.report(path, title="splitkeeper recovery report"))

        # each step's XCom is the next one's argument (mypy sees the XComArg, not the dict)
        reports: Any = collect_reader_reports(restore_enumerator_state())  # type: ignore[arg-type]
        classified: Any = classify_splits(reports)
        validated = validate(reassign_and_rebalance(reports, classified))  # type: ignore[arg-type]
        validated >> resume()  # see REPORT_RUNS_ALWAYS
    return dag


def rescale_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_rescale"),
        description="Change parallelism with operator-state redistribution (even-split or union)",
        schedule=None,
        **_shared(pipeline),
        doc_md=RESCALE_DOC,
        params={
            "parallelism": Param(
                2, type="integer", minimum=1, maximum=MAX_PARALLELISM, description="the new parallelism"
            ),
            "redistribution": Param("even-split", type="string", enum=["even-split", "union"]),
        },
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
            reports = tasks.collect_reader_reports(restored, path)
            return spark_task("rescale", path, reports=reports)

        @task
        def validate(redistributed: dict) -> dict:
            return spark_task("validate", path)

        @task(trigger_rule="all_done")
        def report() -> str:
            return report_verdict(tasks.report(path, title="splitkeeper rescale report"))

        validate(redistribute(restore())) >> report()  # type: ignore[arg-type]  # see REPORT_RUNS_ALWAYS
    return dag


def maintain_dag(pipeline: DagPipeline) -> DAG:
    with DAG(
        dag_id=pipeline.dag_id("splitkeeper_maintain"),
        description="Compaction and VACUUM of the state tables and the sink",
        schedule="@daily",
        **_shared(pipeline),
        doc_md=MAINTAIN_DOC,
        params={
            "history_hours": Param(
                None,
                type=["null", "number"],
                minimum=0,
                description="VACUUM keeps files removed less than this long ago; null: "
                "maintenance.history_hours",
            ),
        },
    ) as dag:
        SplitkeeperMaintainOperator(
            task_id="maintain",
            pipeline_config=pipeline.config_path,
            history_hours="{{ params.history_hours }}",
            pool=pipeline.writer_pool(),
            outlets=pipeline.assets(),
        )
    return dag


#: The builder of each DAG kind (:data:`splitkeeper.airflow.DAG_KINDS`).
BUILDERS: dict[str, Callable[[DagPipeline], DAG]] = {
    "ingest": ingest_dag,
    "recover": recover_dag,
    "rescale": rescale_dag,
    "maintain": maintain_dag,
}
