"""What the runtime reads from Delta's transaction log, and the one idempotent append.

The state store and the sink make small, frequent commits and must know, cheaply and
exactly, what the log says: the table version, the last ``txnVersion`` an app id
recorded, whether a write of theirs is the commit that recorded it. Delta's public API
answers the last two only with Spark jobs (the snapshot's state reconstruction,
``DESCRIBE HISTORY``). This module asks the log itself:

- the version: ``DeltaLog.update()`` (lists ``_delta_log``, no Spark job);
- an app id's ``txnVersion``: from the version checksum (``<version>.crc``, which Delta
  writes with every commit and which lists the table's set transactions), else from
  the snapshot's state (a Spark job: older tables, or a checksum without them);
- one commit's actions: ``_delta_log/<version>.json`` as the Delta protocol defines it,
  read through Hadoop's ``FileSystem`` (local disk and object stores alike).

:func:`append_once` is the idempotent append every writer of the runtime uses: Delta's
``txnAppId``/``txnVersion`` make a replay write nothing, two concurrent writers of one
app id conflict in Delta's optimistic concurrency, and the commit this call made is
found by the id it carries in its ``userMetadata``, so a write Delta skipped is never
taken for one that landed.

:func:`commit_files_once` is the same idempotent append for parquet files that are
already written in the table's folder (the sink's staged files): one optimistic
transaction adds them with the ``txn`` action, so the data is not read and written again.

Internal Delta JVM API (``DeltaLog``, ``Snapshot``, ``VersionChecksum``,
``OptimisticTransaction``, ``Action.fromJson``, ``DeltaOperations.Write``), stable across
Delta 3 and 4: this module is the one place splitkeeper touches it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import InvalidParameterError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "COMMIT_ID_KEY",
    "DeltaCommit",
    "LoggedAppend",
    "append_arrow",
    "append_logged",
    "append_once",
    "commit_files_once",
    "DataFile",
    "DeltaApiUnavailable",
    "DIRECT_WRITES_ENV",
    "delta_file_count",
    "direct_writes_enabled",
    "delta_snapshot",
    "delta_table_version",
    "is_concurrent_modification",
    "local_dir",
    "read_commit",
    "remove_files",
    "txn_version",
    "warm_snapshot_state",
]

log = logging.getLogger(__name__)

#: The ``userMetadata`` key (a JSON object) under which :func:`append_once` names its commit.
COMMIT_ID_KEY = "commit_id"

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


def _jvm(spark: SparkSession) -> Any:
    jvm: Any = spark._jvm
    if jvm is None:
        raise StateError("the Delta log is read through the JVM: use a classic (not Connect) SparkSession")
    return jvm


def delta_snapshot(spark: SparkSession, path: str) -> Any:
    """The refreshed JVM Delta ``Snapshot`` of ``path`` (``DeltaLog.update()``), through py4j.

    Lists ``_delta_log`` and reads what changed; no Spark job. Its ``version()`` is -1 for
    a path that holds no table yet.
    """
    jvm = _jvm(spark)
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    none = jvm.scala.Option.empty()
    return delta_log.update(False, none, none)


def delta_table_version(spark: SparkSession, path: str) -> int:
    """The latest version of the Delta table at ``path``, -1 when there is none (no Spark job).

    Used to key caches on the table version.
    """
    return int(delta_snapshot(spark, path).version())


def warm_snapshot_state(spark: SparkSession, path: str) -> threading.Thread:
    """Start reconstructing the state of ``path``'s current snapshot in a daemon thread; return it.

    Delta's writer reads an app id's ``txnVersion`` from that state (Spark jobs) whenever a
    write carries ``txnAppId``. Computed ahead, while the driver does other work, the write
    finds it ready: Delta reuses the snapshot object as long as nobody commits in between.
    Errors in the thread are logged, never raised (the write then computes it itself).
    """
    snapshot = delta_snapshot(spark, path)

    def reconstruct() -> None:
        try:
            snapshot.transactions()
        except Exception as err:  # noqa: BLE001 - only an optimisation
            log.debug("warming the Delta state of %s failed: %s", path, err)

    thread = threading.Thread(target=reconstruct, name="splitkeeper-delta-state", daemon=True)
    thread.start()
    return thread


def _checksum(snapshot: Any) -> Any | None:
    """The snapshot's version checksum (JVM ``VersionChecksum``), or None when Delta has none."""
    try:
        found = snapshot.checksumOpt()
    except Exception:  # noqa: BLE001 - an engine without checksums: callers fall back
        return None
    return found.get() if found.isDefined() else None


