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

The claim of the directory, each plan and each ``checkpoints`` row are one blind append
whose commit names what it claims (its ``userMetadata``), checked against the Delta log
rather than with a MERGE (a MERGE costs several Spark jobs; an append one). A run that
comes later finds the claim and writes nothing; two runs that plan the same epoch or
commit the same checkpoint at the same moment both append, and since blind appends never
conflict in Delta the log's order decides: the later one removes its rows again and gets
:class:`~splitkeeper.errors.ConcurrentRunError` naming the pipeline and the epoch.

Restore reads the rows of one checkpoint id only (data skipping on ``checkpoint_id``);
Delta log checkpoints (``delta.checkpointInterval``) bound log replay and
:meth:`DeltaStateStore.retain` compacts the tables every ``compact_every`` checkpoints, so
restore time does not grow with history (:func:`measure_state_store` measures it).
"""

from __future__ import annotations

import functools
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
from splitkeeper.runtime.delta_log import (
    DataFile,
    DeltaApiUnavailable,
    DeltaCommit,
    LoggedAppend,
    append_arrow,
    append_logged,
    delta_file_count,
    delta_snapshot,
    delta_table_version,
    is_concurrent_modification,
    read_commit,
    remove_files,
)
from splitkeeper.runtime.serde import EpochPlan, PlannedRange

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
    "audit": None,  # history, kept past retention: unpartitioned so compaction bounds its files
    "checkpoint_log": None,
}
#: userMetadata keys of a plan commit: the epoch it plans, the epoch_plans version its planner checked.
_PLAN_EPOCH_KEY = "plan_epoch"
_PLAN_SINCE_KEY = "checked_version"
#: userMetadata key of a checkpoints-row commit: the checkpoint id it commits.
_CHECKPOINT_KEY = "checkpoint_id"
#: How many of the newest epoch_plans commits are read to find the latest plan before querying the table.
_PLAN_LOG_SCAN = 64
#: Delta operations that write no rows: a commit of another kind may have been another writer's claim.
_NO_ROWS_OPERATIONS = frozenset({"CREATE TABLE", "OPTIMIZE", "DELETE", "SET TBLPROPERTIES", "ADD COLUMNS"})
#: Columns added to a table's DDL after state was first written with it: nullable, at the end; an
#: older table gets them by ALTER TABLE ADD COLUMNS when a store opens it.
_ADDED_COLUMNS: dict[str, frozenset[str]] = {"checkpoints": frozenset({"configured_parallelism"})}
#: How many of its own checkpoints rows a store remembers for retention's archive (the rows
#: carry every split's position; older ones are read back when retention deletes them).
_REMEMBERED_ROWS = 64
#: Commits after which a data file a store added is still in the table as it was (they add
#: files, delete rows, or change only metadata). Anything else (OPTIMIZE) may have rewritten it.
_KEEPS_FILES = frozenset({"WRITE", "DELETE", "CREATE TABLE", "SET TBLPROPERTIES", "ADD COLUMNS"})
_STATS_COLUMNS: dict[str, str] = {
    "pipeline": "name",
    "epoch_plans": "region_id",
    "checkpoints": "kind",
    "enumerator_state": "attempt_id",
    "audit": "attempt_id",
    "checkpoint_log": "checkpoint_id",
}

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


@dataclass(frozen=True, slots=True)
class _OwnRow:
    """A checkpoints row this store committed, remembered for retention.

    ``files``: the data files that hold it (written by pyarrow) and ``version``, the
    checkpoints table version that added them; no files when Spark wrote the row or
    compaction has rewritten it since.
    """

    row: Mapping[str, Any]
    version: int
    files: tuple[tuple[DataFile, dict[str, str]], ...]


def _archived_row(row: Mapping[str, Any], logged_at: datetime) -> dict[str, Any]:
    """The ``checkpoint_log`` row of a completed checkpoint, from its ``checkpoints`` row.

    ``regions[*].splits`` becomes the region's split count; ``backlog_splits`` counts the
    splits still short of their backlog end.
    """
    regions = list(row.get("regions") or ())
    splits = [split for region in regions for split in region.get("splits") or ()]
    in_backlog = sum(
        1 for s in splits if s.get("backlog_end") is not None and int(s["position"]) < int(s["backlog_end"])
    )
    return {
        "checkpoint_id": row["checkpoint_id"],
        "kind": row["kind"],
        "regions": [
            {
                "region_id": region["region_id"],
                "outcome": region["outcome"],
                "ref_checkpoint_id": region.get("ref_checkpoint_id"),
                "splits": len(region.get("splits") or ()),
            }
            for region in regions
        ],
        "reason": "",
        "run_id": row["run_id"],
        "logged_at": logged_at,
        "attempt_id": row["attempt_id"],
        "parallelism": row["parallelism"],
        "processing_backlog": row["processing_backlog"],
        "backlog_splits": in_backlog,
        "commit_ms": row["commit_ms"],
        "created_at": row["created_at"],
    }


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
        self._configured: dict[int, int | None] = {}  # checkpoint id -> configured_parallelism, as loaded
        self._plan_claims: tuple[int, int | None] | None = None  # (epoch_plans version, latest planned)
        self._own_rows: dict[int, _OwnRow] = {}  # kept checkpoints this store committed (bounded)
        created = self._ensure_tables()
        self._claim_pipeline(accept_source_change, fresh="pipeline" in created)

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

    def _ensure_tables(self) -> set[str]:
        """Create the missing tables (concurrently), check every table's layout; return the created ones."""
        from delta.tables import DeltaTable

        exists = functools.partial(DeltaTable.isDeltaTable, self.spark)
        missing = [table for table in serde.STATE_TABLES if not exists(self.table_path(table))]
        _concurrently([functools.partial(self._create_table, table) for table in missing])
        for table in serde.STATE_TABLES:
            path = self.table_path(table)
            metadata = delta_snapshot(self.spark, path).metadata()
            partitions = str(metadata.partitionColumns().mkString(","))
            actual = (list(metadata.schema().fieldNames()), [c for c in partitions.split(",") if c])
            partition = PARTITION_COLUMNS[table]
            expected = (self.schema(table).fieldNames(), [partition] if partition else [])
            if actual != expected and self._add_new_columns(table, actual, expected):
                continue
            if actual != expected:
                raise StateError(
                    f"state table {table} at {path} has columns {actual[0]} partitioned by {actual[1]}, but "
                    f"splitkeeper expects {expected[0]} partitioned by {expected[1]} (state/{table}.ddl): "
                    "the directory was written by another splitkeeper state format; use a fresh state "
                    "directory (or migrate the table)",
                    table=table,
                    path=path,
                )
        return set(missing)

    def _add_new_columns(
        self, table: str, actual: tuple[list[str], list[str]], expected: tuple[list[str], list[str]]
    ) -> bool:
        """Migrate a table that lacks only columns added to its DDL since (nullable, at the end):
        ``ALTER TABLE ... ADD COLUMNS``; old rows read NULL there. False when that is not the case."""
        have, want = actual[0], expected[0]
        added = want[len(have) :]
        if actual[1] != expected[1] or want[: len(have)] != have or not added:
            return False
        if not set(added) <= _ADDED_COLUMNS.get(table, frozenset()):
            return False
        schema = self.schema(table)
        columns = ", ".join(f"`{name}` {schema[name].dataType.simpleString()}" for name in added)
        self.spark.sql(f"ALTER TABLE delta.`{self.table_path(table)}` ADD COLUMNS ({columns})")
        log.info("state table %s: added columns %s", table, added)
        return True

    def _create_table(self, table: str) -> None:
        from delta.tables import DeltaTable

        path = self.table_path(table)
        props = {**BASE_TABLE_PROPERTIES, "delta.dataSkippingStatsColumns": _STATS_COLUMNS[table]}
        props_sql = ", ".join(f"'{k}' = '{v}'" for k, v in props.items())
        partition = PARTITION_COLUMNS[table]
        partitioned = f"PARTITIONED BY ({partition}) " if partition else ""
        try:
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS delta.`{path}` ({serde.read_ddl(table)}) USING DELTA "
                f"{partitioned}TBLPROPERTIES ({props_sql})"
            )
        except Exception as err:
            # Another store created it at the same moment: fine if it exists now.
            if not DeltaTable.isDeltaTable(self.spark, path):
                raise StateError(
                    f"cannot create state table {table} at {path}: {err}", table=table, path=path
                ) from err

    def _read(self, table: str, as_of: datetime | str | None = None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if as_of is not None:
            reader = reader.option("timestampAsOf", _timestamp_text(as_of))
        return reader.load(self.table_path(table))

    def _arrow(self, table: str, rows: Sequence[Mapping[str, Any]]) -> Any:
        """``rows`` as a pyarrow Table with the table's schema (Spark's Arrow types)."""
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = self.schema(table)
        if table not in self._arrow_schemas:
            self._arrow_schemas[table] = to_arrow_schema(schema)
        names = schema.fieldNames()
        return pa.Table.from_pylist(
            [{n: row.get(n) for n in names} for row in rows], self._arrow_schemas[table]
        )

    def _append_logged(
        self, table: str, rows: Sequence[Mapping[str, Any]], since: int, user_metadata: Mapping[str, Any]
    ) -> LoggedAppend:
        """One append of ``rows`` and the commits that landed since ``since`` (:func:`append_logged`)."""
        logged = self._write_rows(table, rows, since, user_metadata)
        assert logged is not None  # a logged write always reports its commit
        return logged

    def _append(self, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            self._write_rows(table, rows, None, None)

    def _write_rows(
        self,
        table: str,
        rows: Sequence[Mapping[str, Any]],
        since: int | None,
        user_metadata: Mapping[str, Any] | None,
    ) -> LoggedAppend | None:
        """Append ``rows`` to ``table`` in one commit; with ``since``, report it as :func:`append_logged`.

        On a local state directory the rows are written by pyarrow and committed through
        Delta's transaction API (:func:`append_arrow`, no Spark job); elsewhere Spark writes
        them, from the same Arrow table (no Python workers).
        """
        path = self.table_path(table)
        data = self._arrow(table, rows)
        direct = append_arrow(self.spark, path, data, PARTITION_COLUMNS[table], since, user_metadata)
        if direct is not None:
            return direct
        frame = self.spark.createDataFrame(data, self.schema(table)).coalesce(1)
        if since is None:
            frame.write.format("delta").mode("append").save(path)
            return None
        return append_logged(frame, path, since, user_metadata)

    def _append_all(self, batches: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]) -> None:
        """Append to several tables concurrently (one Spark job each); re-raise the first failure."""
        _concurrently([functools.partial(self._append, table, rows) for table, rows in batches if rows])

    def _delete(self, checkpoint_id: int) -> None:
        """Storage primitive of the core store: delete one checkpoint (no chain check); see :meth:`retain`."""
        self._delete_checkpoints([checkpoint_id], self._metadata()[0])

    def _put(self, completed: CompletedCheckpoint) -> None:
        """Storage primitive of the core store: commit a checkpoint without audit rows."""
        self.commit_checkpoint(completed)

    # -- pipeline ---------------------------------------------------------------------

    def _claim_pipeline(self, accept_source_change: bool, fresh: bool = False) -> None:
        """Claim the state directory for this pipeline, or check who owns it.

        ``fresh``: this store has just created the pipeline table, so it is not read first.
        """
        path = self.table_path("pipeline")
        since = delta_table_version(self.spark, path)
        rows: list[Any] = [] if fresh else self._read("pipeline").collect()
        if not rows:
            rows = self._claim_empty(since)
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

    def _claim_empty(self, since: int) -> list[Any]:
        """Append the claim to the pipeline table that was empty at version ``since``; the first claim wins.

        Blind appends do not conflict in Delta, so the log decides: if any row-writing commit
        landed after ``since`` and before this one, this claim lost; it is deleted again and
        the table is read. Returns the pipeline rows (the claim itself when it won).
        """
        from delta.tables import DeltaTable

        created_at = datetime.now(UTC)
        claim = {
            "name": self.pipeline_name,
            "source_fingerprint": self.source_fingerprint,
            "state_format": serde.STATE_FORMAT,
            "created_at": created_at,
        }
        path = self.table_path("pipeline")
        logged = self._append_logged("pipeline", [claim], since, {"claim": self.pipeline_name})
        if all(c.operation in _NO_ROWS_OPERATIONS for c in logged.earlier):
            return [claim]
        # Another store claimed the directory at the same time: remove this claim, read theirs.
        micros = int(created_at.timestamp()) * 1_000_000 + created_at.microsecond
        DeltaTable.forPath(self.spark, path).delete(
            f"name = {_sql_literal(self.pipeline_name)} AND unix_micros(created_at) = {micros}"
        )
        return list(self._read("pipeline").collect())

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
        Planned epochs strictly increase: if ``epoch_id`` or a later epoch is already
        planned (a duplicate or concurrent planner), nothing is kept and ConcurrentRunError
        names the pipeline, the epoch and the run that planned it; a replay must
        :meth:`read_plan` instead. One blind append whose commit names the epoch; two
        planners at the same moment both append, the Delta log orders them, the later
        one removes its rows again and fails. Returns the plan as stored.
        """
        _check_id("epoch_id", epoch_id)
        stored = serde.coerce_plan(epoch_id, plan, run_id or self.run_id)
        if not stored.regions:
            raise InvalidParameterError(
                "plan", {}, "at least one region (regions with nothing to read map to ())"
            )
        since, latest = self._latest_plan_claim()
        if latest is not None and latest[0] >= epoch_id:
            raise self._plan_conflict(epoch_id, latest)
        planned_at = datetime.now(UTC)
        rows = [
            {**row, "run_id": stored.run_id, "planned_at": planned_at} for row in serde.plan_to_rows(stored)
        ]
        path = self.table_path("epoch_plans")
        logged = self._append_logged(
            "epoch_plans",
            rows,
            since,
            {_PLAN_EPOCH_KEY: epoch_id, _PLAN_SINCE_KEY: since, "run_id": stored.run_id},
        )
        rivals = [c for c in map(_plan_claim, logged.earlier) if c is not None and c[0] >= epoch_id]
        if rivals:
            from delta.tables import DeltaTable

            DeltaTable.forPath(self.spark, path).delete(
                f"epoch_id = {epoch_id} AND run_id = {_sql_literal(stored.run_id)}"
            )
            raise self._plan_conflict(epoch_id, rivals[0])
        with self._lock:
            if self._plan_claims is None or self._plan_claims[0] <= logged.commit.version:
                self._plan_claims = (logged.commit.version, epoch_id)
        return stored

    def _plan_conflict(self, epoch_id: int, claim: tuple[int, str]) -> ConcurrentRunError:
        latest, by = claim
        if latest == epoch_id:
            what = f"epoch {epoch_id} is already planned (by run {by or 'unknown'})"
        else:
            what = f"epoch {epoch_id} is older than the latest planned epoch {latest} (run {by or 'unknown'})"
        return ConcurrentRunError(
            f"pipeline {self.pipeline_name!r}: {what}; another run is driving this pipeline, or this run "
            f"must replay epoch {epoch_id} with read_plan({epoch_id}) instead of planning it again",
            pipeline=self.pipeline_name,
            epoch_id=epoch_id,
            planned_by=by or "unknown",
            latest_planned=latest,
        )

    def _latest_plan_claim(self) -> tuple[int, tuple[int, str] | None]:
        """(epoch_plans version, (latest planned epoch, its run id) or None), from the Delta log.

        Each plan commit names its epoch and the table version its planner had checked
        (``userMetadata``). A plan that lost a race was appended after the one it lost to
        and after that version, so the newest commits are read back until every plan
        commit that could outrank the newest one found has been seen: normally one or two
        small files, no Spark job. A table with plan commits that are not tagged (an older
        splitkeeper's MERGE), or a long run of other commits, is asked with a query.
        """
        path = self.table_path("epoch_plans")
        snapshot = delta_snapshot(self.spark, path)
        version = int(snapshot.version())
        with self._lock:
            cached = self._plan_claims
        if cached is not None and cached[0] == version:
            return version, None if cached[1] is None else (cached[1], self.run_id)
        if delta_file_count(snapshot) == 0:
            return version, None
        best: tuple[int, str] | None = None
        floor = -1  # with a claim found: commits at or below this version cannot outrank it
        for v in range(version, max(-1, version - _PLAN_LOG_SCAN), -1):
            if best is not None and v <= floor:
                return version, best
            commit = read_commit(self.spark, path, v)
            claim = None if commit is None else _plan_claim(commit)
            if claim is None:
                if commit is not None and commit.operation in _NO_ROWS_OPERATIONS:
                    continue
                break  # an untagged write (or a cleaned-up log): ask the table
            best = claim if best is None or claim[0] > best[0] else best
            since = commit.metadata.get(_PLAN_SINCE_KEY) if commit is not None else None
            floor = min(floor if floor >= 0 else v, int(since) if since is not None else -1)
        else:
            if best is not None:
                return version, best
        row = self._read("epoch_plans").agg({"epoch_id": "max"}).first()
        value = None if row is None else row[0]
        return version, None if value is None else (int(value), "")

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
        """The highest planned epoch id, or None when nothing was planned yet (normally no Spark job)."""
        latest = self._latest_plan_claim()[1]
        return None if latest is None else latest[0]

    # -- checkpoints: write -----------------------------------------------------------

    def commit_checkpoint(
        self,
        completed: CompletedCheckpoint,
        audit: Sequence[AuditRecord] = (),
        *,
        before_row: Callable[[], None] | None = None,
        configured_parallelism: int | None = None,
    ) -> StateCommit:
        """Persist a completed (GLOBAL or REGIONAL) checkpoint with its audit records.

        Called by the driver once per completed checkpoint, after the sink commit.
        Writes the enumerator_state and audit rows (one append each, concurrently), calls
        ``before_row`` (the driver's crash point between the rows and the row), then
        appends the checkpoints row LAST (it alone marks the checkpoint complete; its
        commit names the checkpoint id). The core's rules apply first (not ABORTED, refs
        kept: CheckpointError). A checkpoint id not newer than the latest committed one
        raises ConcurrentRunError naming the pipeline and the id; of two writers of one
        id at the same moment the Delta log decides: the one whose row landed later
        removes it and its rows again (never read) and gets ConcurrentRunError. Calling it
        twice with the same checkpoint fails the second time: the first commit stays intact.
        ``configured_parallelism`` is the config's parallelism the checkpoint was taken under
        (see :meth:`configured_parallelism`).
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
        self._append_all(
            [
                ("enumerator_state", [{**r, **key} for r in enumerator_rows]),
                ("audit", [{**r, **key} for r in audit_rows]),
            ]
        )
        if before_row is not None:
            before_row()
        commit_ms = round((time.perf_counter() - started) * 1000)
        row.update(
            key,
            run_id=self.run_id,
            created_at=datetime.now(UTC),
            commit_ms=commit_ms,
            configured_parallelism=configured_parallelism,
        )
        logged = self._append_logged(
            "checkpoints", [row], read_version, {_CHECKPOINT_KEY: checkpoint_id, "attempt_id": attempt_id}
        )
        rivals = [c.version for c in logged.earlier if not _checkpoint_below(c, checkpoint_id)]
        if rivals:
            from delta.tables import DeltaTable

            DeltaTable.forPath(self.spark, self.table_path("checkpoints")).delete(
                f"checkpoint_id = {checkpoint_id} AND attempt_id = {_sql_literal(attempt_id)}"
            )
            self._discard_attempt(checkpoint_id, attempt_id)
            with self._lock:
                self._meta_cache = None
            raise self._checkpoint_conflict(checkpoint_id, self._latest_id())
        self._after_own_write(read_version, lambda entries: (*entries, (light, attempt_id)))
        with self._lock:
            self._commits_since_compaction += 1
            # for retention: the archive row, and the files to remove (when pyarrow wrote them)
            self._own_rows[checkpoint_id] = _OwnRow(row, logged.commit.version, logged.files)
            while len(self._own_rows) > _REMEMBERED_ROWS:  # bounded: older ones are read back
                del self._own_rows[min(self._own_rows)]
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
        configured = data.pop("configured_parallelism", None)
        with self._lock:
            self._configured[int(data["checkpoint_id"])] = None if configured is None else int(configured)
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

    def configured_parallelism(self, checkpoint_id: int) -> int | None:
        """The config's parallelism checkpoint ``checkpoint_id`` was taken under, as recorded when this
        store loaded it (None: not loaded by this store, or taken before splitkeeper recorded it)."""
        with self._lock:
            return self._configured.get(int(checkpoint_id))

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
        latest, attempt = metadata[-1][0].checkpoint_id, metadata[-1][1]
        rows = (
            self._read("checkpoints")
            .where(f"checkpoint_id = {latest}")
            .where(f"attempt_id = {_sql_literal(attempt)}")
            .collect()
        )
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
        """Every checkpoint attempt of the pipeline's history, by id then time.

        Kept checkpoints (their checkpoints rows), completed checkpoints retention deleted
        (archived to ``checkpoint_log`` before the delete) and aborted attempts (logged
        there): global/regional/aborted, which regions failed and what they referenced.
        """
        from pyspark.sql import functions as F

        def ref_ids(regions: Sequence[Any]) -> dict[int, int]:
            return {
                int(g["region_id"]): int(g["ref_checkpoint_id"])
                for g in regions
                if g["ref_checkpoint_id"] is not None
            }

        def outcomes(regions: Sequence[Any]) -> dict[int, RegionOutcome]:
            return {int(g["region_id"]): RegionOutcome(g["outcome"]) for g in regions}

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
        archived = self.archived_checkpoints().select(
            "checkpoint_id", "kind", "regions", F.unix_micros("created_at").alias("at"), "commit_ms", "run_id"
        )
        for r in completed.unionByName(archived, allowMissingColumns=True).collect():
            regions = r["regions"] or []
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(r["checkpoint_id"]),
                    kind=CheckpointKind(r["kind"]),
                    outcomes=outcomes(regions),
                    ref_checkpoint_ids=ref_ids(regions),
                    at=_utc_from_micros(r["at"]),
                    commit_ms=int(r["commit_ms"]),
                    run_id=r["run_id"],
                )
            )
        aborted = (
            self._read("checkpoint_log")
            .where(f"kind = '{CheckpointKind.ABORTED.value}'")
            .select(
                "checkpoint_id", "kind", "regions", F.unix_micros("logged_at").alias("at"), "reason", "run_id"
            )
        )
        for r in aborted.collect():
            entries.append(
                TimelineEntry(
                    checkpoint_id=int(r["checkpoint_id"]),
                    kind=CheckpointKind(r["kind"]),
                    outcomes=outcomes(r["regions"] or []),
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

        snapshot = delta_snapshot(self.spark, self.table_path("checkpoints"))
        version = int(snapshot.version())
        with self._lock:
            cached = self._meta_cache
        if cached is not None and cached[0] == version:
            return cached
        if delta_file_count(snapshot) == 0:  # no checkpoint yet (or all deleted): no query
            with self._lock:
                self._meta_cache = (version, ())
            return version, ()
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
        self._archive_checkpoints(deleted)
        # From this commit on these checkpoints do not exist.
        if not self._remove_own_rows(deleted):
            ids_sql = ", ".join(str(int(i)) for i in deleted)
            DeltaTable.forPath(self.spark, self.table_path("checkpoints")).delete(
                f"checkpoint_id IN ({ids_sql})"
            )
        gone = set(deleted)
        with self._lock:
            for checkpoint_id in gone:
                self._own_rows.pop(checkpoint_id, None)
        self._after_own_write(
            read_version, lambda entries: tuple(e for e in entries if e[0].checkpoint_id not in gone)
        )
        # Their enumerator_state/audit rows are now unreferenced (restore reads only rows of
        # the attempt a checkpoints row names); compact() deletes them in one batch.

    def _remove_own_rows(self, deleted: Sequence[int]) -> bool:
        """Delete checkpoints rows by removing the files this store wrote for them (no Spark
        job: :func:`remove_files`). False, with nothing written, when a file is not known
        (another store wrote the row, or compaction rewrote it) or the commit conflicts;
        the caller then deletes with Spark."""
        path = self.table_path("checkpoints")
        with self._lock:
            found = [self._own_rows.get(int(i)) for i in deleted]
        own = [entry for entry in found if entry is not None and entry.files]
        if len(own) < len(found):
            return False
        for version in range(min(e.version for e in own) + 1, delta_table_version(self.spark, path) + 1):
            commit = read_commit(self.spark, path, version)
            if commit is None or commit.operation not in _KEEPS_FILES:
                return False  # e.g. an OPTIMIZE by another process rewrote the files
        files = [f for entry in own for f in entry.files]
        try:
            remove_files(self.spark, path, files)
        except DeltaApiUnavailable as err:
            log.warning("%s; deleting checkpoints rows with Spark", err)
            return False
        except Exception as err:
            if not is_concurrent_modification(err):
                raise
            log.info(
                "state store %s: checkpoints changed under retention (%s); deleting with Spark",
                self.root,
                err,
            )
            return False
        return True

    def _archive_checkpoints(self, deleted: Sequence[int]) -> None:
        """Copy the timeline facts of checkpoints about to be deleted into ``checkpoint_log``.

        One append of rows built from their checkpoints rows (:func:`_archived_row`): the
        rows this store committed itself are remembered, the others are read (one
        partition-pruned query), so the timeline and the report keep the whole history
        while restore reads only the kept checkpoints. A driver dying between this append
        and the delete leaves the checkpoint both kept and archived: :meth:`timeline`
        shows it once.
        """
        from pyspark.sql import functions as F

        wanted = sorted({int(i) for i in deleted})
        with self._lock:
            rows = [self._own_rows[i].row for i in wanted if i in self._own_rows]
        known = {int(r["checkpoint_id"]) for r in rows}
        missing = [i for i in wanted if i not in known]
        if missing:
            ids_sql = ", ".join(str(i) for i in missing)
            read = (
                self._read("checkpoints")
                .where(f"checkpoint_id IN ({ids_sql})")
                .withColumn("created_at", F.unix_micros("created_at"))
            )
            for r in read.collect():
                row = r.asDict(recursive=True)
                rows.append({**row, "created_at": _utc_from_micros(row["created_at"])})
        logged_at = datetime.now(UTC)
        self._append("checkpoint_log", [_archived_row(row, logged_at) for row in rows])

    def archived_checkpoints(self) -> DataFrame:
        """The ``checkpoint_log`` rows of completed checkpoints retention deleted (one per id)."""
        kept = self._read("checkpoints").select("checkpoint_id")
        return (
            self._read("checkpoint_log")
            .where(f"kind <> '{CheckpointKind.ABORTED.value}'")
            .join(kept, "checkpoint_id", "left_anti")
            .dropDuplicates(["checkpoint_id"])
        )

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
                # whole checkpoints first (partition delete, metadata-only), then lost attempts of
                # kept ids. The audit trail is history: the rows of deleted (archived) checkpoints
                # stay for the report and the restart checks; orphan rows of attempts that never
                # completed stay too and are never read (readers join on a checkpoint's attempt).
                if table != "audit":
                    target.delete(f"checkpoint_id <= {latest} AND checkpoint_id NOT IN ({kept_ids})")
                target.delete(
                    f"checkpoint_id IN ({kept_ids}) AND "
                    f"concat(CAST(checkpoint_id AS STRING), ':', attempt_id) NOT IN ({kept_pairs})"
                )
            oldest = metadata[0][0].checkpoint_id
            DeltaTable.forPath(self.spark, self.table_path("epoch_plans")).delete(f"epoch_id < {oldest}")
        with self._lock:  # OPTIMIZE rewrites the files: retention deletes those rows with Spark
            self._own_rows = {i: replace(o, files=()) for i, o in self._own_rows.items()}
        for table in serde.STATE_TABLES:
            DeltaTable.forPath(self.spark, self.table_path(table)).optimize().executeCompaction()


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


def _checkpoint_below(commit: DeltaCommit, checkpoint_id: int) -> bool:
    """True when ``commit`` cannot hold a checkpoints row of ``checkpoint_id`` or later."""
    if commit.operation in _NO_ROWS_OPERATIONS:
        return True
    committed = commit.metadata.get(_CHECKPOINT_KEY)
    return committed is not None and int(committed) < checkpoint_id


def _concurrently(calls: Sequence[Callable[[], Any]]) -> None:
    """Run ``calls`` (Delta commits to different tables) in threads; re-raise the first failure."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="splitkeeper-state") as pool:
        for future in [pool.submit(call) for call in calls]:
            future.result()


def _plan_claim(commit: DeltaCommit) -> tuple[int, str] | None:
    """(epoch, run id) when ``commit`` is a plan commit of :meth:`DeltaStateStore.write_plan`."""
    meta = commit.metadata
    if _PLAN_EPOCH_KEY not in meta:
        return None
    return int(meta[_PLAN_EPOCH_KEY]), str(meta.get("run_id", ""))


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
