"""The Delta-backed state store of one pipeline: plans, checkpoints, enumerator state, audit.

One :class:`DeltaStateStore` per driver process and pipeline. It owns the Delta tables
under ``<root>/<table>`` whose schemas are the ``state/<table>.ddl`` files (see
``state/README.md`` for each table and the commit order). It is the persistent
implementation of :class:`splitkeeper.core.checkpoint.CheckpointStore`: the chain and
retention rules are the core's; this module stores, loads and deletes rows.

Commit order of one epoch (runtime design, steps 2 and 6):

1. :meth:`DeltaStateStore.write_plan` before any region reads (write-ahead plan);
2. the sink commit (:mod:`splitkeeper.runtime.sink`);
3. :meth:`DeltaStateStore.commit_checkpoint`: enumerator_state rows, audit rows, then the
   ``checkpoints`` row LAST. Only that row makes the checkpoint exist; rows written by
   an attempt that never got its ``checkpoints`` row are never read (each row carries the
   attempt id the ``checkpoints`` row names) and retention removes them.

Two runs of the same pipeline that plan the same epoch or commit the same checkpoint
collide in Delta's optimistic concurrency (or find the row already there): the loser gets
:class:`~splitkeeper.errors.ConcurrentRunError` naming the pipeline and the epoch.

Restore reads the rows of one checkpoint id only (data skipping on ``checkpoint_id``);
Delta log checkpoints (``delta.checkpointInterval``) bound log replay and
:meth:`DeltaStateStore.retain` compacts the tables every ``compact_every`` checkpoints, so
restore time does not grow with history (:func:`measure_state_store` measures it).
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from splitkeeper.core.checkpoint import CheckpointStore
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import CheckpointError, ConcurrentRunError, InvalidParameterError, StateError
from splitkeeper.runtime import serde
from splitkeeper.runtime.serde import EpochPlan, PlannedRange

# Audit decisions kept when retention deletes their checkpoint: where a split started and which
# of its ranges were skipped as lost. The restart checks read them for the split's whole life.
_LIFE_DECISIONS = ", ".join(
    f"'{d.value}'" for d in (RecoveryDecision.DISCOVERED, RecoveryDecision.SKIPPED_LOST_RANGE)
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "DeltaStateStore",
    "EpochPlan",
    "PlannedRange",
    "StateCommit",
    "StateStoreMeasurement",
    "TimelineEntry",
    "delta_snapshot",
    "delta_table_version",
    "is_concurrent_modification",
    "measure_state_store",
]

log = logging.getLogger(__name__)

# (checkpoint without split state, attempt id) per committed checkpoint, ascending ids.
_Metadata = tuple[tuple[CompletedCheckpoint, str], ...]

#: Table properties of every state table. Many small commits (a few per epoch):
#: a Delta log checkpoint every 10 commits bounds log replay on restore; Serializable
#: isolation makes even concurrent blind appends of a second run conflict; deletion
#: vectors make retention deletes cheap (no file rewrite); statistics only on the key
#: columns keep the per-commit stats small and the big struct columns out of them.
BASE_TABLE_PROPERTIES: dict[str, str] = {
    "delta.checkpointInterval": "10",
    "delta.isolationLevel": "Serializable",
    "delta.enableDeletionVectors": "true",
    "delta.checkpoint.writeStatsAsStruct": "true",
    "delta.checkpoint.writeStatsAsJson": "false",
}
#: Partition column per table. Restore and retention address one checkpoint (epoch) at
#: a time: partition pruning finds its rows without reading others, and retention's
#: deletes of whole checkpoints are metadata-only commits (no file is read or rewritten).
PARTITION_COLUMNS: dict[str, str | None] = {
    "pipeline": None,
    "epoch_plans": "epoch_id",
    "checkpoints": "checkpoint_id",
    "enumerator_state": "checkpoint_id",
    "audit": "checkpoint_id",
    "checkpoint_log": None,
}
_STATS_COLUMNS: dict[str, str] = {
    "pipeline": "name",
    "epoch_plans": "region_id",
    "checkpoints": "kind",
    "enumerator_state": "attempt_id",
    "audit": "attempt_id",
    "checkpoint_log": "checkpoint_id",
}

# Delta's commit-conflict exceptions (io.delta.exceptions.*), matched by class name.
_CONFLICT_NAMES = frozenset(
    {
        "DeltaConcurrentModificationException",
        "ConcurrentWriteException",
        "ConcurrentAppendException",
        "ConcurrentDeleteReadException",
        "ConcurrentDeleteDeleteException",
        "ConcurrentTransactionException",
        "MetadataChangedException",
        "ProtocolChangedException",
    }
)


def is_concurrent_modification(err: BaseException) -> bool:
    """True when ``err`` is (or is caused by) a Delta commit conflict.

    Delta raises ``io.delta.exceptions.Concurrent*Exception`` in the JVM; through py4j
    it arrives as delta-spark's Python class of the same name, as a PySpark
    ``CapturedException`` or as a raw ``Py4JJavaError``, possibly wrapped. This walks the
    Python classes, the JVM exception and its cause chain, and matches class names.
    """
    seen: set[int] = set()
    todo: list[Any] = [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, BaseException):
            if {c.__name__ for c in type(current).__mro__} & _CONFLICT_NAMES:
                return True
            condition = getattr(current, "getCondition", None)
            if callable(condition):
                try:
                    if str(condition() or "").startswith("DELTA_CONCURRENT"):
                        return True
                except Exception:  # noqa: BLE001 - a broken accessor is just not a match
                    pass
            todo += [
                getattr(current, "java_exception", None),
                getattr(current, "_origin", None),
                getattr(current, "_cause", None),
                current.__cause__,
            ]
            continue
        try:  # a py4j JavaObject (java.lang.Throwable)
            name = str(current.getClass().getName())
            todo.append(current.getCause())
        except Exception:  # noqa: BLE001 - not a JVM throwable
            continue
        if name.rsplit(".", 1)[-1] in _CONFLICT_NAMES:
            return True
    return False


def delta_table_version(spark: SparkSession, path: str) -> int:
    """The latest version of the Delta table at ``path``, -1 when there is none.

    Asks the JVM ``DeltaLog`` (the engine's own view, refreshed by listing ``_delta_log``;
    no Spark job). Used to key caches on the table version.
    """
    return int(delta_snapshot(spark, path).version())


def delta_snapshot(spark: SparkSession, path: str) -> Any:
    """The refreshed JVM Delta ``Snapshot`` of ``path`` (``DeltaLog.update()``), through py4j.

    Internal Delta API (stable across Delta 3 and 4); the one place splitkeeper touches
    it. Its ``version()`` is -1 for a path that holds no table yet.
    """
    jvm: Any = spark._jvm
    if jvm is None:
        raise StateError("the Delta log is read through the JVM: use a classic (not Connect) SparkSession")
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    none = jvm.scala.Option.empty()
    return delta_log.update(False, none, none)


# ---------------------------------------------------------------------------------------
# Value types returned by the store
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateCommit:
    """What :meth:`DeltaStateStore.commit_checkpoint` wrote.

    ``commit_ms`` is recorded in the checkpoints row: the time from the start of the
    commit until the checkpoints row was submitted (enumerator_state and audit writes).
    ``total_ms`` includes writing the checkpoints row itself.
    """

    checkpoint_id: int
    attempt_id: str
    commit_ms: int
    total_ms: int


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One checkpoint attempt as the timeline shows it: completed (global/regional) or aborted."""

    checkpoint_id: int
    kind: CheckpointKind
    outcomes: dict[int, RegionOutcome]
    ref_checkpoint_ids: dict[int, int]
    at: datetime
    commit_ms: int | None = None
    reason: str = ""
    run_id: str = ""

    @property
    def failed_regions(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, o in self.outcomes.items() if o is not RegionOutcome.ACK))