def txn_version(snapshot: Any, app_id: str) -> int | None:
    """The last ``txnVersion`` app id ``app_id`` recorded in ``snapshot``'s table, or None.

    Read from the version checksum when it lists the set transactions (no Spark job);
    otherwise from the snapshot's reconstructed state (Delta's own view, a Spark job).
    """
    known, recorded = _checksum_txn_version(snapshot, app_id)
    if known:
        return recorded
    found = snapshot.transactions().get(app_id)
    return int(found.get()) if found.isDefined() else None


def _checksum_txn_version(snapshot: Any, app_id: str) -> tuple[bool, int | None]:
    """(True, app id ``app_id``'s ``txnVersion`` or None) when ``snapshot``'s version checksum
    lists the set transactions, else (False, None): then only the state knows."""
    checksum = _checksum(snapshot)
    if checksum is None:
        return False, None
    known = checksum.setTransactions()
    if not known.isDefined():
        return False, None
    recorded = known.get()
    for i in range(int(recorded.size())):
        entry = recorded.apply(i)
        if str(entry.appId()) == app_id:
            return True, int(entry.version())
    return True, None


def _read_txn_version(txn: Any, app_id: str) -> int:
    """``txn.txnVersion(app_id)`` (-1 when none) without reconstructing the table's state.

    Delta's ``txnVersion`` records the read (so that a concurrent commit of the same app id
    conflicts) and looks the version up in the snapshot's state, a Spark job on a new
    snapshot. When the read snapshot's checksum lists the set transactions, the version
    comes from there and the read is recorded in the transaction's ``readTxn`` directly.
    """
    from py4j.protocol import Py4JError

    known, recorded = _checksum_txn_version(txn.snapshot(), app_id)
    if known:
        try:
            txn.readTxn().addOne(app_id)
        except Py4JError:
            pass  # another Delta build: ask the transaction itself
        else:
            return -1 if recorded is None else recorded
    return int(txn.txnVersion(app_id))


def delta_file_count(snapshot: Any) -> int | None:
    """How many data files ``snapshot``'s table has, from the version checksum; None if unknown."""
    if int(snapshot.version()) < 0:
        return 0
    checksum = _checksum(snapshot)
    return None if checksum is None else int(checksum.numFiles())


@dataclass(frozen=True, slots=True)
class DeltaCommit:
    """One commit of a Delta table as its log file records it (what splitkeeper needs of it)."""

    version: int
    operation: str = ""  # commitInfo.operation: WRITE, MERGE, DELETE, OPTIMIZE, CREATE TABLE, ...
    transactions: dict[str, int] = field(default_factory=dict)  # app id -> txnVersion it recorded
    user_metadata: str | None = None
    operation_metrics: dict[str, str] = field(default_factory=dict)

    @property
    def metadata(self) -> dict[str, Any]:
        """``userMetadata`` as a JSON object; empty when absent or not a JSON object."""
        if not self.user_metadata:
            return {}
        try:
            parsed = json.loads(self.user_metadata)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, dict) else {}

    @property
    def commit_id(self) -> str:
        return str(self.metadata.get(COMMIT_ID_KEY, ""))

    @property
    def output_rows(self) -> int | None:
        rows = self.operation_metrics.get("numOutputRows")
        return None if rows is None else int(rows)


def read_commit(spark: SparkSession, path: str, version: int) -> DeltaCommit | None:
    """Commit ``version`` of the table at ``path``, read from ``_delta_log/<version>.json``.

    None when the file does not exist (never written, or removed by log cleanup).
    """
    jvm = _jvm(spark)
    log_file = jvm.org.apache.hadoop.fs.Path(f"{path.rstrip('/')}/_delta_log/{int(version):020d}.json")
    fs = log_file.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(log_file):
        return None
    stream = fs.open(log_file)
    try:
        text = str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
    finally:
        stream.close()
    operation = ""
    transactions: dict[str, int] = {}
    user_metadata: str | None = None
    metrics: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "txn" in action:
            transactions[str(action["txn"]["appId"])] = int(action["txn"]["version"])
        elif "commitInfo" in action:
            info = action["commitInfo"]
            operation = str(info.get("operation", ""))
            user_metadata = info.get("userMetadata")
            metrics = {str(k): str(v) for k, v in (info.get("operationMetrics") or {}).items()}
    return DeltaCommit(int(version), operation, transactions, user_metadata, metrics)


