"""The work behind every Airflow task, importable and testable without Airflow.

DAG files in ``dags/`` only wire these functions into tasks (the scheduler
re-parses DAG files constantly, so they hold no logic). Each function takes the
pipeline configuration path, opens what it needs on the driver (Spark session,
Delta state), does one step and returns a small JSON-able dict (an XCom).
Steps never keep state in memory between tasks: everything a later task needs
is in the Delta state tables, so each task may run in another process.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from splitkeeper.errors import CheckpointError, InvalidParameterError
from splitkeeper.runtime.config import PipelineConfig, load_config

log = logging.getLogger("splitkeeper.orchestration")

CONFIG_ENV = "SPLITKEEPER_PIPELINE_CONFIG"
REPORTS_ENV = "SPLITKEEPER_REPORTS_DIR"
RECOVERY_MODES = ("auto", "global", "partial")


def config_path(explicit: str | None = None) -> str:
    """The pipeline config a task works on: the argument, else ``$SPLITKEEPER_PIPELINE_CONFIG``."""
    path = explicit or os.environ.get(CONFIG_ENV, "")
    if not path:
        raise InvalidParameterError(
            CONFIG_ENV,
            path,
            "the path of a pipeline config file",
            hint=f"export {CONFIG_ENV}=/path/pipeline.yaml",
        )
    return path


def reports_dir(config: PipelineConfig) -> Path:
    base = os.environ.get(REPORTS_ENV) or os.path.join(
        os.path.dirname(config.state_path.rstrip("/")), "reports"
    )
    return Path(base) / config.name


def _spark() -> Any:
    from splitkeeper.runtime.spark import SparkSettings, get_spark

    return get_spark(SparkSettings.from_env(ui_enabled=False))


def _state_store(config: PipelineConfig) -> Any:
    """The pipeline's Delta state store, read-only: the tasks that use it only read (no source needed)."""
    from splitkeeper.state.checkpoints import DeltaStateStore

    return DeltaStateStore(config.state_path, config.name, None, read_only=True)


def _pipeline(
    config: PipelineConfig, progress: Callable[[str], None] | None = None, *, read_only: bool = False
) -> Any:
    from splitkeeper.runtime.pipeline import Pipeline

    return Pipeline(config, _spark(), progress=progress or log.info, read_only=read_only)


def _open_summary(opened: Any, loads: Mapping[int, int]) -> dict[str, Any]:
    decisions = Counter(d.decision.value for d in opened.decisions)
    return {
        "restored_from": opened.restored_from,
        "redone_checkpoint": opened.redone_checkpoint,
        "parallelism": opened.parallelism,
        "previous_parallelism": opened.previous_parallelism,
        "decisions": dict(sorted(decisions.items())),
        "loads": {str(r): n for r, n in sorted(loads.items())},
        "external_disagreements": list(opened.external_disagreements),
        "mode": opened.mode_reason,
    }


# -- scheduled ingest ------------------------------------------------------------------------


def recover_if_needed(path: str | None = None) -> dict[str, Any]:
    """Finish an epoch the last run left half-done (redo its decision); restore the latest checkpoint."""
    config = load_config(config_path(path))
    pipeline = _pipeline(config)
    try:
        opened = pipeline.open()
        return _open_summary(opened, pipeline.enumerator.loads())
    finally:
        pipeline.close()


def discover_and_assign(path: str | None = None) -> dict[str, Any]:
    """Discover splits and show how the enumerator assigns them (committed by the next epoch's checkpoint)."""
    config = load_config(config_path(path))
    pipeline = _pipeline(config)
    try:
        pipeline.open()
        known = pipeline.enumerator.pool_size + sum(pipeline.enumerator.loads().values())
        added = pipeline.enumerator.add_splits(pipeline.connector.discover_splits())
        return {
            "known_splits": known,
            "new_splits": added,
            "loads": {str(r): n for r, n in sorted(pipeline.enumerator.loads().items())},
            "pool": pipeline.enumerator.pool_size,
            "processing_backlog": pipeline.enumerator.processing_backlog,
        }
    finally:
        pipeline.close()