def _utc_from_micros(micros: int | None) -> datetime:
    return datetime.fromtimestamp((micros or 0) / 1_000_000, tz=UTC)


def _is_local_path(root: str) -> bool:
    return "://" not in root and not root.startswith("file:")


# ---------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------


class DeltaStateStore(CheckpointStore):
    """The persistent state of one pipeline in Delta tables under ``root``.

    Created on the driver at start; the constructor creates missing tables (idempotent:
    any number of stores may open the same directory) and claims or checks the
    ``pipeline`` row: a directory holding another pipeline's state, or state written for
    a different source fingerprint, raises :class:`StateError` (pass
    ``accept_source_change=True`` to adopt the state for a changed source).

    Not shared across processes other than through Delta; methods may be called from
    several driver threads. ``run_id`` (default: a fresh uuid) tags the rows this
    process writes, so the timeline and errors can say which run wrote what.
    """

    def __init__(
        self,
        spark: SparkSession,
        root: str | os.PathLike[str],
        pipeline_name: str,
        source_fingerprint: str,
        *,
        run_id: str | None = None,
        compact_every: int = 50,
        accept_source_change: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(pipeline_name, str) or not pipeline_name.strip():
            raise InvalidParameterError("pipeline_name", pipeline_name, "a non-empty name")
        if not isinstance(source_fingerprint, str) or not source_fingerprint:
            raise InvalidParameterError("source_fingerprint", source_fingerprint, "a non-empty string")
        if isinstance(compact_every, bool) or not isinstance(compact_every, int) or compact_every < 1:
            raise InvalidParameterError("compact_every", compact_every, "an integer >= 1")
        root_text = os.fspath(root)
        if not root_text:
            raise InvalidParameterError("root", root_text, "a directory path or URI")
        self.spark = spark
        self.root = os.path.abspath(root_text) if _is_local_path(root_text) else root_text.rstrip("/")
        self.pipeline_name = pipeline_name
        self.source_fingerprint = source_fingerprint
        self.run_id = run_id or uuid.uuid4().hex
        self.compact_every = compact_every
        self._lock = threading.Lock()
        self._commits_since_compaction = 0
        self._schemas: dict[str, StructType] = {}
        self._arrow_schemas: dict[str, Any] = {}
        self._meta_cache: tuple[int, _Metadata] | None = None
        self._ensure_tables()
        self._claim_pipeline(accept_source_change)

    # -- tables -----------------------------------------------------------------------

    def table_path(self, table: str) -> str:
        """Where ``table`` lives: ``<root>/<table>``."""
        if table not in serde.STATE_TABLES:
            raise InvalidParameterError("table", table, f"one of {', '.join(serde.STATE_TABLES)}")
        return f"{self.root}/{table}"

    def schema(self, table: str) -> StructType:
        """The Spark schema of ``table``, parsed from ``state/<table>.ddl``."""
        if table not in self._schemas:
            from pyspark.sql.types import StructType, _parse_datatype_string

            parsed = _parse_datatype_string(serde.read_ddl(table))
            assert isinstance(parsed, StructType)
            self._schemas[table] = parsed
        return self._schemas[table]

    def _ensure_tables(self) -> None:
        from delta.tables import DeltaTable

        for table in serde.STATE_TABLES:
            path = self.table_path(table)
            if not DeltaTable.isDeltaTable(self.spark, path):
                props = {**BASE_TABLE_PROPERTIES, "delta.dataSkippingStatsColumns": _STATS_COLUMNS[table]}
                props_sql = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
                ddl = serde.read_ddl(table)
                partition = PARTITION_COLUMNS[table]
                partitioned = f"PARTITIONED BY ({partition}) " if partition else ""
                try:
                    self.spark.sql(
                        f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({ddl}) USING DELTA "
                        f"{partitioned}TBLPROPERTIES ({props_sql})"
                    )
                except Exception as err:
                    # Another store created it at the same moment: fine if it exists now.
                    if not DeltaTable.isDeltaTable(self.spark, path):
                        raise StateError(
                            f"cannot create state table {table} at {path}: {err}", table=table, path=path
                        ) from err
            metadata = delta_snapshot(self.spark, path).metadata()
            partitions = str(metadata.partitionColumns().mkString(","))
            actual = (list(metadata.schema().fieldNames()), [c for c in partitions.split(",") if c])
            partition = PARTITION_COLUMNS[table]
            expected = (self.schema(table).fieldNames(), [partition] if partition else [])
            if actual != expected:
                raise StateError(
                    f"state table {table} at {path} has columns {actual[0]} partitioned by {actual[1]}, but "
                    f"splitkeeper expects {expected[0]} partitioned by {expected[1]} (state/{table}.ddl): "
                    "the directory was written by another splitkeeper state format; use a fresh state "
                    "directory (or migrate the table)",
                    table=table,
                    path=path,
                )

    def _read(self, table: str, as_of: datetime | str | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if as_of is not None:
            reader = reader.option("timestampAsOf", _timestamp_text(as_of))
        return reader.load(self.table_path(table))

    def _frame(self, table: str, rows: Sequence[Mapping[str, Any]]) -> DataFrame:
        """A DataFrame of ``rows`` with the table's schema, built through Arrow (no Python workers)."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = self.schema(table)
        if table not in self._arrow_schemas:
            self._arrow_schemas[table] = to_arrow_schema(schema)
        names = schema.fieldNames()
        data = pa.Table.from_pylist(
            [{n: row.get(n) for n in names} for row in rows], self._arrow_schemas[table]
        )
        return self.spark.createDataFrame(data, schema)

    def _append(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._frame(table, rows).coalesce(1).write.format("delta").mode("append").save(
                self.table_path(table)
            )

    def _append_all(self, batches: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> None:
        """Append to several tables concurrently (one Spark job each); re-raise the first failure."""
        todo = [(table, rows) for table, rows in batches if rows]
        if len(todo) <= 1:
            for table, rows in todo:
                self._append(table, rows)
            return
        with ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="splitkeeper-state") as pool:
            futures = [pool.submit(self._append, table, rows) for table, rows in todo]
            for future in futures:
                future.result()

    def _merge_insert(self, table: str, rows: Sequence[Mapping[str, Any]], condition: str) -> int:
        """MERGE ``rows`` into ``table``, inserting only when ``condition`` matches no target row.

        Returns the number of inserted rows. Delta conflicts propagate.
        """
        from delta.tables import DeltaTable

        target = DeltaTable.forPath(self.spark, self.table_path(table))
        result = (
            target.alias("t")
            .merge(self._frame(table, rows).alias("s"), condition)
            .whenNotMatchedInsertAll()
            .execute()
        )
        metrics = result.first() if result is not None else None
        if metrics is None or "num_inserted_rows" not in metrics.asDict():
            raise StateError(f"MERGE into {table} returned no metrics; Delta {result!r} is not supported")
        return int(metrics["num_inserted_rows"])

    def _delete(self, checkpoint_id: int) -> None:
        """Storage primitive of the core store: delete one checkpoint (no chain check); see :meth:`retain`."""
        self._delete_checkpoints([checkpoint_id], self._metadata()[0])

    def _put(self, completed: CompletedCheckpoint) -> None:
        """Storage primitive of the core store: commit a checkpoint without audit rows."""
        self.commit_checkpoint(completed)

    # -- pipeline ---------------------------------------------------------------------

    def _claim_pipeline(self, accept_source_change: bool) -> None:
        now = datetime.now(UTC)
        claim = [
            {
                "name": self.pipeline_name,
                "source_fingerprint": self.source_fingerprint,
                "state_format": serde.STATE_FORMAT,
                "created_at": now,
            }
        ]
        rows = self._read("pipeline").collect()
        if not rows:
            try:
                self._merge_insert("pipeline", claim, "true")
            except Exception as err:
                if not is_concurrent_modification(err):
                    raise
                # Another store claimed the directory at the same time; check what it wrote.
            rows = self._read("pipeline").collect()
        if len(rows) != 1:
            raise StateError(
                f"state directory {self.root} has {len(rows)} rows in its pipeline table (one expected): "
                "the state is corrupt; restore it from a backup or use a fresh directory",
                root=self.root,
            )
        owner = rows[0]
        if owner["name"] != self.pipeline_name:
            raise StateError(
                f"state directory {self.root} belongs to pipeline {owner['name']!r}, not to pipeline "
                f"{self.pipeline_name!r}: give pipeline {self.pipeline_name!r} its own state.path, or run "
                f"pipeline {owner['name']!r} against this directory",
                root=self.root,
                owner=owner["name"],
                pipeline=self.pipeline_name,
            )
        if owner["state_format"] != serde.STATE_FORMAT:
            raise StateError(
                f"state directory {self.root} has state format {owner['state_format']}, this splitkeeper "
                f"writes format {serde.STATE_FORMAT}: use a fresh state directory",
                root=self.root,
            )
        if owner["source_fingerprint"] != self.source_fingerprint:
            if not accept_source_change:
                raise StateError(
                    f"state directory {self.root} of pipeline {self.pipeline_name!r} was written for source "
                    f"fingerprint {owner['source_fingerprint']!r}, but the configured source has fingerprint "
                    f"{self.source_fingerprint!r}: the source changed (kind, location or split layout). "
                    "Use a "
                    "fresh state directory, or accept the change explicitly (accept_source_change=True)",
                    root=self.root,
                    stored=owner["source_fingerprint"],
                    configured=self.source_fingerprint,
                )
            from delta.tables import DeltaTable

            log.warning(
                "pipeline %s: adopting state written for source %s for source %s",
                self.pipeline_name,
                owner["source_fingerprint"],
                self.source_fingerprint,
            )
            DeltaTable.forPath(self.spark, self.table_path("pipeline")).update(
                set={"source_fingerprint": _sql_literal(self.source_fingerprint)}
            )

    # -- epoch plans ------------------------------------------------------------------

    def write_plan(
        self,
        epoch_id: int,
        plan: EpochPlan | Mapping[int, Iterable[Any]],
        run_id: str | None = None,
    ) -> EpochPlan:
        """Persist the plan of epoch ``epoch_id`` before any region reads it (write-ahead).

        Called once per epoch by the driver. ``plan`` maps every region to its ranges
        (see :func:`serde.coerce_plan`); regions with nothing to read map to ``()``.
        Insert-if-absent: if the epoch already has a plan (a duplicate or concurrent
        planner) nothing is written and ConcurrentRunError names the pipeline, the epoch
        and the run that planned it; a replay must :meth:`read_plan` instead.
        Returns the plan as stored.
        """
        _check_id("epoch_id", epoch_id)
        stored = serde.coerce_plan(epoch_id, plan, run_id or self.run_id)
        if not stored.regions:
            raise InvalidParameterError(
                "plan", {}, "at least one region (regions with nothing to read map to ())"
            )
        planned_at = datetime.now(UTC)
        rows = [
            {**row, "run_id": stored.run_id, "planned_at": planned_at} for row in serde.plan_to_rows(stored)
        ]
        try:
            inserted = self._merge_insert(
                "epoch_plans", rows, f"t.epoch_id = {epoch_id} AND t.epoch_id = s.epoch_id"
            )
        except Exception as err:
            if is_concurrent_modification(err):
                raise ConcurrentRunError(
                    f"pipeline {self.pipeline_name!r}: another run wrote the plan of epoch {epoch_id} "
                    "at the same "
                    "time; only one run may drive a pipeline",
                    pipeline=self.pipeline_name,
                    epoch_id=epoch_id,
                ) from err
            raise
        if inserted != len(rows):
            existing = (
                self._read("epoch_plans")
                .where(f"epoch_id = {epoch_id}")
                .select("run_id")
                .distinct()
                .collect()
            )
            by = ", ".join(sorted(r["run_id"] for r in existing)) or "unknown"
            raise ConcurrentRunError(
                f"pipeline {self.pipeline_name!r}: epoch {epoch_id} is already planned (by run {by}); "
                "another run is driving this pipeline, or this run must replay epoch "
                f"{epoch_id} with read_plan({epoch_id}) "
                "instead of planning it again",
                pipeline=self.pipeline_name,
                epoch_id=epoch_id,
                planned_by=by,
            )
        return stored

    def read_plan(self, epoch_id: int) -> EpochPlan:
        """The plan of ``epoch_id`` exactly as written; StateError naming the latest planned epoch if none."""
        rows = [r.asDict() for r in self._read("epoch_plans").where(f"epoch_id = {int(epoch_id)}").collect()]
        if not rows:
            raise StateError(
                f"pipeline {self.pipeline_name!r} has no plan for epoch {epoch_id} "
                f"(latest planned epoch: {self.latest_plan_epoch()})",
                pipeline=self.pipeline_name,
                epoch_id=epoch_id,
            )
        return serde.plan_from_rows(int(epoch_id), rows)

    def latest_plan_epoch(self) -> int | None:
        """The highest planned epoch id, or None when nothing was planned yet."""
        row = self._read("epoch_plans").agg({"epoch_id": "max"}).first()
        value = None if row is None else row[0]
        return None if value is None else int(value)

    # -- checkpoints: write -----------------------------------------------------------

    def commit_checkpoint(
        self, completed: CompletedCheckpoint, audit: Sequence[AuditRecord] = ()
    ) -> StateCommit:
        """Persist a completed (GLOBAL or REGIONAL) checkpoint with its audit records.

        Called by the driver once per completed checkpoint, after the sink commit.
        Writes the enumerator_state rows, then the audit rows, then the checkpoints row
        LAST with MERGE insert-if-absent (it alone marks the checkpoint complete). The
        core's rules apply first (not ABORTED, refs kept: CheckpointError). A checkpoint
        id not newer than the latest committed one, or a second writer of the same id,
        raises ConcurrentRunError naming the pipeline and the id; the loser's rows are
        removed and never read. Calling it twice with the same checkpoint fails the second
        time: the first commit stays intact.
        """
        started = time.perf_counter()
        row = serde.checkpoint_to_row(completed)
        checkpoint_id = completed.checkpoint_id
        _check_id("checkpoint_id", checkpoint_id)
        read_version, metadata = self._metadata()
        meta = CheckpointStore()
        for stored, _attempt in metadata:
            meta._put(stored)
        ids = meta.ids()
        if ids and checkpoint_id <= ids[-1]:
            raise self._checkpoint_conflict(checkpoint_id, ids[-1])
        light = _metadata_of(completed)
        meta.add(light)  # the core's rules: refs must be kept
        attempt_id = uuid.uuid4().hex
        key = {"checkpoint_id": checkpoint_id, "attempt_id": attempt_id}
        enumerator_rows = (
            [] if completed.enumerator is None else serde.enumerator_to_rows(completed.enumerator)
        )
        audit_rows = [serde.audit_to_row(record, seq) for seq, record in enumerate(audit)]
        try:
            self._append_all(
                [
                    ("enumerator_state", [{**r, **key} for r in enumerator_rows]),
                    ("audit", [{**r, **key} for r in audit_rows]),
                ]
            )
            commit_ms = round((time.perf_counter() - started) * 1000)
            row.update(key, run_id=self.run_id, created_at=datetime.now(UTC), commit_ms=commit_ms)
            inserted = self._merge_insert(
                "checkpoints",
                [row],
                f"t.checkpoint_id >= {checkpoint_id} AND t.checkpoint_id >= s.checkpoint_id",
            )
        except Exception as err:
            if not is_concurrent_modification(err):
                raise
            self._discard_attempt(checkpoint_id, attempt_id)
            raise self._checkpoint_conflict(checkpoint_id, None) from err
        if inserted != 1:
            self._discard_attempt(checkpoint_id, attempt_id)
            raise self._checkpoint_conflict(checkpoint_id, self._latest_id())
        self._after_own_write(read_version, lambda entries: (*entries, (light, attempt_id)))
        with self._lock:
            self._commits_since_compaction += 1
        total_ms = round((time.perf_counter() - started) * 1000)
        return StateCommit(checkpoint_id, attempt_id, commit_ms, total_ms)

    def add(self, completed: CompletedCheckpoint) -> None:
        """CheckpointStore contract: :meth:`commit_checkpoint` without audit records."""
        self.commit_checkpoint(completed)

    def _checkpoint_conflict(self, checkpoint_id: int, latest: int | None) -> ConcurrentRunError:
        if latest is not None and latest > checkpoint_id:
            what = f"checkpoint {checkpoint_id} is older than the latest committed checkpoint {latest}"
        elif latest is not None and latest == checkpoint_id:
            what = f"checkpoint {checkpoint_id} is already committed"
        else:
            what = f"another run committed checkpoint {checkpoint_id} at the same time"
        return ConcurrentRunError(
            f"pipeline {self.pipeline_name!r}: {what}; only one run may drive a pipeline, and checkpoint ids "
            "must increase (restart from latest_checkpoint())",
            pipeline=self.pipeline_name,
            epoch_id=checkpoint_id,
            latest=latest,
        )

    def _discard_attempt(self, checkpoint_id: int, attempt_id: str) -> None:
        """Best effort: remove the rows of an attempt that lost (they are never read anyway)."""
        from delta.tables import DeltaTable

        for table in ("enumerator_state", "audit"):
            try:
                DeltaTable.forPath(self.spark, self.table_path(table)).delete(
                    f"checkpoint_id = {checkpoint_id} AND attempt_id = {_sql_literal(attempt_id)}"
                )
            except Exception as err:  # noqa: BLE001 - orphans are harmless; retention removes them
                log.warning(
                    "could not remove rows of lost attempt %s of checkpoint %s: %s",
                    attempt_id,
                    checkpoint_id,
                    err,
                )

    def log_attempt(
        self,
        checkpoint_id: int,
        outcomes: Mapping[int, RegionOutcome],
        reason: str = "",
        *,
        kind: CheckpointKind = CheckpointKind.ABORTED,
    ) -> None:
        """Record a checkpoint attempt that did not complete, for :meth:`timeline`.

        Called by the driver when the coordinator aborts a checkpoint; ``outcomes`` is
        every region's outcome, ``reason`` the coordinator's sentence. Completed
        checkpoints are recorded by :meth:`commit_checkpoint`, not here. May be called
        twice (the timeline then shows the attempt twice).
        """
        _check_id("checkpoint_id", checkpoint_id)
        if kind is not CheckpointKind.ABORTED:
            raise InvalidParameterError(
                "kind",
                getattr(kind, "value", kind),
                "aborted",
                hint="completed checkpoints go through commit_checkpoint",
            )
        self._append(
            "checkpoint_log",
            [
                {
                    "checkpoint_id": checkpoint_id,
                    "kind": kind.value,
                    "regions": [
                        {"region_id": int(r), "outcome": RegionOutcome(o).value}
                        for r, o in sorted(outcomes.items())
                    ],
                    "reason": reason,
                    "run_id": self.run_id,
                    "logged_at": datetime.now(UTC),
                }
            ],
        )

    # -- checkpoints: read ------------------------------------------------------------

    def ids(self) -> list[int]:
        """Completed checkpoint ids, ascending (CheckpointStore contract)."""
        return [light.checkpoint_id for light, _attempt in self._metadata()[1]]

    def checkpoint_ids(self) -> list[int]:
        """Completed checkpoint ids, ascending."""
        return self.ids()

    def _latest_id(self) -> int | None:
        metadata = self._metadata()[1]
        return metadata[-1][0].checkpoint_id if metadata else None

    def _checkpoint_from(self, row: Any, as_of: datetime | str | None) -> CompletedCheckpoint:
        data = row.asDict(recursive=True)
        enumerator_rows: list[dict[str, Any]] = []
        if data.get("enumerator") is not None:
            enumerator_rows = [
                r.asDict()
                for r in self._read("enumerator_state", as_of)
                .where(f"checkpoint_id = {int(data['checkpoint_id'])}")
                .where(f"attempt_id = {_sql_literal(data['attempt_id'])}")
                .collect()
            ]
        return serde.checkpoint_from_rows(data, enumerator_rows)

    def _load(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        rows = self._read("checkpoints").where(f"checkpoint_id = {int(checkpoint_id)}").collect()
        return self._checkpoint_from(rows[0], None) if rows else None

    def load_checkpoint(
        self, checkpoint_id: int, *, as_of: datetime | str | None = None
    ) -> CompletedCheckpoint:
        """The checkpoint ``checkpoint_id`` exactly as committed (restore any chosen one).

        ``as_of`` reads the tables as they were at that time (Delta time travel), which
        also finds checkpoints retention has deleted since, as long as the files were not
        vacuumed. CheckpointError names the id and the available ids if there is none.
        """
        try:
            rows = self._read("checkpoints", as_of).where(f"checkpoint_id = {int(checkpoint_id)}").collect()
            found = self._checkpoint_from(rows[0], as_of) if rows else None
        except Exception as err:
            if as_of is None:
                raise
            raise CheckpointError(
                f"cannot read the state of pipeline {self.pipeline_name!r} as of {as_of}: {err}",
                checkpoint_id=checkpoint_id,
                as_of=str(as_of),
            ) from err
        if found is None:
            at = "" if as_of is None else f" as of {as_of}"
            available = self.ids() if as_of is None else self._ids_as_of(as_of)
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of pipeline {self.pipeline_name!r} is not in the state store "
                f"at {self.root}{at} (available: {available})",
                checkpoint_id=checkpoint_id,
                available=available,
            )
        return found

    def _ids_as_of(self, as_of: datetime | str) -> list[int]:
        return sorted(int(r[0]) for r in self._read("checkpoints", as_of).select("checkpoint_id").collect())

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint (what a restart restores), or None when there is none."""
        _version, metadata = self._metadata()
        if not metadata:
            return None
        latest = metadata[-1][0].checkpoint_id
        rows = self._read("checkpoints").where(f"checkpoint_id = {latest}").collect()
        if not rows:  # deleted since the metadata was read: read again
            return self.latest_checkpoint()
        return self._checkpoint_from(rows[0], None)

    def latest(self) -> CompletedCheckpoint | None:
        """CheckpointStore contract: :meth:`latest_checkpoint`."""
        return self.latest_checkpoint()

    def latest_global(self) -> CompletedCheckpoint | None:
        rows = (
            self._read("checkpoints")
            .where(f"kind = '{CheckpointKind.GLOBAL.value}'")
            .orderBy("checkpoint_id", ascending=False)
            .limit(1)
            .collect()
        )
        return self._checkpoint_from(rows[0], None) if rows else None

    def audit_for(self, checkpoint_id: int) -> list[AuditRecord]:
        """The audit records committed with ``checkpoint_id``, in their order; CheckpointError if unknown."""
        head = (
            self._read("checkpoints")
            .where(f"checkpoint_id = {int(checkpoint_id)}")
            .select("attempt_id")
            .collect()
        )
        if not head:
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of pipeline {self.pipeline_name!r} is not in the state store "
                f"(available: {self.ids()})",
                checkpoint_id=checkpoint_id,
            )
        rows = (
            self._read("audit")
            .where(f"checkpoint_id = {int(checkpoint_id)}")
            .where(f"attempt_id = {_sql_literal(head[0]['attempt_id'])}")
            .collect()
        )
        return serde.audit_from_rows(r.asDict() for r in rows)

    def timeline(self) -> list[TimelineEntry]:
        """Every kept checkpoint and every logged aborted attempt, by id then time.

        Shows global/regional/aborted, which regions failed and what they referenced.
        Checkpoints removed by retention are no longer listed (time travel still finds them).
        """
        from pyspark.sql import functions as F

        entries: list[TimelineEntry] = []
        completed = self._read("checkpoints").select(
            "checkpoint_id",
            "kind",
            F.transform("regions", lambda r: F.struct(r.region_id, r.outcome, r.ref_checkpoint_id)).alias(
                "regions"
            ),
            F.unix_micros("created_at").alias("at"),
            "commit_ms",
            "run_id",
        )
        for r in completed.collect():
            regions = r["regions"] or []
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(r["checkpoint_id"]),
                    kind=CheckpointKind(r["kind"]),
                    outcomes={int(g["region_id"]): RegionOutcome(g["outcome"]) for g in regions},
                    ref_checkpoint_ids={
                        int(g["region_id"]): int(g["ref_checkpoint_id"])
                        for g in regions
                        if g["ref_checkpoint_id"] is not None
                    },
                    at=_utc_from_micros(r["at"]),
                    commit_ms=int(r["commit_ms"]),
                    run_id=r["run_id"],
                )
            )
        logged = self._read("checkpoint_log").select(
            "checkpoint_id", "kind", "regions", F.unix_micros("logged_at").alias("at"), "reason", "run_id"
        )
        for r in logged.collect():
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(r["checkpoint_id"]),
                    kind=CheckpointKind(r["kind"]),
                    outcomes={int(g["region_id"]): RegionOutcome(g["outcome"]) for g in r["regions"] or []},
                    ref_checkpoint_ids={},
                    at=_utc_from_micros(r["at"]),
                    reason=r["reason"],
                    run_id=r["run_id"],
                )
            )
        return sorted(entries, key=lambda e: (e.checkpoint_id, e.at))

    # -- chains and retention (the rules are the core's) -------------------------------

    def table_version(self, table: str) -> int:
        """The latest Delta version of ``table`` (a log listing, no Spark job)."""
        return delta_table_version(self.spark, self.table_path(table))

    def _metadata(self) -> tuple[int, tuple[tuple[CompletedCheckpoint, str], ...]]:
        """(checkpoints table version, ((checkpoint without split state, attempt id), ...) ascending).

        Cached per table version: a commit by this store advances the cache, a commit by
        anyone else changes the version and forces a re-read.
        """
        from pyspark.sql import functions as F

        version = self.table_version("checkpoints")
        with self._lock:
            cached = self._meta_cache
        if cached is not None and cached[0] == version:
            return cached
        light = (
            self.spark.read.format("delta")
            .option("versionAsOf", version)
            .load(self.table_path("checkpoints"))
            .select(
                "checkpoint_id",
                "kind",
                "parallelism",
                "attempt_id",
                F.transform(
                    "regions", lambda r: F.struct(r.region_id, r.outcome, r.ref_checkpoint_id, r.ref_depth)
                ).alias("regions"),
            )
        )
        out: list[tuple[CompletedCheckpoint, str]] = []
        for r in light.collect():
            regions = [g.asDict() for g in r["regions"] or []]
            out.append(
                (
                    serde.checkpoint_from_rows(
                        {
                            "checkpoint_id": r["checkpoint_id"],
                            "kind": r["kind"],
                            "parallelism": r["parallelism"],
                            "consecutive_regional": 0,
                            "processing_backlog": False,
                            "regions": regions,
                            "enumerator": None,
                        }
                    ),
                    r["attempt_id"],
                )
            )
        result = (version, tuple(sorted(out, key=lambda item: item[0].checkpoint_id)))
        with self._lock:
            self._meta_cache = result
        return result

    def _after_own_write(self, read_version: int, change: Callable[[_Metadata], _Metadata]) -> None:
        """Advance the metadata cache past this store's own commit, if no one else committed."""
        version = self.table_version("checkpoints")
        with self._lock:
            cached = self._meta_cache
            if cached is not None and cached[0] == read_version and version == read_version + 1:
                self._meta_cache = (version, change(cached[1]))
            else:
                self._meta_cache = None

    def _metadata_store(self) -> CheckpointStore:
        """An in-memory core store of the committed checkpoints' ids and refs (no split state)."""
        store = CheckpointStore()
        for light, _attempt in self._metadata()[1]:
            store._put(light)  # stored facts as they are: the core's rules were applied at commit
        return store

    def ref_chain(self, checkpoint_id: int) -> list[int]:
        return self._metadata_store().ref_chain(checkpoint_id)

    def chain_depth(self, checkpoint_id: int) -> int:
        return self._metadata_store().chain_depth(checkpoint_id)

    def retain(self, keep_latest: int, *, pinned: Collection[int] = ()) -> list[int]:
        """Delete the checkpoints the core retention rule lets go; return their ids, ascending.

        Called by the driver after each checkpoint (after side effects and staging
        cleanup). :meth:`CheckpointStore.retain` decides (never a checkpoint a kept one
        references, directly or transitively); this deletes their checkpoints rows, which
        makes them cease to exist (one metadata-only partition delete). Their
        enumerator_state and audit rows are no longer read and are deleted by
        :meth:`compact`, which runs every ``compact_every`` committed checkpoints, so
        at most that many deleted checkpoints' rows are ever kept. Idempotent.
        """
        read_version, metadata = self._metadata()
        store = CheckpointStore()
        for light, _attempt in metadata:
            store._put(light)
        deleted = store.retain(keep_latest, pinned=pinned)  # the core's rule decides
        self._delete_checkpoints(deleted, read_version)
        with self._lock:
            due = self._commits_since_compaction >= self.compact_every
            if due:
                self._commits_since_compaction = 0
        if due:
            self.compact()
        return deleted

    def _delete_checkpoints(self, deleted: Sequence[int], read_version: int) -> None:
        from delta.tables import DeltaTable

        if not deleted:
            return
        ids_sql = ", ".join(str(int(i)) for i in deleted)
        # From this commit on these checkpoints do not exist.
        DeltaTable.forPath(self.spark, self.table_path("checkpoints")).delete(f"checkpoint_id IN ({ids_sql})")
        gone = set(deleted)
        self._after_own_write(
            read_version, lambda entries: tuple(e for e in entries if e[0].checkpoint_id not in gone)
        )
        # Their enumerator_state/audit rows are now unreferenced (restore reads only rows of
        # the attempt a checkpoints row names); compact() deletes them in one batch.

    def compact(self) -> None:
        """Delete unreferenced rows, then OPTIMIZE (bin-pack) every state table.

        May be called at any time; :meth:`retain` calls it every ``compact_every``
        checkpoints. Unreferenced rows are the enumerator_state/audit rows, up to the
        latest checkpoint id, of an attempt no checkpoints row names: those of checkpoints
        retention deleted, of a driver killed mid-commit, of a run that lost a conflict.
        Plans of epochs older than every kept checkpoint go too. Then small files are
        compacted so the file count, and with it restore time, stays bounded. Old files
        stay until VACUUM, so time travel keeps working.
        """
        from delta.tables import DeltaTable

        _version, metadata = self._metadata()
        if metadata:
            kept_ids = ", ".join(str(light.checkpoint_id) for light, _attempt in metadata)
            kept_pairs = ", ".join(
                _sql_literal(f"{light.checkpoint_id}:{attempt}") for light, attempt in metadata
            )
            latest = metadata[-1][0].checkpoint_id
            for table in ("enumerator_state", "audit"):
                target = DeltaTable.forPath(self.spark, self.table_path(table))
                # whole checkpoints first (partition delete, metadata-only), then lost attempts;
                # audit rows that the restart checks need for a split's whole life stay
                gone = f"checkpoint_id <= {latest} AND checkpoint_id NOT IN ({kept_ids})"
                target.delete(gone if table != "audit" else f"{gone} AND decision NOT IN ({_LIFE_DECISIONS})")
                target.delete(
                    f"checkpoint_id IN ({kept_ids}) AND "
                    f"concat(CAST(checkpoint_id AS STRING), ':', attempt_id) NOT IN ({kept_pairs})"
                )
            oldest = metadata[0][0].checkpoint_id
            DeltaTable.forPath(self.spark, self.table_path("epoch_plans")).delete(f"epoch_id < {oldest}")
        for table in serde.STATE_TABLES:
            DeltaTable.forPath(self.spark, self.table_path(table)).optimize().executeCompaction()


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def _check_id(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameterError(name, value, "an integer >= 0")


def _sql_literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _timestamp_text(as_of: datetime | str) -> str:
    if isinstance(as_of, datetime):
        moment = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=UTC)
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(as_of)