@dataclass(frozen=True, slots=True)
class LoggedAppend:
    """An append and what landed before it: the commits after the caller's version, oldest first.

    ``files``: the data files the append added with their partition values, when it wrote
    them itself (:func:`append_arrow`); empty for Spark's appends.
    """

    commit: DeltaCommit
    earlier: tuple[DeltaCommit, ...]
    files: tuple[tuple[DataFile, dict[str, str]], ...] = ()


def _tag(user_metadata: Mapping[str, Any] | None) -> tuple[str, str]:
    extra = dict(user_metadata or {})
    if COMMIT_ID_KEY in extra:
        raise InvalidParameterError("user_metadata", sorted(extra), f"keys other than {COMMIT_ID_KEY!r}")
    commit_id = uuid.uuid4().hex
    return commit_id, json.dumps({**extra, COMMIT_ID_KEY: commit_id}, sort_keys=True, default=str)


def _logged_commit(spark: SparkSession, path: str, version: int, since_version: int | None) -> DeltaCommit:
    """Commit ``version``, written after the caller read ``since_version``; StateError if its log
    file is gone (then nobody can tell what landed around the caller's append)."""
    commit = read_commit(spark, path, version)
    if commit is None:
        raise StateError(
            f"Delta table {path}: commit {version} (written since version {since_version}) has no log "
            "file; cannot tell what landed around this append",
            path=path,
            version=version,
        )
    return commit


def _find_own(
    spark: SparkSession, path: str, since_version: int, commit_id: str
) -> tuple[DeltaCommit | None, tuple[DeltaCommit, ...]]:
    """The commit named ``commit_id`` among those after ``since_version``, and the ones before it."""
    earlier: list[DeltaCommit] = []
    for version in range(int(since_version) + 1, delta_table_version(spark, path) + 1):
        commit = _logged_commit(spark, path, version, since_version)
        if commit.commit_id == commit_id:
            return commit, tuple(earlier)
        earlier.append(commit)
    return None, tuple(earlier)


def append_logged(
    frame: DataFrame, path: str, since_version: int, user_metadata: Mapping[str, Any] | None = None
) -> LoggedAppend:
    """Append ``frame`` to the Delta table at ``path`` (a blind append); return its commit and the
    commits that landed between version ``since_version`` and it.

    The caller decides from ``earlier`` whether another writer got there first (a
    first-writer-wins claim: blind appends never conflict in Delta, so the log order
    decides). ``user_metadata`` is stored as the commit's ``userMetadata`` JSON with
    :data:`COMMIT_ID_KEY` added. Called on the driver; the table must exist.
    """
    commit_id, metadata = _tag(user_metadata)
    frame.write.format("delta").mode("append").option("userMetadata", metadata).save(path)
    commit, earlier = _find_own(frame.sparkSession, path, since_version, commit_id)
    if commit is None:
        raise StateError(f"Delta table {path}: the append tagged {commit_id} is not in the log", path=path)
    return LoggedAppend(commit, earlier)


def append_once(
    frame: DataFrame,
    path: str,
    app_id: str,
    version: int,
    user_metadata: Mapping[str, Any] | None = None,
) -> DeltaCommit | None:
    """Append ``frame`` to the Delta table at ``path`` as ``txnAppId=app_id``, ``txnVersion=version``.

    Returns the commit this call made, or None when it wrote nothing because ``app_id``
    had already recorded ``version`` or a higher one: before the call, or by another
    writer whose commit landed between this call's check and its write (Delta then
    skips the write silently; the commit id in ``userMetadata`` tells the two apart).
    Two writers of one app id at the same moment conflict: Delta raises its
    ``ConcurrentTransactionException`` in one of them (see
    :func:`is_concurrent_modification`), which propagates. ``user_metadata`` is stored
    as the commit's ``userMetadata`` JSON with :data:`COMMIT_ID_KEY` added. Delta's
    writer reads the app id's version from the table's reconstructed state (Spark jobs
    when the snapshot is new), so this costs more than :func:`append_logged`.
    Called on the driver; the table must exist.
    """
    commit_id, metadata = _tag(user_metadata)
    spark = frame.sparkSession
    before = delta_snapshot(spark, path)
    recorded = txn_version(before, app_id)
    if recorded is not None and recorded >= version:
        return None
    (
        frame.write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", int(version))
        .option("userMetadata", metadata)
        .save(path)
    )
    return _find_own(spark, path, int(before.version()), commit_id)[0]


@dataclass(frozen=True, slots=True)
class DataFile:
    """A parquet file in a Delta table's folder, not yet in its log."""

    path: str  # relative to the table root, without characters that need URI escaping
    size: int
    modification_time_ms: int
    records: int


