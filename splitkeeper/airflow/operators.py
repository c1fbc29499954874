"""The operators a user imports into a DAG: thin wrappers over :mod:`splitkeeper.airflow.tasks`.

Each takes the pipeline file (``pipeline_config``, templated), runs one task function through
:class:`~splitkeeper.airflow.hooks.SplitkeeperHook` (which reads the connections the file names)
and returns the function's JSON-able result as its XCom. Templated values arrive as strings
(``"{{ params.epochs }}"``); each operator turns them back into the type its function takes.

``on_kill``: a continuous ingest is asked to end on a global checkpoint, as ``splitkeeper stop``
does (the control table carries the request to a driver on any host); every other operator
holds the pipeline's lease only for its one call, which ends by itself, so it only logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator

from splitkeeper.errors import InvalidParameterError

log = logging.getLogger("splitkeeper.airflow")


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "", "none"):
        return False
    raise InvalidParameterError(name, value, "true or false")


def _json(name: str, value: Any, kind: type) -> Any:
    """A list/dict argument, given as one or as its JSON text (``{{ params.x | tojson }}``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else kind()
        except json.JSONDecodeError as err:
            raise InvalidParameterError(name, value, f"a JSON {kind.__name__}") from err
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise InvalidParameterError(name, value, f"a {kind.__name__} (or its JSON text)")
    return value


def _optional(name: str, value: Any, cast: type) -> Any:
    if value is None or (isinstance(value, str) and value.strip() in ("", "None", "null")):
        return None
    try:
        return cast(value)
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(name, value, f"a {cast.__name__} or null") from err


class _SplitkeeperOperator(BaseOperator):
    """What every splitkeeper operator shares: the pipeline file and the Spark connection.

    :param pipeline_config: the pipeline file (templated; None: ``$SPLITKEEPER_PIPELINE_CONFIG``)
    :param spark_conn_id: the Spark connection used when the Spark master is a cluster
    """

    template_fields: Sequence[str] = ("pipeline_config",)
    ui_color = "#d8ecf3"

    def __init__(
        self, *, pipeline_config: str | None = None, spark_conn_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_config = pipeline_config
        self.spark_conn_id = spark_conn_id

    @property
    def path(self) -> str | None:
        return self.pipeline_config or None

    def hook(self) -> Any:
        from splitkeeper.airflow.hooks import SplitkeeperHook

        return SplitkeeperHook(self.path, self.spark_conn_id)

    def on_kill(self) -> None:
        log.info("%s cancelled: it holds the pipeline's lease only for its one call", self.task_id)


class SplitkeeperIngestOperator(_SplitkeeperOperator):
    """Run epochs of a pipeline in this task (local Spark): recover, restore, discover, ingest.

    :param pipeline_config: the pipeline file (templated)
    :param epochs: epochs (checkpoints) for this run; None runs a bounded source to its end (templated)
    :param until_caught_up: Kafka: stop at the global checkpoint where every partition reached the
        end offset it had when the run began (templated)
    :param continuous: run on the backlog/normal checkpoint intervals until cancelled, then end on
        a global checkpoint (templated)
    :param faults: faults to inject (demos), e.g. ``["fail:1@2"]``, or its JSON text (templated)
    :param pipeline: this run's overrides of the config's tuning sections, or its JSON text (templated)
    :param reset_backlog: the end offsets now become every split's backlog boundary (templated)
    :param reader_mode: ``deferred``, ``legacy`` or None (the file's ``source.reader_mode``) (templated)
    """

    template_fields: Sequence[str] = (
        "pipeline_config",
        "epochs",
        "until_caught_up",
        "continuous",
        "faults",
        "pipeline",
        "reset_backlog",
        "reader_mode",
    )

    def __init__(
        self,
        *,
        epochs: int | str | None = 3,
        until_caught_up: bool | str = True,
        continuous: bool | str = False,
        faults: Sequence[str] | str = (),
        pipeline: Mapping[str, Any] | str | None = None,
        reset_backlog: bool | str = False,
        reader_mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.epochs = epochs
        self.until_caught_up = until_caught_up
        self.continuous = continuous
        self.faults = faults
        self.pipeline = pipeline
        self.reset_backlog = reset_backlog
        self.reader_mode = reader_mode

    def execute(self, context: Any) -> dict[str, Any]:
        from splitkeeper.airflow import tasks
        from splitkeeper.airflow.triggers import already_consumed, trigger_payloads

        # a run the new-data trigger queued for data an earlier run read: a no-op (its rule 7)
        skipped = already_consumed(self.path, trigger_payloads(context))
        if skipped is not None:
            return skipped
        return tasks.run_epochs(
            self.path,
            epochs=_optional("epochs", self.epochs, int),
            faults=tuple(
                _json("faults", list(self.faults) if isinstance(self.faults, tuple) else self.faults, list)
            ),
            until_caught_up=_flag("until_caught_up", self.until_caught_up),
            continuous=_flag("continuous", self.continuous),
            pipeline=_json("pipeline", self.pipeline, dict) or None,
            reset_backlog=_flag("reset_backlog", self.reset_backlog),
            reader_mode=_optional("reader_mode", self.reader_mode, str),
        )

    def on_kill(self) -> None:
        """A continuous run: ask it to end on a global checkpoint (``splitkeeper stop``)."""
        if not _flag("continuous", self.continuous):
            super().on_kill()
            return
        from splitkeeper.app import services

        try:
            stopped = services.stop(self.hook().load_config())
        except Exception:  # noqa: BLE001 - the cancel goes on; the next run recovers the epoch
            log.exception("could not ask the continuous run to stop")
            return
        log.info("asked pipeline %s to end on a global checkpoint: %s", stopped.pipeline, stopped)


class SplitkeeperValidateOperator(_SplitkeeperOperator):
    """Great Expectations restart checks on a checkpoint and the sink; fails on a violation.

    On a cluster master the checks run as a Spark application there (spark-submit through
    ``spark_conn_id``; :mod:`splitkeeper.airflow.submitted`), not in this task.

    :param pipeline_config: the pipeline file (templated)
    :param checkpoint_id: the checkpoint to check; None: the latest (templated)
    :param reader_mode: the readers' mode of the checked run; None: the file's (templated)
    """

    template_fields: Sequence[str] = ("pipeline_config", "checkpoint_id", "reader_mode")

    def __init__(
        self, *, checkpoint_id: int | str | None = None, reader_mode: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_id = checkpoint_id
        self.reader_mode = reader_mode

    def execute(self, context: Any) -> dict[str, Any]:
        from splitkeeper.airflow.submitted import spark_task

        result: dict[str, Any] = spark_task(
            "validate",
            self.path,
            spark_conn_id=self.spark_conn_id,
            checkpoint_id=_optional("checkpoint_id", self.checkpoint_id, int),
            reader_mode=_optional("reader_mode", self.reader_mode, str),
        )
        return result


class SplitkeeperReportOperator(_SplitkeeperOperator):
    """Render the run report (HTML with charts); its path is the XCom (the "Run report" link's).

    :param pipeline_config: the pipeline file (templated)
    :param title: the report's title; None: the default (templated)
    """

    template_fields: Sequence[str] = ("pipeline_config", "title")

    def __init__(self, *, title: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title

    def execute(self, context: Any) -> str:
        from splitkeeper.airflow import tasks
        from splitkeeper.airflow.wiring import report_verdict

        out = tasks.report(self.path, title=self.title or None)
        log.info("report: %s", out)
        return report_verdict(out)


class SplitkeeperMaintainOperator(_SplitkeeperOperator):
    """Compaction and VACUUM of the state tables and the sink (holds the pipeline's lease).

    :param pipeline_config: the pipeline file (templated)
    :param history_hours: VACUUM keeps files removed less than this long ago; None:
        ``maintenance.history_hours`` (templated)
    """

    template_fields: Sequence[str] = ("pipeline_config", "history_hours")

    def __init__(self, *, history_hours: float | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history_hours = history_hours

    def execute(self, context: Any) -> dict[str, Any]:
        from splitkeeper.airflow import tasks

        return tasks.maintain(self.path, history_hours=_optional("history_hours", self.history_hours, float))


class SplitkeeperRecoverOperator(_SplitkeeperOperator):
    """Recovery in one task: the recovery DAG's steps (restore, reader reports, classify, reassign).

    A rewind or an offset reset is planned, and applied only with ``confirm``; ``dry_run`` only
    logs the plan. On a cluster master the writing step (the restore and its epoch) runs as a Spark
    application there (spark-submit through ``spark_conn_id``; :mod:`splitkeeper.airflow.submitted`).
    The values are checked as the recovery DAG's Params are
    (:func:`splitkeeper.airflow.tasks.check_recovery_params`).

    :param pipeline_config: the pipeline file (templated)
    :param checkpoint_id: ``"latest"`` or a checkpoint id (templated)
    :param mode: ``auto``, ``global`` or ``partial`` (templated)
    :param readers: with ``partial``: the readers to restart, or its JSON text (templated)
    :param parallelism: a new parallelism (a rescale); None keeps it (templated)
    :param dry_run: only log the plan (templated, as the attribute ``plan_only``)
    :param release: quarantined split ids to put back, or its JSON text (templated)
    :param rewind: go back to the older checkpoint ``checkpoint_id``, state and sink together (templated)
    :param confirm: apply the rewind or the offset reset (templated)
    :param reason: why (kept in the audit trail) (templated)
    :param reset_split: set this split's offset, with ``reset_to`` (templated)
    :param reset_to: ``offset:N``, ``timestamp:MS``, ``earliest``, ``latest`` or ``shift:K`` (templated)
    """

    template_fields: Sequence[str] = (
        "pipeline_config",
        "checkpoint_id",
        "mode",
        "readers",
        "parallelism",
        "plan_only",
        "release",
        "rewind",
        "confirm",
        "reason",
        "reset_split",
        "reset_to",
    )

    def __init__(
        self,
        *,
        checkpoint_id: int | str = "latest",
        mode: str = "auto",
        readers: Sequence[int] | str = (),
        parallelism: int | str | None = None,
        dry_run: bool | str = False,
        release: Sequence[str] | str = (),
        rewind: bool | str = False,
        confirm: bool | str = False,
        reason: str = "",
        reset_split: str | None = None,
        reset_to: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.checkpoint_id = checkpoint_id
        self.mode = mode
        self.readers = readers
        self.parallelism = parallelism
        self.plan_only = dry_run  # BaseOperator.dry_run is a method
        self.release = release
        self.rewind = rewind
        self.confirm = confirm
        self.reason = reason
        self.reset_split = reset_split
        self.reset_to = reset_to

    def params_of_run(self) -> dict[str, Any]:
        """The recovery DAG's Params these arguments stand for."""
        release = list(self.release) if isinstance(self.release, tuple) else self.release
        return {
            "checkpoint_id": str(self.checkpoint_id),
            "mode": self.mode,
            "readers": _json(
                "readers", list(self.readers) if isinstance(self.readers, tuple) else self.readers, list
            ),
            "parallelism": _optional("parallelism", self.parallelism, int),
            "dry_run": _flag("dry_run", self.plan_only),
            "release": _json("release", release, list),
            "rewind": _flag("rewind", self.rewind),
            "confirm": _flag("confirm", self.confirm),
            "reason": self.reason or "",
            "reset_split": _optional("reset_split", self.reset_split, str),
            "reset_to": _optional("reset_to", self.reset_to, str),
        }

    def execute(self, context: Any) -> dict[str, Any]:
        from splitkeeper.airflow import tasks

        path = self.path
        restored = tasks.restore_enumerator_state(self.params_of_run(), path)
        reports = tasks.collect_reader_reports(restored, path)
        classified = tasks.classify_splits(reports, path)
        log.info("recovery plan: %s", classified)
        from splitkeeper.airflow.submitted import spark_task

        done: dict[str, Any] = spark_task(
            "reassign_and_rebalance", path, spark_conn_id=self.spark_conn_id, reports=reports
        )
        return done