def run_epochs(
    path: str | None = None,
    epochs: int | None = None,
    faults: tuple[str, ...] = (),
    until_caught_up: bool = True,
) -> dict[str, Any]:
    """Run epochs (epoch size follows the backlog state); ``None`` runs a bounded source to its end.

    An unbounded source (Kafka) stops, with ``until_caught_up``, at the global checkpoint
    where every split reached the end it had when the task began; ``epochs`` caps it.
    """
    from splitkeeper.runtime.faults import FaultPlan
    from splitkeeper.runtime.pipeline import Pipeline

    config = load_config(config_path(path))
    pipeline = Pipeline(config, _spark(), faults=FaultPlan.parse(faults), progress=log.info)
    try:
        pipeline.open()
        summary = pipeline.run(epochs, until_caught_up=until_caught_up)
        return {
            "epochs": [
                {
                    "epoch": e.epoch,
                    "kind": e.kind.value,
                    "failed_regions": sorted(r for r, o in e.outcomes.items() if o.value != "ack"),
                    "committed_records": e.committed_records,
                    "processing_backlog": e.processing_backlog,
                }
                for e in summary.epochs
            ],
            "checkpoints": summary.counts(),
            "committed_records": summary.committed_records,
            "finished": summary.finished,
            "caught_up": summary.caught_up,
        }
    finally:
        pipeline.close()


def validate(path: str | None = None, checkpoint_id: int | None = None) -> dict[str, Any]:
    """Great Expectations restart checks (DESIGN 6) on a checkpoint and the sink; raises on a violation."""
    from splitkeeper.quality.checks import raise_on_failure, run_restart_checks
    from splitkeeper.runtime.sources import build_source
    from splitkeeper.state.checkpoints import DeltaStateStore

    config = load_config(config_path(path))
    connector = build_source(config.source)
    try:
        store = DeltaStateStore(config.state_path, config.name, connector.fingerprint(), read_only=True)
        report = run_restart_checks(
            _spark(),
            store,
            config.sink_path,
            checkpoint_id=checkpoint_id,
            strategy=config.strategy,
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
            subscriptions=connector.subscriptions(),
            data_docs_dir=reports_dir(config) / "data_docs",
            source_splits=connector.discover_splits(),
        )
    finally:
        connector.close()
    log.info("%s", report.summary())
    raise_on_failure(report)
    return {
        "checkpoint_id": report.checkpoint_id,
        "success": report.success,
        "suites": {s.key: s.status.value for s in report.suites},
        "data_docs": None if report.data_docs_index is None else str(report.data_docs_index),
        "notes": list(report.notes),
    }


def report(path: str | None = None, title: str | None = None) -> str:
    """Render the run report (HTML with charts); returns its path."""
    from splitkeeper.report.html import render_report

    config = load_config(config_path(path))
    store = _state_store(config)
    out = reports_dir(config)
    docs = out / "data_docs" / "index.html"
    target = render_report(
        store,
        out,
        sink_path=config.sink_path,
        title=title or f"splitkeeper run report: {config.name}",
        data_docs_index=docs if docs.exists() else None,
    )
    return str(target)


# -- recovery (triggered by hand) ------------------------------------------------------------


def check_recovery_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Validate the recovery DAG's Params beyond their JSON schema; return them normalised."""
    raw_id = params.get("checkpoint_id", "latest")
    if raw_id in (None, "", "latest"):
        checkpoint_id = None
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool) and raw_id > 0:
        checkpoint_id = raw_id
    elif isinstance(raw_id, str) and raw_id.isdigit() and int(raw_id) > 0:
        checkpoint_id = int(raw_id)
    else:
        raise InvalidParameterError("checkpoint_id", raw_id, "'latest' or a positive checkpoint id")
    mode = params.get("mode", "auto")
    if mode not in RECOVERY_MODES:
        raise InvalidParameterError("mode", mode, f"one of {', '.join(RECOVERY_MODES)}")
    parallelism = params.get("parallelism")
    if parallelism is not None and (
        isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1
    ):
        raise InvalidParameterError("parallelism", parallelism, "an integer >= 1, or null to keep it")
    return {
        "checkpoint_id": checkpoint_id,
        "mode": mode,
        "parallelism": parallelism,
        "dry_run": bool(params.get("dry_run", False)),
    }