class DeltaApiUnavailable(RuntimeError):
    """This Delta build lacks the transaction API :func:`commit_files_once` uses (nothing was written)."""


#: Builds a ``DeltaOperations`` value from the JVM view and ``PythonUtils.toSeq``.
_Operation = Callable[[Any, Any], Any]


def _write_operation(user_metadata: str) -> _Operation:
    """``DeltaOperations.Write(Append, userMetadata=...)`` (the constructor of Delta 4.x)."""

    def build(jvm: Any, _to_seq: Any) -> Any:
        option = jvm.scala.Option
        none = option.empty()
        write = getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Write")
        return write(
            jvm.org.apache.spark.sql.SaveMode.Append, none, none, option.apply(user_metadata), *([none] * 5)
        )

    return build


def _delete_operation(jvm: Any, to_seq: Any) -> Any:
    """``DeltaOperations.Delete`` with no predicate (the caller names the removed files)."""
    return getattr(jvm.org.apache.spark.sql.delta, "DeltaOperations$Delete")(
        to_seq(jvm.java.util.ArrayList())
    )


def _transaction_api(spark: SparkSession, path: str, operation: _Operation) -> tuple[Any, Any, Any, Any]:
    """(DeltaLog, Action companion, the built ``operation``, PythonUtils.toSeq) through py4j."""
    from py4j.protocol import Py4JError

    jvm = _jvm(spark)
    try:
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        action = jvm.org.apache.spark.sql.delta.actions.Action
        to_seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
        built = operation(jvm, to_seq)
    except (Py4JError, AttributeError, TypeError) as err:
        raise DeltaApiUnavailable(f"Delta's transaction API is not usable here: {err}") from err
    return delta_log, action, built, to_seq


def _add_json(data: DataFile, partition_values: Mapping[str, str] | None = None) -> str:
    add = {
        "path": data.path,
        "partitionValues": dict(partition_values or {}),
        "size": int(data.size),
        "modificationTime": int(data.modification_time_ms),
        "dataChange": True,
        "stats": json.dumps({"numRecords": int(data.records)}),
    }
    return json.dumps({"add": add})


def _commit_actions(
    spark: SparkSession, txn: Any, api: tuple[Any, Any, Any, Any], lines: Sequence[str]
) -> int:
    """Commit the actions ``lines`` (Delta protocol JSON, one action each) in ``txn``; its version."""
    _delta_log, action, operation, to_seq = api
    actions = _jvm(spark).java.util.ArrayList()
    for line in lines:
        actions.add(action.fromJson(line))
    return int(txn.commit(to_seq(actions), operation))


def commit_files_once(
    spark: SparkSession,
    path: str,
    app_id: str,
    version: int,
    files: Sequence[DataFile],
    user_metadata: Mapping[str, Any] | None = None,
) -> DeltaCommit | None:
    """Add ``files`` (already in the table's folder) to the Delta table at ``path`` in one commit
    that records ``txnAppId=app_id``, ``txnVersion=version``: :func:`append_once` without
    rewriting the data.

    Returns the commit, or None when ``app_id`` had already recorded ``version`` or a
    higher one (nothing written). The transaction reads the app id's version, so a
    concurrent commit of the same app id makes Delta raise its
    ``ConcurrentTransactionException`` here (see :func:`is_concurrent_modification`).
    The files must hold exactly the table's columns (Delta does not look inside them);
    each gets ``numRecords`` statistics. Raises :class:`DeltaApiUnavailable` before
    anything is written when the JVM API differs from what this module knows.
    """
    _commit_id, metadata = _tag(user_metadata)
    api = _transaction_api(spark, path, _write_operation(metadata))
    txn = api[0].startTransaction()
    if _read_txn_version(txn, app_id) >= version:
        return None
    now_ms = int(time.time() * 1000)
    txn_action = json.dumps({"txn": {"appId": app_id, "version": int(version), "lastUpdated": now_ms}})
    committed = _commit_actions(spark, txn, api, [*map(_add_json, files), txn_action])
    metrics = {"numFiles": str(len(files)), "numOutputRows": str(sum(int(f.records) for f in files))}
    return DeltaCommit(committed, "WRITE", {app_id: int(version)}, metadata, metrics)


#: ``0`` turns direct writes off: the sink and the state store append with Spark jobs.
DIRECT_WRITES_ENV = "SPLITKEEPER_DIRECT_WRITES"