def _metadata_of(completed: CompletedCheckpoint) -> CompletedCheckpoint:
    """The checkpoint without split state: what the core chain/retention rules look at."""
    return replace(
        completed,
        regions={r: replace(s, splits=(), operator_state=()) for r, s in completed.regions.items()},
        enumerator=None,
    )


# ---------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateStoreMeasurement:
    """Figures of :func:`measure_state_store` (milliseconds)."""

    checkpoints: int
    splits: int
    parallelism: int
    keep_latest: int | None
    commit_ms: tuple[int, ...]  # the commit_ms recorded in each checkpoints row
    total_commit_ms: tuple[int, ...]  # commit_checkpoint wall time, checkpoints row included
    retain_ms: tuple[int, ...]
    # after N checkpoints -> median over the repeats of a cold latest_checkpoint() / DeltaStateStore(...)
    restore_ms: dict[int, int] = field(default_factory=dict)
    open_ms: dict[int, int] = field(default_factory=dict)

    def summary(self) -> str:
        def stats(values: Sequence[int]) -> str:
            if not values:
                return "-"
            ordered = sorted(values)
            p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
            return f"median {statistics.median(ordered):.0f} ms, p90 {p90} ms, max {ordered[-1]} ms"

        lines = [
            f"{self.checkpoints} checkpoints, {self.splits} splits, parallelism {self.parallelism}, "
            f"retain keep_latest={self.keep_latest}",
            f"  state commit (recorded commit_ms): {stats(self.commit_ms)}",
            f"  commit_checkpoint incl. checkpoints row: {stats(self.total_commit_ms)}",
            f"  retain: {stats(self.retain_ms)}",
        ]
        for n in sorted(self.restore_ms):
            lines.append(
                f"  after {n} checkpoints (cold Delta log cache, median): open store {self.open_ms[n]} ms, "
                f"restore latest {self.restore_ms[n]} ms"
            )
        return "\n".join(lines)


