"""The exactly-once Delta sink: one idempotent Delta append per epoch.

The driver commits an epoch's output with :meth:`DeltaSink.commit` after the regional
checkpoint coordinator completed the checkpoint and before the state commit (runtime
design, step 5). The append carries Delta's idempotent-write options
``txnAppId=<app_id>`` and ``txnVersion=<epoch>``: Delta records the pair in the table's
log in the same atomic commit as the data, and skips any later write whose
``txnVersion`` is not higher. So a replay of epoch N after a crash (same plan, same
ranges, new staged files) never writes its records twice. ``userMetadata`` carries
``{"app_id", "epoch", "regions", "commit_id"}`` so crash recovery can read which regions
the committed epoch contained (:meth:`DeltaSink.committed_metadata`).

Only acknowledged regions' staged files are committed: a staged file whose path says it
belongs to another region or epoch is refused.

When the sink is on a local filesystem, the staged files (which hold every column of the
table) are moved into the table's folder and added to the log as they are
(:func:`~splitkeeper.runtime.delta_log.commit_files_once`, the same ``txn`` action), so the
records are written once, by the region tasks. Elsewhere (object stores), or with
``SPLITKEEPER_DIRECT_WRITES=0``, the commit reads the staged files and appends them with
Spark. A file moved in by a commit that then failed is never in the log; Delta's VACUUM
removes it.

The staged parquet files (one per region task, written by the task with pyarrow, see
:data:`~splitkeeper.runtime.staging.STAGED_FILE_SCHEMA`) have every column of
``state/sink_records.ddl``: ``split_id string, offset long, next_offset long, value string,
epoch long, region int`` and ``ingested_at`` (when the task wrote the file). The Spark
append reads the record columns (:func:`staged_spark_schema`) and stamps ``ingested_at``
at commit; :func:`staged_arrow_schema` is the record columns' pyarrow schema.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.core.invariants import Violation, check_sink_ranges
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, StateError
from splitkeeper.runtime import serde
from splitkeeper.runtime.delta_log import (
    COMMIT_ID_KEY,
    DataFile,
    DeltaApiUnavailable,
    DeltaCommit,
    append_once,
    commit_files_once,
    delta_snapshot,
    direct_writes_enabled,
    is_concurrent_modification,
    local_dir,
    txn_version,
    warm_snapshot_state,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "STAGED_COLUMNS",
    "DeltaSink",
    "SinkCommit",
    "SplitRecords",
    "staged_arrow_schema",
    "staged_spark_schema",
]

#: Columns of a staged parquet file, in order (the sink table adds ``ingested_at``).
STAGED_COLUMNS: tuple[str, ...] = ("split_id", "offset", "next_offset", "value", "epoch", "region")

# How many recent commits committed_metadata() searches before reading the whole history.
_RECENT_HISTORY = 64

log = logging.getLogger(__name__)

_RESERVED_METADATA = frozenset({"app_id", "epoch", "regions", "records", COMMIT_ID_KEY})

_SEGMENT = re.compile(r"(?:^|/)(epoch|region)=(\d+)(?=/|$)")
_ATTEMPT = re.compile(r"(?:^|/)attempt=([A-Za-z0-9_-]+)(?=/|$)")


def adopted_name(staged_path: str) -> str:
    """The table-relative name a staged file gets in the sink: one per epoch, region and attempt."""
    text = staged_path.replace(os.sep, "/")
    segments = dict(_SEGMENT.findall(text))
    attempt = _ATTEMPT.search(text)
    return (
        f"sk-e{int(segments['epoch']):010d}-r{int(segments['region']):05d}-"
        f"{attempt.group(1) if attempt else 'once'}.parquet"
    )


def _sink_schema() -> StructType:
    from pyspark.sql.types import StructType, _parse_datatype_string

    parsed = _parse_datatype_string(serde.read_ddl(serde.SINK_TABLE))
    assert isinstance(parsed, StructType)
    return parsed


def staged_spark_schema() -> StructType:
    """The Spark schema of a staged parquet file (the sink table's columns minus ``ingested_at``)."""
    from pyspark.sql.types import StructType

    full = _sink_schema()
    return StructType([full[name] for name in STAGED_COLUMNS])


def staged_arrow_schema() -> Any:
    """The pyarrow schema of a staged file's record columns (:data:`STAGED_COLUMNS`).

    Built from ``state/sink_records.ddl`` (flat columns of BIGINT, INT, STRING) without a
    Spark session, so executors can call it.
    """
    import pyarrow as pa

    arrow_types = {"BIGINT": pa.int64(), "INT": pa.int32(), "STRING": pa.string()}
    columns: dict[str, Any] = {}
    for item in serde.read_ddl(serde.SINK_TABLE).split(","):
        words = item.replace("`", "").split()
        if words:
            columns[words[0]] = (words[1].upper(), "NOT NULL" not in " ".join(words[2:]).upper())
    fields = []
    for name in STAGED_COLUMNS:
        if name not in columns or columns[name][0] not in arrow_types:
            raise StateError(
                f"state/sink_records.ddl must define staged column {name} as BIGINT, INT or STRING",
                column=name,
            )
        type_name, nullable = columns[name]
        fields.append(pa.field(name, arrow_types[type_name], nullable=nullable))
    return pa.schema(fields)


@dataclass(frozen=True, slots=True)
class SinkCommit:
    """One epoch's commit to the sink table, as Delta recorded it.

    ``skipped`` is True when this call wrote nothing because the epoch was already
    committed (a replay); the other fields then describe the earlier commit.
    ``table_version``/``records``/``regions`` are None when Delta's history of that
    commit is no longer available (log cleaned up).
    """

    app_id: str
    epoch_id: int
    regions: tuple[int, ...] | None
    table_version: int | None
    records: int | None
    skipped: bool = False
    commit_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SplitRecords:
    """Per split, what the sink holds: record count and the offset range they span."""

    records: int
    first_offset: int
    last_next_offset: int


class DeltaSink:
    """The records table at ``path``, written idempotently under the Delta app id ``app_id``.

    One per pipeline and driver process (``app_id`` is the pipeline name by
    convention). Creates the table on first use (schema ``state/sink_records.ddl``).
    Methods run on the driver; :meth:`commit` may be called again for the same epoch
    (crash replay) and then writes nothing.
    """

    def __init__(self, spark: SparkSession, path: str | os.PathLike[str], app_id: str) -> None:
        if not isinstance(app_id, str) or not app_id.strip():
            raise InvalidParameterError("app_id", app_id, "a non-empty name (the pipeline name)")
        text = os.fspath(path)
        if not text:
            raise InvalidParameterError("path", text, "a directory path or URI")
        self.spark = spark
        self.path = os.path.abspath(text) if "://" not in text and not text.startswith("file:") else text
        self.app_id = app_id
        self._warming: threading.Thread | None = None
        self._ensure_table()

    def _ensure_table(self) -> None:
        from delta.tables import DeltaTable

        if DeltaTable.isDeltaTable(self.spark, self.path):
            return
        props = (
            "'delta.checkpointInterval' = '10', "
            "'delta.dataSkippingStatsColumns' = 'split_id,offset,epoch,region', "
            "'delta.checkpoint.writeStatsAsStruct' = 'true'"
        )
        try:
            self.spark.sql(
                f"CREATE TABLE IF NOT EXISTS delta.`{self.path}` ({serde.read_ddl(serde.SINK_TABLE)}) "
                f"USING DELTA TBLPROPERTIES ({props})"
            )
        except Exception as err:
            if not DeltaTable.isDeltaTable(self.spark, self.path):
                raise StateError(
                    f"cannot create the sink table at {self.path}: {err}", path=self.path
                ) from err

    # -- idempotency record ----------------------------------------------------------

    def prepare_commit(self) -> None:
        """Get the next :meth:`commit`'s idempotency check ready in the background.

        Optional; the driver calls it at the start of an epoch, so that Delta's writer finds
        the table state it checks ``txnVersion`` against already reconstructed
        (:func:`~splitkeeper.runtime.delta_log.warm_snapshot_state`) instead of computing
        it while the epoch waits for its sink commit. A sink that adopts the staged files
        reads that version from the table's checksum instead, so it warms nothing: the
        reconstruction would only take cores from the epoch's region tasks.
        """
        self.close()
        if self._adopt_root() is not None:
            return
        self._warming = warm_snapshot_state(self.spark, self.path)

    def close(self) -> None:
        """Wait for background work :meth:`prepare_commit` started. Idempotent."""
        if self._warming is not None:
            self._warming.join()
            self._warming = None

    def committed_version(self) -> int | None:
        """The last ``txnVersion`` Delta recorded for this app id (= last committed epoch), or None.

        Read from the table's current snapshot through the JVM ``DeltaLog`` (the same
        view Delta's writer consults to skip a replayed ``txnVersion``), so it covers
        log checkpoints and JSON commits alike; normally from the version checksum, with
        no Spark job (:func:`~splitkeeper.runtime.delta_log.txn_version`). None for a
        fresh table or an app id that never committed.
        """
        return txn_version(delta_snapshot(self.spark, self.path), self.app_id)

    def committed_metadata(self, epoch_id: int) -> SinkCommit | None:
        """The commit of ``epoch_id`` by this app id, from DESCRIBE HISTORY; None if there is none.

        Crash recovery calls it when :meth:`committed_version` shows epoch N committed
        but the state store has no checkpoint N: the regions tell which regions' planned
        ranges are in the sink.
        """
        from delta.tables import DeltaTable

        table = DeltaTable.forPath(self.spark, self.path)
        recent = table.history(_RECENT_HISTORY)
        found = self._find_commit(recent, epoch_id)
        if found is None and recent.count() >= _RECENT_HISTORY:
            found = self._find_commit(table.history(), epoch_id)
        return found

    def _find_commit(self, history: DataFrame, epoch_id: int) -> SinkCommit | None:
        from pyspark.sql import functions as F

        rows = (
            history.where(F.col("userMetadata").isNotNull())
            .where(F.get_json_object("userMetadata", "$.app_id") == F.lit(self.app_id))
            .where(F.get_json_object("userMetadata", "$.epoch").cast("long") == F.lit(int(epoch_id)))
            .select(
                "version", "userMetadata", F.col("operationMetrics").getItem("numOutputRows").alias("rows")
            )
            .orderBy(F.col("version").desc())
            .limit(1)
            .collect()
        )
        if not rows:
            return None
        row = rows[0]
        metrics = {} if row["rows"] is None else {"numOutputRows": str(row["rows"])}
        found = DeltaCommit(int(row["version"]), user_metadata=row["userMetadata"], operation_metrics=metrics)
        return self._sink_commit(epoch_id, found)

    # -- commit ----------------------------------------------------------------------

    def commit(
        self,
        epoch_id: int,
        staged_paths: Sequence[str],
        acked_regions: Iterable[int],
        *,
        extra_metadata: Mapping[str, Any] | None = None,
    ) -> SinkCommit:
        """Append the staged files of the acknowledged regions of ``epoch_id`` in one Delta commit.

        Called by the driver once per completed (not aborted) checkpoint, before the
        state commit; called again for the same epoch on a crash replay. If Delta already
        recorded ``txnVersion >= epoch_id`` for this app id, nothing is written and the
        earlier commit's metadata is returned with ``skipped=True``. ``staged_paths``
        must be the files returned by the acknowledged regions' tasks (layout
        ``.../epoch=N/region=R/...``): a path of another epoch or of a region not in
        ``acked_regions`` raises InvalidParameterError. An epoch with no staged files
        still commits (no rows) so that the epoch is recorded as done. ``extra_metadata``
        (JSON-serialisable) is added to the commit's userMetadata; it may not override
        the keys the sink sets (app_id, epoch, regions, commit_id).
        """
        if isinstance(epoch_id, bool) or not isinstance(epoch_id, int) or epoch_id < 0:
            raise InvalidParameterError("epoch_id", epoch_id, "an integer >= 0")
        acked = tuple(sorted({int(r) for r in acked_regions}))
        extra = dict(extra_metadata or {})
        clash = sorted(set(extra) & _RESERVED_METADATA)
        if clash:
            raise InvalidParameterError(
                "extra_metadata", clash, f"keys other than {', '.join(sorted(_RESERVED_METADATA))}"
            )
        paths = [os.fspath(p) for p in staged_paths]
        self._check_paths(epoch_id, paths, acked)

        done = self.committed_version()
        if done is not None and done >= epoch_id:
            return self._already_committed(epoch_id)

        metadata = {**extra, "app_id": self.app_id, "epoch": epoch_id, "regions": list(acked)}
        try:
            adopted, commit = self._adopt(epoch_id, paths, metadata)
            if not adopted:
                commit = append_once(self._staged_frame(paths), self.path, self.app_id, epoch_id, metadata)
        except Exception as err:
            if is_concurrent_modification(err):
                raise ConcurrentRunError(
                    f"sink {self.path}: another run of app {self.app_id!r} committed at the same time as "
                    f"epoch {epoch_id}; only one run may drive a pipeline",
                    pipeline=self.app_id,
                    epoch_id=epoch_id,
                ) from err
            raise
        if commit is None:
            # Delta skipped our append: another writer recorded this epoch (or a later one) first.
            return self._already_committed(epoch_id)
        return self._sink_commit(epoch_id, commit)

    def _staged_frame(self, paths: Sequence[str]) -> DataFrame:
        """The staged files' records with ``ingested_at`` = now, in the table's column order."""
        from pyspark.sql import functions as F

        staged = staged_spark_schema()
        if paths:
            frame = self.spark.read.schema(staged).parquet(*paths)
        else:
            frame = self.spark.createDataFrame([], staged)
        return frame.withColumn("ingested_at", F.current_timestamp()).select(*_sink_schema().fieldNames())

    def _adopt_root(self) -> str | None:
        """The table's local folder when :meth:`commit` adds the staged files as they are (a
        local sink, direct writes on), else None."""
        return local_dir(self.path) if direct_writes_enabled() else None

    def _adopt(
        self, epoch_id: int, paths: Sequence[str], metadata: dict[str, Any]
    ) -> tuple[bool, DeltaCommit | None]:
        """Move the staged files into the table's folder and add them to the log in one commit.

        Returns (True, the commit), (True, None) when the app id had already recorded this
        epoch, or (False, None) when this sink cannot adopt files (not on a local filesystem,
        staging on another device, turned off, or a Delta build without the API): then
        nothing was moved or written. A staged file already
        moved by an earlier attempt of this commit (a crash between move and commit) is
        found under its table name. Staged files must be on the sink's filesystem.
        """
        root = self._adopt_root()
        if root is None:
            return False, None
        if any(local_dir(p) is None for p in paths):
            return False, None
        device = os.stat(root).st_dev
        if any(os.path.exists(p) and os.stat(p).st_dev != device for p in paths):
            return False, None  # a move would be a copy: let Spark do it
        import pyarrow.parquet as pq

        from splitkeeper.runtime.staging import STAGED_FILE_SCHEMA

        wanted = [(f.name, f.type) for f in STAGED_FILE_SCHEMA]
        found: list[tuple[str, str, str, int]] = []  # staged path, table name, current path, rows
        for staged in paths:
            name = adopted_name(staged)
            current = staged if os.path.exists(staged) else os.path.join(root, name)
            if not os.path.exists(current):
                raise StateError(
                    f"sink {self.path}: staged file {staged} of epoch {epoch_id} is gone (and was not moved "
                    f"into the table as {name}); recover the pipeline to read the epoch again",
                    path=staged,
                )
            meta = pq.read_metadata(current)
            if [(f.name, f.type) for f in meta.schema.to_arrow_schema()] != wanted:
                log.info("sink %s: %s lacks the table's columns; appending with Spark", self.path, staged)
                return False, None
            found.append((staged, name, current, meta.num_rows))
        files: list[DataFile] = []
        for _staged, name, current, rows in found:
            target = os.path.join(root, name)
            if current != target:
                os.replace(current, target)
            info = os.stat(target)
            files.append(DataFile(name, info.st_size, int(info.st_mtime * 1000), rows))
        records = sum(f.records for f in files)
        try:
            return True, commit_files_once(
                self.spark, self.path, self.app_id, epoch_id, files, {**metadata, "records": records}
            )
        except DeltaApiUnavailable as err:
            log.warning("sink %s: %s; appending the staged files with Spark instead", self.path, err)
            for staged, data in zip(paths, files, strict=True):
                os.makedirs(os.path.dirname(staged), exist_ok=True)
                os.replace(os.path.join(root, data.path), staged)
            return False, None

    def _sink_commit(self, epoch_id: int, commit: DeltaCommit) -> SinkCommit:
        meta = commit.metadata
        records = commit.output_rows
        if records is None and isinstance(meta.get("records"), int):
            records = int(meta["records"])
        return SinkCommit(
            app_id=self.app_id,
            epoch_id=int(epoch_id),
            regions=tuple(int(r) for r in meta.get("regions", ())),
            table_version=commit.version,
            records=records,
            commit_id=commit.commit_id,
            metadata=meta,
        )

    def _already_committed(self, epoch_id: int) -> SinkCommit:
        prior = self.committed_metadata(epoch_id)
        if prior is None:
            return SinkCommit(self.app_id, epoch_id, None, None, None, skipped=True)
        return SinkCommit(
            prior.app_id,
            prior.epoch_id,
            prior.regions,
            prior.table_version,
            prior.records,
            skipped=True,
            commit_id=prior.commit_id,
            metadata=prior.metadata,
        )

    @staticmethod
    def _check_paths(epoch_id: int, paths: Sequence[str], acked: tuple[int, ...]) -> None:
        for path in paths:
            segments = dict(_SEGMENT.findall(path.replace(os.sep, "/")))
            if "epoch" not in segments or "region" not in segments:
                raise InvalidParameterError(
                    "staged_paths",
                    path,
                    "a staged file under .../epoch=<N>/region=<R>/ (the layout region tasks write)",
                )
            if int(segments["epoch"]) != epoch_id:
                raise InvalidParameterError(
                    "staged_paths",
                    path,
                    f"a staged file of epoch {epoch_id}",
                    hint="it belongs to another epoch",
                )
            if int(segments["region"]) not in acked:
                raise InvalidParameterError(
                    "staged_paths",
                    path,
                    f"a staged file of an acknowledged region {list(acked)}",
                    hint="only acknowledged regions' output may be committed (DESIGN 2.5)",
                )

    # -- reading back ----------------------------------------------------------------

    def records(self) -> DataFrame:
        """The sink table as a DataFrame."""
        return self.spark.read.format("delta").load(self.path)

    def records_per_split(self) -> dict[str, SplitRecords]:
        """Per split id: how many records the sink holds and the offset range they span."""
        from pyspark.sql import functions as F

        rows = (
            self.records()
            .groupBy("split_id")
            .agg(
                F.count(F.lit(1)).alias("records"),
                F.min("offset").alias("first"),
                F.max("next_offset").alias("last"),
            )
            .collect()
        )
        return {r["split_id"]: SplitRecords(int(r["records"]), int(r["first"]), int(r["last"])) for r in rows}

    def offset_rows(self) -> Iterable[tuple[str, int, int]]:
        """``(split_id, offset, next_offset)`` of every record, ordered by split and offset (streamed)."""
        frame = self.records().select("split_id", "offset", "next_offset").orderBy("split_id", "offset")
        for row in frame.toLocalIterator():
            yield row["split_id"], int(row["offset"]), int(row["next_offset"])

    def check_exactly_once(self, expected: Mapping[str, tuple[int, int]]) -> list[Violation]:
        """Check DESIGN 6 on the sink: per split, records cover ``[start, end)`` exactly once.

        ``expected`` maps every split id to ``(start, end)``: where reading began and the
        committed position of the latest checkpoint. The rule is the core's
        (:func:`splitkeeper.core.invariants.check_sink_ranges`: each record covers
        ``[offset, next_offset)``, so Kafka offsets and byte offsets of file lines are
        checked alike); this streams it the sink's ``(split_id, offset, next_offset)``
        rows, sorted by Spark. Returns the violations (empty when exactly-once holds).
        """
        starts = {split_id: int(bounds[0]) for split_id, bounds in expected.items()}
        ends = {split_id: int(bounds[1]) for split_id, bounds in expected.items()}
        return check_sink_ranges(self.offset_rows(), starts, ends)