def restore_enumerator_state(params: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Load the chosen checkpoint and show what the enumerator will restore (pool, owners, finished)."""

    chosen = check_recovery_params(params)
    config = load_config(config_path(path))
    store = _state_store(config)
    ids = store.checkpoint_ids()
    if not ids:
        raise CheckpointError(f"pipeline {config.name!r} has no completed checkpoint to recover from")
    cid = chosen["checkpoint_id"] or ids[-1]
    checkpoint = store.load_checkpoint(cid)
    if cid != ids[-1]:
        raise CheckpointError(
            f"checkpoint {cid} is not the latest ({ids[-1]}): the sink holds the records of later "
            f"checkpoints, so only the latest can be restored; available: {ids}",
            checkpoint_id=cid,
        )
    enum = checkpoint.enumerator
    return {
        **chosen,
        "checkpoint_id": cid,
        "kind": checkpoint.kind.value,
        "parallelism_before": checkpoint.parallelism,
        "pool": 0 if enum is None else len(enum.pool),
        "owned": {} if enum is None else {str(r): len(s) for r, s in sorted(enum.assignments.items())},
        "finished": 0 if enum is None else len(enum.finished),
        "ref_chain": store.ref_chain(cid),
    }


def collect_reader_reports(restored: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """What every reader reports on registration: the splits in its region's state of that checkpoint."""
    config = load_config(config_path(path))
    store = _state_store(config)
    checkpoint = store.load_checkpoint(int(restored["checkpoint_id"]))
    return {
        **restored,
        "reports": {
            str(r): [s.split_id for s in state.splits] for r, state in sorted(checkpoint.regions.items())
        },
    }


def classify_splits(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """The recovery decision for every split (the audit trail), computed without writing anything."""
    return classify_and_reassign({**reports, "dry_run": True}, path)


def reassign_and_rebalance(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Restore for real and commit the new assignment with one checkpoint (nothing when ``dry_run``)."""
    if reports["dry_run"]:
        return {"dry_run": True, "note": "dry run: nothing restored or written"}
    return classify_and_reassign(reports, path)


def classify_and_reassign(reports: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
    """Restore, classify every reported split (the audit trail) and reassign/rebalance.

    With ``dry_run`` nothing is written: the decisions and the new per-reader load are
    only printed. Otherwise one epoch runs at the (new) parallelism so the new
    assignment is committed by a checkpoint (a global restore; with ``mode=partial`` the
    restore is refused when the parallelism changes, since a partial failover cannot
    rescale).
    """
    config = load_config(config_path(path))
    mode, parallelism = reports["mode"], reports.get("parallelism")
    if mode == "partial" and parallelism not in (None, reports["parallelism_before"]):
        raise InvalidParameterError(
            "mode", mode, "'auto' or 'global' when the parallelism changes (a rescale is a global restore)"
        )
    dry_run = bool(reports["dry_run"])
    pipeline = _pipeline(config, read_only=dry_run)
    if reports.get("redistribution"):
        from splitkeeper.core.rescale import Redistribution

        pipeline.redistribution = Redistribution[str(reports["redistribution"]).upper().replace("-", "_")]
    try:
        opened = pipeline.open(
            checkpoint_id=int(reports["checkpoint_id"]), parallelism=parallelism, read_only=dry_run
        )
        summary = _open_summary(opened, pipeline.enumerator.loads())
        summary["audit"] = [
            {"split_id": d.split_id, "reader": d.reader_id, "decision": d.decision.value, "detail": d.detail}
            for d in opened.decisions[:500]
        ]
        summary["dry_run"] = bool(reports["dry_run"])
        if not reports["dry_run"]:
            run = pipeline.run(1)
            summary["checkpoints"] = run.counts()
        log.info("recovery decisions: %s", json.dumps(summary["decisions"]))
        return summary
    finally:
        pipeline.close()


def next_epoch(path: str | None = None) -> int:
    """The id the next epoch of this pipeline will get (for fault injection in demos)."""
    config = load_config(config_path(path))
    store = _state_store(config)
    ids = store.checkpoint_ids()
    return max(store.latest_plan_epoch() or 0, ids[-1] if ids else 0) + 1