def _synthetic_checkpoint(
    checkpoint_id: int, previous: CompletedCheckpoint | None, splits: int, parallelism: int, step: int
) -> CompletedCheckpoint:
    """Checkpoint ``checkpoint_id`` of a synthetic pipeline: every 4th is regional (region 0 failed)."""
    regional = previous is not None and checkpoint_id % 4 == 0 and previous.kind is CheckpointKind.GLOBAL
    regions: dict[int, RegionState] = {}
    owned: dict[int, tuple[Split, ...]] = {}
    for r in range(parallelism):
        if regional and r == 0 and previous is not None:
            regions[r] = replace(
                previous.regions[r],
                ref_checkpoint_id=previous.checkpoint_id,
                outcome=RegionOutcome.DECLINE,
                ref_depth=1,
            )
        else:
            regions[r] = RegionState(
                region_id=r,
                splits=tuple(
                    Split(f"topic-{s}", "topic", position=checkpoint_id * step, backlog_end=1_000_000)
                    for s in range(r, splits, parallelism)
                ),
                operator_state=(f"reader-{r}@{checkpoint_id}",),
            )
        owned[r] = regions[r].splits
    enumerator = EnumeratorSnapshot(
        checkpoint_id=checkpoint_id,
        parallelism=parallelism,
        assignments=owned,
        subscriptions=frozenset({"topic"}),
    )
    return CompletedCheckpoint(
        checkpoint_id=checkpoint_id,
        kind=CheckpointKind.REGIONAL if regional else CheckpointKind.GLOBAL,
        parallelism=parallelism,
        regions=regions,
        enumerator=enumerator,
        consecutive_regional=1 if regional else 0,
        processing_backlog=True,
    )


