"""The ``validate`` use case: the restart checks (protocol section 6) on a checkpoint and the sink."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from splitkeeper.app.assembly import _named, _strategy, reports_dir, spark_session
from splitkeeper.app.results import (
    ValidationResult,
)
from splitkeeper.config.models import TransformKind
from splitkeeper.config.settings import PipelineConfig, ReaderMode, with_reader_mode
from splitkeeper.core.types import Split
from splitkeeper.errors import (
    InvalidParameterError,
    StateError,
)

if TYPE_CHECKING:
    from splitkeeper.core.source import SourceConnector
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.quality.checks import CheckReport

log = logging.getLogger("splitkeeper.app")


def _source_splits(
    connector: SourceConnector, store: DeltaStateStore, checkpoint_id: int | None
) -> list[Split]:
    """The source's splits as the checked checkpoint knows them: a source that checks split
    identities first learns the layout of the checkpoint's splits (a file read as a new
    version, grown or moved keeps the ids the pipeline gave it), then discovers."""
    from splitkeeper.core.source import SupportsSplitIdentityCheck

    if isinstance(connector, SupportsSplitIdentityCheck):
        checkpoint = (
            store.latest_checkpoint() if checkpoint_id is None else store.load_checkpoint(checkpoint_id)
        )
        snapshot = None if checkpoint is None else checkpoint.enumerator
        if snapshot is not None:
            live = [
                *snapshot.pool,
                *snapshot.quarantined,
                *(s for ss in snapshot.assignments.values() for s in ss),
            ]
            connector.check_splits(live, snapshot.finished_identities)
    splits: list[Split] = connector.discover_splits()
    return splits


def _check_fingerprint(
    config: PipelineConfig, store: DeltaStateStore, connector: SourceConnector, source_splits: Sequence[Split]
) -> dict[str, object]:
    """What the restart checks of the latest checkpoint read: the Delta version of every state and
    sink-side table, the source's fingerprint, subscriptions and splits, and the checks' settings
    (the validations table's ``tables``, :mod:`splitkeeper.delta.validations`). No Spark."""
    import hashlib

    from splitkeeper.delta.schemas import STATE_TABLES

    splits = hashlib.sha256(
        "\n".join(sorted(f"{s.split_id}\t{s.position}\t{s.end}" for s in source_splits)).encode()
    ).hexdigest()
    from splitkeeper.app.sink import sink_reader

    return {
        "state": {name: store.table_version(name) for name in STATE_TABLES},
        "sink": dict(sink_reader(config).versions()),
        "source": {
            "fingerprint": connector.fingerprint(),
            "subscriptions": sorted(connector.subscriptions()),
            "splits_sha256": splits,
        },
        "settings": {
            "strategy": config.strategy,
            "capacities": {str(k): v for k, v in sorted(dict(config.weighted.capacities).items())},
            "max_consecutive_failures": config.checkpoint.max_consecutive_failures,
            "reader_mode": config.source.reader_mode.value,
        },
    }


@_named
def validate(
    config: PipelineConfig,
    checkpoint_id: int | None = None,
    *,
    content: bool = False,
    skip_validated: bool = False,
    reader_mode: ReaderMode | None = None,
) -> ValidationResult:
    """The restart checks (protocol section 6, Great Expectations) on a checkpoint and the sink.

    ``content``: also compare each finished split's committed values with the source's data
    (bounded sources). The sink holds transformed values, so this holds only for a pipeline
    whose transform was always the identity; it is refused with another transform.

    A run of the checks on the latest checkpoint that passes is recorded in the validations table
    (:mod:`splitkeeper.delta.validations`) with the fingerprint of what they read.
    ``skip_validated`` (the DAGs' validate task): when the latest checkpoint passed already with
    the same fingerprint (nothing committed, compacted or discovered since), the checks are not run
    again: the result names that run and its Data Docs (``already_validated_at``), and no Spark
    session starts. An explicit ``checkpoint_id`` or ``content`` always runs the checks.

    ``reader_mode``: the readers' mode the checked run had (None: the file's): legacy readers
    keep what they restored, so the balance suite is skipped for them.

    Raises InvariantViolation naming the split ids when a check fails.
    """
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.delta.validations import ValidationRecords
    from splitkeeper.quality.checks import raise_on_failure, resolve_actions, run_restart_checks
    from splitkeeper.sources import build_source
    from splitkeeper.transforms import identity, resolve_transform

    config = with_reader_mode(config, reader_mode)
    spark_transform = config.transform_kind is TransformKind.SPARK
    if content and (spark_transform or resolve_transform(config.transform_function) is not identity):
        raise InvalidParameterError(
            "content",
            content,
            "False for a pipeline with a transform",
            hint=f"the sink holds the values transform {config.transform_function} made, "
            "not the file's lines",
        )
    connector = build_source(config.source)
    try:
        store = DeltaStateStore(config.state.path, config.name, connector.fingerprint(), read_only=True)
        ids = store.ids() if checkpoint_id is None and not content else []
        latest = ids[-1] if ids else None
        source_splits = _source_splits(connector, store, checkpoint_id)
        fingerprint = None if latest is None else _check_fingerprint(config, store, connector, source_splits)
        if latest is not None and fingerprint is not None and skip_validated:
            already = _passed_already(config, latest, fingerprint)
            if already is not None:
                return already
        report = run_restart_checks(
            spark_session,  # started only when the sink has data to scan
            store,
            sink_reader(config),
            checkpoint_id=checkpoint_id,
            strategy=_strategy(config),
            max_consecutive_failures=config.checkpoint.max_consecutive_failures,
            subscriptions=connector.subscriptions(),
            data_docs_dir=reports_dir(config) / "data_docs",
            source_splits=source_splits,
            content_reader=connector.reader() if content and connector.bounded else None,
            deferred_assignment=config.source.deferred_assignment,
            actions=resolve_actions(config.checks.actions),
        )
        log.info("%s", report.summary())
        if not report.success:  # recorded before it is raised: the run report says the checks failed
            _record_failed_validation(config, report, fingerprint)
        raise_on_failure(report)
        result = ValidationResult(
            pipeline=config.name,
            checkpoint_id=report.checkpoint_id,
            success=report.success,
            suites={s.key: s.status.value for s in report.suites},
            data_docs=None if report.data_docs_index is None else str(report.data_docs_index),
            notes=tuple(report.notes),
        )
        # recorded only when what the checks read did not move while they ran (a run committing beside)
        if (
            fingerprint is not None
            and report.checkpoint_id == latest
            and _check_fingerprint(config, store, connector, _source_splits(connector, store, None))
            == fingerprint
        ):
            try:
                ValidationRecords(StateTables(config.state.path), config.name).record(
                    latest, fingerprint, result.suites, result.data_docs
                )
            except (StateError, OSError) as err:  # the checks passed; only the shortcut is lost
                log.warning("the passed checks of checkpoint %s were not recorded: %s", latest, err)
    finally:
        connector.close()
    return result


def _passed_already(
    config: PipelineConfig, latest: int, fingerprint: Mapping[str, Any]
) -> ValidationResult | None:
    """The result naming the passed run of the checks on ``latest`` with this ``fingerprint`` (what
    they read), or None when there is none: they must run. No Spark."""
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.delta.validations import ValidationRecords

    passed = ValidationRecords(StateTables(config.state.path, read_only=True), config.name).passed(
        latest, fingerprint
    )
    if passed is None:
        return None
    note = (
        f"checkpoint {latest} was validated at {passed.validated_at.isoformat()} by "
        f"{passed.validated_by} and nothing it read changed since (no new checkpoint, sink or "
        f"state commit, source change): the checks were not run again; their report: "
        f"{passed.data_docs or 'no Data Docs'}"
    )
    log.info("%s", note)
    return ValidationResult(
        pipeline=config.name,
        checkpoint_id=latest,
        success=True,
        suites=passed.suites,
        data_docs=passed.data_docs,
        notes=(note,),
        already_validated_at=passed.validated_at.isoformat(),
    )


@_named
def validated_already(
    config: PipelineConfig, reader_mode: ReaderMode | None = None
) -> ValidationResult | None:
    """What ``validate(skip_validated=True)`` returns without running the checks (the latest
    checkpoint passed them and nothing they read changed since), or None when they must run.
    Read-only, no Spark: a task on a cluster master asks this before it submits the checks."""
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sources import build_source

    config = with_reader_mode(config, reader_mode)
    connector = build_source(config.source)
    try:
        store = DeltaStateStore(config.state.path, config.name, connector.fingerprint(), read_only=True)
        ids = store.ids()
        if not ids:
            return None
        splits = _source_splits(connector, store, None)
        return _passed_already(config, ids[-1], _check_fingerprint(config, store, connector, splits))
    finally:
        connector.close()


def _record_failed_validation(
    config: PipelineConfig, report: CheckReport, fingerprint: Mapping[str, Any] | None
) -> None:
    """A failed run of the restart checks in the validations table (rule 1 of
    :mod:`splitkeeper.delta.validations`): the report task reads it. A store error only logs."""
    from splitkeeper.delta.tables import StateTables
    from splitkeeper.delta.validations import ValidationRecords

    violations = report.violations()
    detail = "; ".join(f"{v.kind.value}: {v.detail}" for v in violations[:10])
    if len(violations) > 10:
        detail += f" (and {len(violations) - 10} more)"
    try:
        ValidationRecords(StateTables(config.state.path), config.name).record(
            report.checkpoint_id,
            fingerprint or {},
            {s.key: s.status.value for s in report.suites},
            None if report.data_docs_index is None else str(report.data_docs_index),
            verdict="failed",
            detail=detail[:4000],
        )
    except (StateError, OSError) as err:
        log.warning("the failed checks of checkpoint %s were not recorded: %s", report.checkpoint_id, err)