def direct_writes_enabled() -> bool:
    """Whether local tables are written without Spark jobs (:func:`append_arrow`, the sink's adoption)."""
    return os.environ.get(DIRECT_WRITES_ENV, "1") != "0"


def local_dir(path: str) -> str | None:
    """``path`` as a local directory when it is one (no scheme, or ``file:``), else None."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return None if "://" in path else path


def append_arrow(
    spark: SparkSession,
    path: str,
    table: Any,
    partition_column: str | None,
    since_version: int | None,
    user_metadata: Mapping[str, Any] | None = None,
) -> LoggedAppend | None:
    """Append the pyarrow ``table`` to the local Delta table at ``path`` without a Spark job: one
    parquet file per partition value, written into the table's folder by pyarrow and added in
    one blind-append commit. Returns it as :func:`append_logged` does (``since_version`` None:
    no earlier commits are read), or None (nothing written) when ``path`` is not local, direct
    writes are turned off, or the JVM API is not there; the caller then appends with Spark.

    ``table`` must have the table's columns with Spark-compatible types (the partition
    column is not written into the files: Delta keeps it in the log, as Spark's writer does).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = local_dir(path)
    if root is None or not direct_writes_enabled():
        return None
    _commit_id, metadata = _tag(user_metadata)
    try:
        api = _transaction_api(spark, path, _write_operation(metadata))
    except DeltaApiUnavailable as err:
        log.warning("%s; appending to %s with Spark", err, path)
        return None
    groups: list[tuple[dict[str, str], Any]] = []
    if partition_column is None:
        groups.append(({}, table))
    else:
        column = table.column(partition_column)
        for value in pc.unique(column).to_pylist():
            part = table.filter(pc.equal(column, value)).drop_columns([partition_column])
            groups.append(({partition_column: "" if value is None else str(value)}, part))
    files: list[tuple[DataFile, dict[str, str]]] = []
    for values, part in groups:
        folder = "/".join(f"{k}={v}" for k, v in values.items())
        name = f"{folder + '/' if folder else ''}part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        target = os.path.join(root, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        pq.write_table(part, target, compression="snappy")
        info = os.stat(target)
        files.append((DataFile(name, info.st_size, int(info.st_mtime * 1000), part.num_rows), values))
    version = _commit_actions(spark, api[0].startTransaction(), api, [_add_json(d, v) for d, v in files])
    metrics = {"numFiles": str(len(files)), "numOutputRows": str(table.num_rows)}
    commit = DeltaCommit(version, "WRITE", {}, metadata, metrics)
    first = version if since_version is None else int(since_version) + 1
    earlier = tuple(_logged_commit(spark, path, v, since_version) for v in range(first, version))
    return LoggedAppend(commit, earlier, tuple(files))


def remove_files(spark: SparkSession, path: str, files: Sequence[tuple[DataFile, Mapping[str, str]]]) -> int:
    """Remove ``files`` (with their partition values, as :func:`append_arrow` added them) from
    the Delta table at ``path`` in one DELETE commit, without a Spark job; return its version.

    Deleting whole partitions this way needs no snapshot state (Spark's DELETE reconstructs
    it to find the files). The caller must know the files are still in the table. The
    transaction reads the whole table, so a commit that added or removed files since it
    started conflicts (Delta raises, see :func:`is_concurrent_modification`). Raises
    :class:`DeltaApiUnavailable` before writing anything when the JVM API differs.
    """
    api = _transaction_api(spark, path, _delete_operation)
    jvm = _jvm(spark)
    txn = api[0].startTransaction()
    txn.readWholeTable()
    # DELETE's commit reports its metrics; they are counted here, not by a Spark plan.
    counted = {"numRemovedFiles": len(files), "numDeletedRows": sum(int(d.records) for d, _v in files)}
    metrics = jvm.java.util.HashMap()
    for name, value in counted.items():
        metric = jvm.org.apache.spark.sql.execution.metric.SQLMetrics.createMetric(spark._jsc.sc(), name)
        metric.set(int(value))
        metrics.put(name, metric)
    txn.registerSQLMetrics(
        spark._jsparkSession, jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(metrics)
    )
    now_ms = int(time.time() * 1000)
    lines = [
        json.dumps(
            {
                "remove": {
                    "path": data.path,
                    "deletionTimestamp": now_ms,
                    "dataChange": True,
                    "extendedFileMetadata": True,
                    "partitionValues": dict(values),
                    "size": int(data.size),
                }
            }
        )
        for data, values in files
    ]
    return _commit_actions(spark, txn, api, lines)