def measure_state_store(
    spark: SparkSession,
    root: str | os.PathLike[str] | None = None,
    *,
    checkpoints: int = 200,
    marks: Sequence[int] = (10, 200),
    splits: int = 64,
    parallelism: int = 4,
    keep_latest: int | None = 3,
    compact_every: int = 50,
    audit_per_checkpoint: int = 4,
    restore_repeats: int = 3,
) -> StateStoreMeasurement:
    """Commit ``checkpoints`` synthetic checkpoints the way the driver does and time it.

    Each checkpoint: commit_checkpoint (``splits`` splits over ``parallelism`` regions,
    every 4th checkpoint regional), then retain(keep_latest) unless ``keep_latest`` is
    None. After each count in ``marks``, a fresh store is opened with Delta's log cache
    cleared (what a restarted driver does) and latest_checkpoint() is timed; this is
    repeated ``restore_repeats`` times and the median kept.
    ``root`` defaults to a fresh temporary directory. Used by tests and benchmarks.
    """
    if checkpoints < 1:
        raise InvalidParameterError("checkpoints", checkpoints, "an integer >= 1")
    if restore_repeats < 1:
        raise InvalidParameterError("restore_repeats", restore_repeats, "an integer >= 1")
    bad_marks = [m for m in marks if not 1 <= m <= checkpoints]
    if bad_marks:
        raise InvalidParameterError("marks", list(marks), f"counts between 1 and checkpoints={checkpoints}")
    root_text = os.fspath(root) if root is not None else tempfile.mkdtemp(prefix="splitkeeper-measure-")
    store = DeltaStateStore(spark, root_text, "measure", "synthetic", compact_every=compact_every)
    commit_ms: list[int] = []
    total_ms: list[int] = []
    retain_ms: list[int] = []
    restore_ms: dict[int, int] = {}
    open_ms: dict[int, int] = {}
    previous: CompletedCheckpoint | None = None
    for n in range(1, checkpoints + 1):
        completed = _synthetic_checkpoint(n, previous, splits, parallelism, step=100)
        audit = [
            AuditRecord(f"topic-{i}", i % parallelism, RecoveryDecision.ASSIGNED, n, detail="synthetic")
            for i in range(audit_per_checkpoint)
        ]
        receipt = store.commit_checkpoint(completed, audit)
        commit_ms.append(receipt.commit_ms)
        total_ms.append(receipt.total_ms)
        if keep_latest is not None:
            started = time.perf_counter()
            store.retain(keep_latest)
            retain_ms.append(round((time.perf_counter() - started) * 1000))
        previous = completed
        if n in marks:
            opens: list[int] = []
            restores: list[int] = []
            for _ in range(restore_repeats):
                spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]
                started = time.perf_counter()
                fresh = DeltaStateStore(spark, root_text, "measure", "synthetic")
                opens.append(round((time.perf_counter() - started) * 1000))
                started = time.perf_counter()
                restored = fresh.latest_checkpoint()
                restores.append(round((time.perf_counter() - started) * 1000))
                if restored != completed:
                    raise StateError(
                        f"measurement: checkpoint {n} did not restore equal to what was committed"
                    )
            open_ms[n] = round(statistics.median(opens))
            restore_ms[n] = round(statistics.median(restores))
    return StateStoreMeasurement(
        checkpoints=checkpoints,
        splits=splits,
        parallelism=parallelism,
        keep_latest=keep_latest,
        commit_ms=tuple(commit_ms),
        total_commit_ms=tuple(total_ms),
        retain_ms=tuple(retain_ms),
        restore_ms=restore_ms,
        open_ms=open_ms,
    )
