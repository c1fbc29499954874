"""The work behind every Airflow task: thin wrappers over the application services.

DAG files in ``dags/`` only wire these functions into tasks (the scheduler
re-parses DAG files constantly, so they hold no logic). Each function takes the
pipeline configuration path (default ``$SPLITKEEPER_PIPELINE_CONFIG``), calls
one service of :mod:`splitkeeper.app.services` and returns its result as a small
JSON-able dict (an XCom). Steps keep no state in memory between tasks:
everything a later task needs is in the Delta state tables, so each task may
run in another process.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

from splitkeeper.airflow.files import config_path
from splitkeeper.app import services
from splitkeeper.config.limits import check_parallelism
from splitkeeper.config.settings import PipelineConfig, ReaderMode, load_config
from splitkeeper.core.rescale import Redistribution
from splitkeeper.errors import InvalidParameterError

log = logging.getLogger("splitkeeper.airflow")

RECOVERY_MODES = services.RECOVERY_MODES


_OUTSIDE_AIRFLOW: contextvars.ContextVar[bool] = contextvars.ContextVar("outside_airflow", default=False)


@contextlib.contextmanager
def outside_airflow() -> Iterator[None]:
    """The task functions called in here read the pipeline file as it is, not through Airflow's
    connections: a submitted Spark application (:mod:`splitkeeper.airflow.submitted`) gets what the
    connections give in its environment instead
    (:meth:`~splitkeeper.airflow.hooks.SplitkeeperHook.job_environment`), as the epoch job does."""
    token = _OUTSIDE_AIRFLOW.set(True)
    try:
        yield
    finally:
        _OUTSIDE_AIRFLOW.reset(token)


def _config(path: str | None, overrides: Mapping[str, Any] | None = None) -> PipelineConfig:
    """The pipeline through :class:`~splitkeeper.airflow.hooks.SplitkeeperHook`: the connections the
    file names are read (Kafka servers and SASL, the object store's keys into this process's
    environment); without Airflow, or :func:`outside_airflow`, the file as it is."""
    if _OUTSIDE_AIRFLOW.get():
        return load_config(config_path(path), overrides=overrides)
    try:
        from splitkeeper.airflow.hooks import SplitkeeperHook
    except ImportError:  # no Airflow installed: no connections to read
        return load_config(config_path(path), overrides=overrides)
    config: PipelineConfig = SplitkeeperHook(config_path(path)).open(overrides)
    return config


# -- scheduled ingest ------------------------------------------------------------------------


def run_epochs(
    path: str | None = None,
    epochs: int | None = None,
    faults: tuple[str, ...] = (),
    until_caught_up: bool = True,
    continuous: bool = False,
    pipeline: Mapping[str, Any] | None = None,
    reset_backlog: bool = False,
    reader_mode: str | None = None,
) -> dict[str, Any]:
    """Open the pipeline once (recover a half-done epoch, restore), discover, run epochs.

    Epoch size follows the backlog state; ``None`` runs a bounded source to its end. An
    unbounded source (Kafka) stops, with ``until_caught_up``, at the global checkpoint
    where every split reached the end it had when the task began; ``epochs`` caps it.
    ``continuous`` runs on the backlog/normal checkpoint intervals until the task is
    cancelled (SIGTERM), then ends on a global checkpoint. ``pipeline``: this run's overrides
    of the config's tuning sections (the DAG's ``pipeline`` Param), validated with the file
    before anything runs (ConfigError names the dotted key). ``reset_backlog``: the end offsets now
    become the splits' backlog boundaries (``run --reset-backlog``, protocol rule 4.1);
    ``reader_mode``: this run's ``source.reader_mode`` (None: the file's).
    """
    config = _config(path, pipeline)
    mode = reader_mode_of(reader_mode)
    if continuous:
        result = services.run(
            config, faults=faults, continuous=True, reset_backlog=reset_backlog, reader_mode=mode
        )
    else:
        result = services.run(
            config,
            epochs=epochs,
            faults=faults,
            until_caught_up=until_caught_up,
            reset_backlog=reset_backlog,
            reader_mode=mode,
        )
    return result.to_dict()


def reader_mode_of(value: Any) -> ReaderMode | None:
    """The DAGs' ``reader_mode`` Param ('deferred', 'legacy'; None, '' or 'None': the file's)."""
    if value in (None, "", "None", "null", "configured"):
        return None
    try:
        return ReaderMode(value)
    except ValueError as err:
        raise InvalidParameterError(
            "reader_mode", value, "'deferred', 'legacy' or null (the pipeline file's source.reader_mode)"
        ) from err


def validate(
    path: str | None = None,
    checkpoint_id: int | None = None,
    *,
    skip_validated: bool = True,
    reader_mode: str | None = None,
) -> dict[str, Any]:
    """Great Expectations restart checks on a checkpoint and the sink; raises on a violation.

    ``skip_validated``: when the latest checkpoint passed already and nothing the checks read changed
    since (a run with nothing new), they are not run again and no Spark starts; the result names that
    checkpoint, when it was validated and its Data Docs (``already_validated_at``, ``data_docs``)."""
    return services.validate(
        _config(path), checkpoint_id, skip_validated=skip_validated, reader_mode=reader_mode_of(reader_mode)
    ).to_dict()


def validated_already(path: str | None = None, reader_mode: str | None = None) -> dict[str, Any] | None:
    """What :func:`validate` returns without running the checks (the latest checkpoint passed them
    and nothing they read changed since), or None when they must run; no Spark."""
    result = services.validated_already(_config(path), reader_mode=reader_mode_of(reader_mode))
    return None if result is None else result.to_dict()


def report(path: str | None = None, title: str | None = None) -> str:
    """Render the run report (HTML with charts); returns the path of the page kept for the run
    that wrote the latest checkpoint (``runs/<start>-<run id>/report.html``: what the Airflow
    plugin's "Run report" link of this task opens), or of the latest report before any run."""
    from splitkeeper.report.html import run_report

    return str(run_report(services.report(_config(path), title)))


def maintain(path: str | None = None, history_hours: float | None = None) -> dict[str, Any]:
    """Compaction and VACUUM of the state tables and the sink (holds the pipeline's lease)."""
    return services.maintain(_config(path), history_hours=history_hours).to_dict()


def next_epoch(path: str | None = None) -> int:
    """The id the next epoch of this pipeline will get (for fault injection in demos)."""
    return services.next_epoch(_config(path))


# -- recovery (triggered by hand) ------------------------------------------------------------


def check_recovery_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the recovery DAG's Params beyond their JSON schema; return them normalised."""
    checkpoint_id = services.checkpoint_id_of(params.get("checkpoint_id", "latest"))
    readers = params.get("readers") or []
    if not isinstance(readers, list) or not all(
        isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in readers
    ):
        raise InvalidParameterError("readers", readers, "a list of reader ids (integers >= 0)")
    mode = services.recovery_mode(params.get("mode", "auto"), readers)
    parallelism = params.get("parallelism")
    if parallelism is not None:
        check_parallelism(parallelism, or_else=", or null to keep it")
    redistribution = params.get("redistribution")
    if redistribution is not None and redistribution not in ("even-split", "union"):
        raise InvalidParameterError("redistribution", redistribution, "'even-split' or 'union'")
    release = params.get("release") or []
    if not isinstance(release, list) or not all(isinstance(s, str) and s for s in release):
        raise InvalidParameterError("release", release, "a list of quarantined split ids (see status)")
    rewind = bool(params.get("rewind", False))
    reset_split = params.get("reset_split") or None
    reset_to = params.get("reset_to") or None
    if rewind and checkpoint_id is None:
        raise InvalidParameterError(
            "checkpoint_id", "latest", "the id of an older checkpoint with rewind (status lists them)"
        )
    if rewind and reset_split:
        raise InvalidParameterError("reset_split", reset_split, "null with rewind (one change per run)")
    if bool(reset_split) != bool(reset_to):
        raise InvalidParameterError(
            "reset_to" if reset_split else "reset_split",
            reset_to if reset_split else reset_split,
            "given together with the other: reset_split (a split id) and reset_to "
            "(offset:N, timestamp:MS, earliest, latest or shift:K)",
        )
    if reset_to:
        from splitkeeper.app.incident import parse_target

        parse_target(str(reset_to))
    return {
        "checkpoint_id": checkpoint_id,
        "mode": mode,
        "parallelism": parallelism,
        "dry_run": bool(params.get("dry_run", False)),
        "redistribution": redistribution,
        "release": list(release),
        "rewind": rewind,
        "confirm": bool(params.get("confirm", False)),
        "reason": str(params.get("reason") or ""),
        "reset_split": reset_split,
        "reset_to": reset_to,
        "readers": list(readers),
        "reader_mode": None
        if (mode_of := reader_mode_of(params.get("reader_mode"))) is None
        else mode_of.value,
    }


def _operator(chosen: Mapping[str, Any]) -> bool:
    return bool(chosen.get("rewind") or chosen.get("reset_split"))


def operator_change(chosen: Mapping[str, Any], path: str | None = None, *, apply: bool) -> dict[str, Any]:
    """A rewind (``rewind`` + ``checkpoint_id``) or an offset reset (``reset_split`` + ``reset_to``),
    planned (``apply`` False, or without ``confirm``, or with ``dry_run``) or applied; logs the plan."""
    from splitkeeper.app import incident

    config = _config(path)
    dry = not apply or chosen.get("dry_run") or not chosen.get("confirm")
    operator = os.environ.get(incident.OPERATOR_ENV) or "airflow"
    if chosen.get("rewind"):
        rewound = incident.rewind(
            config,
            int(chosen["checkpoint_id"]),
            yes=not dry,
            dry_run=bool(dry),
            reason=chosen.get("reason", ""),
            operator=operator,
        )
        log.info("%s", rewound.text())
        return {"kind": "rewind", "applied": rewound.applied, **rewound.to_dict()}
    reset = incident.reset_offset(
        config,
        str(chosen["reset_split"]),
        str(chosen["reset_to"]),
        dry_run=bool(dry),
        reason=chosen.get("reason", ""),
        operator=operator,
    )
    log.info("offset reset %s: %s", "applied" if reset.applied else "planned", reset.to_dict())
    return {"kind": "reset", **reset.to_dict()}


def restore_enumerator_state(params: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Load the chosen checkpoint and show what the enumerator will restore (pool, owners, finished)."""
    chosen = check_recovery_params(params)
    if _operator(chosen):  # the plan, logged; the pool-slot step applies it (with confirm)
        return {**chosen, "operator": operator_change(chosen, path, apply=False)}
    preview = services.preview_recovery(_config(path), chosen["checkpoint_id"]).to_dict()
    preview.pop("reports")
    services.check_recovery_mode(
        chosen["mode"], chosen["parallelism"], preview["parallelism_before"], chosen["readers"]
    )
    # "requested": what the writing step restores. 'latest' stays None: that step waits for the
    # pipeline's pool slot, and a run that held it meanwhile may have committed newer checkpoints.
    return {**chosen, **preview, "requested": chosen["checkpoint_id"]}


def _restore_id(reports: Mapping[str, Any]) -> int | None:
    """The checkpoint the writing step restores: the one asked for, or the latest when 'latest' was."""
    if "requested" in reports:
        return None if reports["requested"] is None else int(reports["requested"])
    return int(reports["checkpoint_id"])


def collect_reader_reports(restored: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """What every reader reports on registration: the splits in its region's state of that checkpoint."""
    if "operator" in restored:
        return dict(restored)
    preview = services.preview_recovery(_config(path), _restore_id(restored)).to_dict()
    return {**restored, "checkpoint_id": preview["checkpoint_id"], "reports": preview["reports"]}


def _redistribution(value: Any) -> Redistribution | None:
    """The DAG Param ('even-split', 'union'; None or '' when not given) as the core's enum."""
    return None if not value else Redistribution[str(value).upper().replace("-", "_")]


def _recover(reports: Mapping[str, Any], path: str | None, dry_run: bool) -> dict[str, Any]:
    result = services.recover(
        _config(path),
        checkpoint_id=int(reports["checkpoint_id"]) if dry_run else _restore_id(reports),
        parallelism=reports.get("parallelism"),
        redistribution=_redistribution(reports.get("redistribution")),
        mode=reports.get("mode", "auto"),
        dry_run=dry_run,
        release=reports.get("release") or (),
        readers=reports.get("readers") or (),
        reader_mode=reader_mode_of(reports.get("reader_mode")),
    )
    out = result.to_dict()
    log.info("recovery decisions: %s", out["opened"]["decisions"])
    for line in result.failovers:
        log.info("partial recovery: %s", line)
    return out


def rescale(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """The rescale DAG's step: restore the previewed checkpoint at the new parallelism, commit it."""
    result = services.rescale(
        _config(path),
        int(reports["parallelism"]),
        _redistribution(reports.get("redistribution")) or Redistribution.EVEN_SPLIT,
        checkpoint_id=_restore_id(reports),
    )
    out = result.to_dict()
    log.info("rescaled to %s: recovery decisions %s", reports["parallelism"], out["opened"]["decisions"])
    return out


def classify_splits(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """The recovery decision for every split (the audit trail), computed without writing anything."""
    if "operator" in reports:
        return dict(reports["operator"])
    return _recover(reports, path, dry_run=True)


def reassign_and_rebalance(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Restore for real and commit the new assignment with one checkpoint (nothing when ``dry_run``)."""
    if "operator" in reports:
        done = operator_change(reports, path, apply=True)
        return {**done, "dry_run": not done.get("applied")}
    if reports["dry_run"]:
        return {"dry_run": True, "note": "dry run: nothing restored or written"}
    return _recover(reports, path, dry_run=False)
