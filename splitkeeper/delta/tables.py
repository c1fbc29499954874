"""Create, open, check and read the Delta tables; the errors of a damaged table or a refused write.

The tables' columns, partitioning and properties are :mod:`splitkeeper.delta.schemas`'s
(the one definition); this module makes them real with delta-rs.

Rules:

1. :func:`ensure_table` creates a missing table (create-if-absent: of two processes
   creating it at once, one commits version 0 and the other opens it) and checks an
   existing one with :func:`check_layout`: the same columns with the same types and
   the same partitioning, or a StateError that names the table, what it has and what
   is expected. The one migration that exists adds nullable columns at the end
   (:attr:`~splitkeeper.delta.schemas.TableSpec.added_columns`, ``ALTER TABLE ADD
   COLUMNS``); old rows read NULL. A create whose store call fails (a reset connection may
   lose the answer to a put that landed) reads the table again: there, it is opened as
   created; not there, the create is tried again (:data:`CREATE_ATTEMPTS` in all, each a
   ``table_create`` retry of :mod:`splitkeeper.delta.retries`).
2. :func:`open_table` wraps every load of a table: a damaged log becomes a StateError
   naming the table, the log file and what to do (:func:`log_error`); an unreadable data
   file one naming the table and the file (:func:`data_file_error`).
3. A write the operating system refuses (read-only file system, no space, no
   permission) is a StateError naming the path (:func:`os_error`), from every write
   through :func:`guarded` and the fence.
4. :meth:`StateTables.append` lands exactly once, whatever the store does to its answer. Every
   append carries an app transaction of its writer (``Transaction(<APPEND_APP_ID><writer>,
   n)``: one app id per :class:`StateTables` object, so per process, and ``n`` its n-th append
   to that table). A reset connection can cut the answer to a put that landed; object_store then
   sends the put again, meets its own ``_delta_log/N.json`` (412) and delta-rs rebases the
   append onto version N+1: without the transaction that is the same rows committed twice;
   with it, delta-rs's conflict check finds the writer's app id in commit N and fails the copy
   (``CommitFailedError``). On that, or on any error of the store (``OSError``), the table is
   read again: when it records the append's ``n`` the append landed and is done; otherwise it is
   sent again, with the same transaction, so a copy still in flight and the new one cannot
   both land (:data:`APPEND_ATTEMPTS` in all, each an ``state_append`` retry of
   :mod:`splitkeeper.delta.retries`), then a StateError naming the table and the store's error.
   The cost is one ``txn`` entry per writing process in each table it appends to.
5. :meth:`StateTables.delete` deletes the rows a predicate names, whatever the store does to its
   answer. Its predicates name settled rows only (a refused decision, checkpoints retention
   removes, rows below the oldest kept epoch), which no later write adds again, so a delete is
   idempotent: one whose store call failed, or whose resent copy delta-rs refused because its own
   first copy had landed (a delete meeting a delete of the same files), is read again and sent
   again (:data:`APPEND_ATTEMPTS` in all, each a ``state_delete`` retry), then a StateError.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from splitkeeper.delta import retries, storage
from splitkeeper.delta.schemas import SINK_TABLE, TableSpec, spec
from splitkeeper.errors import DamagedTableError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

__all__ = [
    "REPAIRABLE",
    "REPAIR_ADVICE",
    "StateTables",
    "check_layout",
    "data_file_error",
    "ensure_table",
    "guarded",
    "log_error",
    "open_table",
    "os_error",
    "read_rows",
    "refresh",
    "sql_string",
]

log = logging.getLogger(__name__)

#: :func:`ensure_table`: a create whose store call failed (a 503 past the client's own retries, a
#: reset connection: its answer lost) reads the table again and, while it is not there, is tried
#: again; this many attempts in all.
CREATE_ATTEMPTS = 4
#: Rule 4: the app id prefix of :meth:`StateTables.append`'s transactions, and how many times an
#: append whose store call failed (and that the table, read again, does not record) is sent.
APPEND_APP_ID = "splitkeeper-append:"
APPEND_ATTEMPTS = 4

T = TypeVar("T")


def load_deltalake() -> None:
    """Import the deltalake modules this package uses, in the calling thread.

    Call it before handing Delta work to threads in a process that may not have imported deltalake
    yet: a first import of its modules from several threads at once can meet CPython's import
    deadlock avoidance, which hands one thread a partially initialized module (``ImportError: cannot
    import name 'CommitProperties' from partially initialized module 'deltalake.transaction'``; 2 of
    48 fresh processes opening a fresh state directory, four at a time, before this existed).
    """
    import deltalake  # noqa: F401
    import deltalake.exceptions  # noqa: F401
    import deltalake.transaction  # noqa: F401


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal for a delta-rs predicate (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


# --------------------------------------------------------------------------- create, open, check (1, 2)


def _shape(data_type: Any) -> Any:
    """A comparable form of an arrow type without nullability, list item names or map field names
    (Arrow's ``entries``/``key``/``value``, a writer's own value name, Delta's ``key_value``)."""
    if pa.types.is_map(data_type):
        return ("map", _shape(data_type.key_type), _shape(data_type.item_type))
    if pa.types.is_struct(data_type):
        return ("struct", tuple((f.name, _shape(f.type)) for f in data_type))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return ("list", _shape(data_type.value_type))
    if pa.types.is_large_string(data_type) or pa.types.is_string_view(data_type):
        return str(pa.string())
    if pa.types.is_large_binary(data_type) or pa.types.is_binary_view(data_type):
        return str(pa.binary())
    if pa.types.is_timestamp(data_type):
        return ("timestamp", data_type.tz is not None)
    return str(data_type)


def _arrow_schema(table: DeltaTable) -> pa.Schema:
    return pa.schema(table.schema().to_arrow())


def log_error(uri: str, err: BaseException) -> DamagedTableError:
    """A StateError for a table whose log delta-rs cannot read: names the damaged log file (rule 2)."""
    uri = storage.delta_location(uri)
    damaged = _damaged_log_file(uri)
    where = f"log file {damaged}" if damaged else f"its _delta_log ({err})"
    name = os.path.basename(uri.rstrip("/"))
    if name in REPAIRABLE:
        advice = REPAIR_ADVICE
    else:
        advice = (
            "Restore that file from a backup or the original copy of the table. Only if it is the newest "
            "commit and nothing was committed after it elsewhere (for a sink table: no checkpoint row names "
            "its epoch) may it be moved out of _delta_log, which rolls the table back one version; run "
            "'splitkeeper validate' afterwards"
        )
    return DamagedTableError(
        f"the Delta table at {uri} cannot be read: {where} is not a complete Delta log entry (truncated or "
        f"damaged, e.g. a copy that stopped half-way). Nothing was read or written. {advice}",
        table=name,
        path=uri,
        log_file=damaged,
    )


#: Tables whose kept checkpoints' rows ``recover --repair`` rewrites from the decision records.
REPAIRABLE = ("enumerator_state", "audit")
#: What a StateError about lost or damaged rows of those tables advises (tests try it).
REPAIR_ADVICE = (
    "Repair it with 'splitkeeper recover --config <the pipeline config> --repair', which moves damaged "
    "data files and a damaged newest log entry of the enumerator_state and audit tables aside (to "
    "_damaged/ under the state directory), rewrites each kept checkpoint's rows of those tables from "
    "its decision record (decisions table) and checks them; or restore the state directory from a backup"
)


def data_file_error(name: str, uri: str, err: BaseException) -> DamagedTableError:
    """A StateError for a data file of table ``name`` that cannot be read (truncated, damaged or
    gone): names the table and the file, and what to do (rule 2)."""
    text = str(err)
    quoted = re.search(r"'([^']+\.parquet)'", text) or re.search(r"(\S+\.parquet)", text)
    found = quoted.group(1) if quoted else None
    path = None if found is None else (found if found.startswith(uri) else storage.join(uri, found))
    what = f"data file {path}" if path else "a data file"
    if name in REPAIRABLE:
        advice = REPAIR_ADVICE
    elif name == SINK_TABLE:
        advice = "Restore that file (or the sink table) from a backup"
    else:
        advice = (
            "Restore that file (or the state directory) from a backup; 'recover --repair' rebuilds only "
            f"the {' and '.join(REPAIRABLE)} tables"
        )
    return DamagedTableError(
        f"table {name} at {uri} cannot be read: {what} is damaged, truncated or missing ({text}). "
        f"Nothing was read or written. {advice}",
        table=name,
        path=uri,
        file=path,
    )


def _damaged_log_file(uri: str) -> str | None:
    """The first ``_delta_log/*.json`` file after the newest log checkpoint that is not valid JSON lines."""
    import pyarrow.fs as pafs

    try:
        fs, root = storage.filesystem(uri)
        infos = fs.get_file_info(pafs.FileSelector(storage.join(root, "_delta_log"), allow_not_found=True))
    except Exception:  # noqa: BLE001 - a diagnosis only; the caller reports what it can
        return None
    names = sorted(i.path for i in infos if i.type == pafs.FileType.File)
    checkpoints = [n for n in names if ".checkpoint." in n]
    floor = os.path.basename(checkpoints[-1]).split(".")[0] if checkpoints else ""
    for path in names:
        base = os.path.basename(path)
        if not re.fullmatch(r"\d{20}\.json", base) or base.split(".")[0] < floor:
            continue
        try:
            with fs.open_input_stream(path) as stream:
                text = stream.read().decode("utf-8")
            for line in text.splitlines():
                if line.strip():
                    json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return path
        except Exception:  # noqa: BLE001
            continue
    return None


#: What a delta-rs error says when a log entry does not parse (a ``.json`` log file named, not any
#: path that happens to contain "json": a table under ``/tmp/test_json_x`` is not a damaged log).
_LOG_ERROR = re.compile(r"Json error|Invalid JSON|EOF while parsing|Truncated|\d{20}\.json\b")


def _is_log_error(err: BaseException) -> bool:
    return _LOG_ERROR.search(str(err)) is not None


#: OS errors a user fixes on the machine, not in the state: (errno, what the DeltaError text says).
_OS_FAULTS = (
    (errno.EROFS, "Read-only file system"),
    (errno.ENOSPC, "No space left on device"),
    (errno.EDQUOT, "Disk quota exceeded"),
    (errno.EACCES, "Permission denied"),
    (errno.EPERM, "Operation not permitted"),
)


def os_fault(err: BaseException) -> str | None:
    """The OS fault ``err`` reports (read-only, full, no permission), or None for any other error."""
    if isinstance(err, OSError) and err.errno is not None:
        return next((text for number, text in _OS_FAULTS if number == err.errno), None)
    message = str(err)
    return next(
        (text for number, text in _OS_FAULTS if text in message or f"os error {number})" in message), None
    )


def os_error(path: str, err: BaseException, fault: str) -> StateError:
    """A StateError for a write the operating system refused under ``path`` (rule 3)."""
    named = re.search(r"(/[^\s:#]+)", str(err)) if not isinstance(err, OSError) else None
    where = getattr(err, "filename", None) or (named.group(1) if named else storage.delta_location(path))
    return StateError(
        f"cannot write to {storage.delta_location(path)}: {fault} ({where}). A commit either lands whole "
        "or not at all, so what was committed before is intact and this epoch is read again on the next "
        "run. Make the folder writable or free space (or point the config at another folder), then run "
        "again",
        path=storage.delta_location(path),
        fault=fault,
    )


def guarded(uri: str, call: Callable[[], T]) -> T:
    """``call()``, with a damaged-log DeltaError turned into :func:`log_error` (rule 2) and a write the
    operating system refused (read-only, full, no permission) into :func:`os_error` (rule 3)."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    try:
        return call()
    except CommitFailedError:
        raise  # a lost race: the fence decides
    except (DeltaError, OSError) as err:
        fault = os_fault(err)
        if fault is not None:
            raise os_error(uri, err, fault) from err
        if isinstance(err, DeltaError) and _is_log_error(err):
            raise log_error(uri, err) from err
        raise


def open_table(uri: str, *, missing_ok: bool = False) -> DeltaTable | None:
    """The Delta table at ``uri`` (latest version), or None when there is none and ``missing_ok``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    options = storage.storage_options(uri)
    try:
        return guarded(uri, lambda: DeltaTable(uri, storage_options=options))
    except TableNotFoundError:
        if missing_ok:
            return None
        raise


def refresh(table: DeltaTable) -> DeltaTable:
    """Bring ``table`` to its latest version (reads only the new log entries)."""
    guarded(table.table_uri, table.update_incremental)
    return table


def check_layout(table: DeltaTable, spec: TableSpec, uri: str, *, migrate: bool) -> bool:
    """Rule 1 on an existing table; True when it matches (after migrating, if ``migrate``).

    A table that only lacks :attr:`TableSpec.added_columns` at the end returns False
    without ``migrate`` (readers fill those columns with NULL); anything else raises.
    """
    protocol = table.protocol()
    if protocol.reader_features and "deletionVectors" in protocol.reader_features:
        raise StateError(
            f"table {spec.name} at {uri} uses deletion vectors (written by the Spark-based store of an "
            "older splitkeeper): delta-rs, the writer of the state tables now, cannot write them. Use a "
            "fresh state directory, or rewrite the table without deletion vectors with Spark "
            "(REORG TABLE ... APPLY (PURGE), then ALTER TABLE ... SET TBLPROPERTIES "
            "('delta.enableDeletionVectors' = 'false'))",
            table=spec.name,
            path=uri,
        )
    actual = _arrow_schema(table)
    partitions = list(table.metadata().partition_columns)
    expected = spec.schema
    have = [(f.name, _shape(f.type)) for f in actual]
    want = [(f.name, _shape(f.type)) for f in expected]
    if have == want and partitions == spec.partition_by:
        return True
    added = want[len(have) :]
    if (
        partitions == spec.partition_by
        and want[: len(have)] == have
        and added
        and {name for name, _shape_ in added} <= spec.added_columns
    ):
        if not migrate:
            return False
        from deltalake.schema import Field

        new = [Field.from_arrow(expected.field(name).with_nullable(True)) for name, _ in added]
        table.alter.add_columns(new)
        log.info("table %s at %s: added columns %s", spec.name, uri, [n for n, _ in added])
        return True
    raise StateError(
        f"table {spec.name} at {uri} has columns {[n for n, _ in have]} partitioned by {partitions}, but "
        f"splitkeeper expects {[n for n, _ in want]} partitioned by {spec.partition_by} "
        f"(splitkeeper/delta/schemas.py, state/{spec.name}.ddl): the directory was written by another "
        "splitkeeper state format; use a "
        "fresh state directory (or migrate the table)",
        table=spec.name,
        path=uri,
    )


def ensure_table(
    uri: str, spec: TableSpec, *, data: pa.Table | None = None, commit_properties: Any = None
) -> tuple[DeltaTable, bool]:
    """The table at ``uri``, created when absent (rule 1); returns (table, created by this call).

    ``data`` goes into the creating commit (version 0) itself: the create is then also
    a first-writer-wins claim (the commit is never retried as a later version). An
    existing table is checked and migrated, never written.
    """
    from deltalake.exceptions import CommitFailedError, DeltaError
    from deltalake.transaction import CommitProperties

    existing = open_table(uri, missing_ok=True)
    if existing is not None:
        check_layout(existing, spec, uri, migrate=True)
        return existing, False
    options = storage.storage_options(uri)
    # No retries: delta-rs retries a commit that lost version 0 as version 1, which would make
    # a second "create" (with its own metadata and rows) land on top of the first.
    once = CommitProperties(
        custom_metadata=getattr(commit_properties, "custom_metadata", None),
        app_transactions=getattr(commit_properties, "app_transactions", None),
        max_commit_retries=0,
    )
    found: list[DeltaTable] = []

    def there(err: BaseException) -> bool:
        """Is the table there after a failed create? Another process may have created it at the same
        moment (CommitFailedError, DeltaError: fine if it is there now, rule 1), or the store failed
        with the answer lost while the create landed (OSError: read again after a backoff)."""
        if isinstance(err, OSError):
            fault = os_fault(err)
            if fault is not None:
                raise os_error(uri, err, fault) from err
            try:
                table = open_table(uri, missing_ok=True)
            except OSError:
                return False
            if table is not None:
                log.warning("creating table %s at %s raised (%s); it exists now", spec.name, uri, err)
        else:
            table = open_table(uri, missing_ok=True)
            if table is None:
                raise StateError(f"cannot create table {spec.name} at {uri}: {err}", table=spec.name) from err
        if table is None:
            return False
        check_layout(table, spec, uri, migrate=True)
        found.append(table)
        return True

    try:
        created = retries.send_until_landed(
            lambda: _create(uri, spec, data, once, options),
            landed=there,
            operation="table_create",
            sends=CREATE_ATTEMPTS,
            failures=(CommitFailedError, DeltaError, OSError),
            settle=lambda err: isinstance(err, OSError),
            what=f"creating table {spec.name} at {uri}",
        )
    except OSError as last:
        raise StateError(
            f"cannot create table {spec.name} at {uri}: the store failed {CREATE_ATTEMPTS} times (last: "
            f"{last}) and the table is not there; nothing was created: check the object store, then run "
            "again",
            table=spec.name,
        ) from last
    return (created, True) if created is not None else (found[-1], False)


def _create(uri: str, spec: TableSpec, data: pa.Table | None, once: Any, options: Any) -> DeltaTable:
    """One attempt of :func:`ensure_table`'s create (version 0, with ``data`` when given)."""
    from deltalake import DeltaTable, write_deltalake

    if data is None:
        created = DeltaTable.create(
            uri,
            spec.schema,
            mode="error",
            partition_by=spec.partition_by or None,
            configuration=spec.properties,
            storage_options=options,
            commit_properties=once,
            # splitkeeper's own keys (an upsert sink's splitkeeper.sink.mode/key) beside delta.*
            raise_if_key_not_exists=False,
        )
    else:
        write_deltalake(
            uri,
            data,
            mode="error",
            partition_by=spec.partition_by or None,
            configuration=spec.properties,
            storage_options=options,
            commit_properties=once,
        )
        created = DeltaTable(uri, storage_options=options)
    return created


def _native_filesystem(uri: str) -> Any:
    """pyarrow's own file system rooted at the table (local or S3), instead of deltalake's Python-backed
    one: faster, and no Python callbacks from Arrow's IO threads while the interpreter shuts down."""
    import pyarrow.fs as pafs

    fs, root = storage.filesystem(storage.delta_location(uri))
    return pafs.SubTreeFileSystem(root, fs)


def read_rows(
    table: DeltaTable,
    spec: TableSpec,
    *,
    partitions: Sequence[tuple[str, str, Any]] | None = None,
    filter: Any = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Rows of ``table``: ``partitions`` prune files (partition values and statistics) before
    anything is read, ``filter`` (a ``pyarrow.compute`` expression) selects rows. Columns a
    not-yet-migrated table lacks (rule 1) read as NULL."""
    dataset = guarded(
        table.table_uri,
        lambda: table.to_pyarrow_dataset(
            file_pruning_predicate=list(partitions) if partitions else None,
            filesystem=_native_filesystem(table.table_uri),
        ),
    )
    present = set(dataset.schema.names)
    wanted = list(columns) if columns is not None else spec.schema.names
    read = [c for c in wanted if c in present]
    try:
        data = dataset.to_table(columns=read, filter=filter)
    except (pa.ArrowInvalid, OSError) as err:
        raise data_file_error(spec.name, storage.delta_location(table.table_uri), err) from err
    for name in wanted:
        if name not in present:
            field_ = spec.schema.field(name)
            data = data.append_column(field_.with_nullable(True), pa.nulls(data.num_rows, field_.type))
    return data.select(wanted)


def _send_until_landed(
    table: DeltaTable, what: str, operation: str, send: Callable[[], T], *, landed: Callable[[], bool]
) -> T | None:
    """Rules 4 and 5: ``send()`` (one commit on ``table``) until it lands, :data:`APPEND_ATTEMPTS`
    times at most (:func:`splitkeeper.delta.retries.send_until_landed`). After a refused copy
    (``CommitFailedError``) or an error of the store (``OSError``; :func:`guarded` names the OS
    refusals) the table is read again: when ``landed()`` it is done (None); otherwise it is sent
    again after a backoff (an ``operation`` retry). Raises the last failure when every attempt failed."""
    from deltalake.exceptions import CommitFailedError

    def reread_landed(_failure: BaseException) -> bool:
        try:
            refresh(table)
        except OSError:
            return False  # not known: sending it again is safe, and the next failure reads again
        if not landed():
            return False
        log.warning("%s raised (%s), but the table, read again, records it", what, _failure)
        return True

    return retries.send_until_landed(
        lambda: guarded(table.table_uri, send),
        landed=reread_landed,
        operation=operation,
        sends=APPEND_ATTEMPTS,
        failures=(CommitFailedError, OSError),
        what=what,
    )


# --------------------------------------------------------------------------- one state root


class StateTables:
    """The Delta tables under one root (``<root>/<table>``), each loaded once and refreshed per use.

    ``read_only``: nothing is ever created, migrated or written; a missing table reads
    as empty. Used by the store, history, retention and the lease of one process;
    methods may be called from several threads (one lock per root).
    """

    def __init__(self, root: str | os.PathLike[str], *, read_only: bool = False) -> None:
        self.root = storage.table_uri(root)
        self.read_only = read_only
        self._tables: dict[str, DeltaTable] = {}
        self._current: dict[str, bool] = {}  # False: an older layout a read-only store cannot migrate
        self._lock = threading.RLock()
        #: rule 4: this writer's app id, its appends per table so far, one append at a time per table
        self.append_app_id = APPEND_APP_ID + uuid.uuid4().hex
        self._appends: dict[str, int] = {}
        self._append_locks: dict[str, threading.Lock] = {}

    def uri(self, name: str) -> str:
        spec(name)
        return storage.join(self.root, name)

    def ensure(
        self, name: str, *, data: pa.Table | None = None, commit_properties: Any = None
    ) -> tuple[DeltaTable, bool]:
        """Create ``name`` when absent (rule 1); (table, created by this call).

        The create runs outside the root's lock, so the store's tables are created side by side
        (:class:`~splitkeeper.delta.checkpoints.DeltaStateStore` ensures them from a thread pool):
        two creates of one table are settled by the store (the first wins, the other finds it)."""
        self._refuse_write(f"create table {name}")
        table, created = ensure_table(
            self.uri(name), spec(name), data=data, commit_properties=commit_properties
        )
        with self._lock:
            self._tables[name] = table
            self._current[name] = True
            return table, created

    def get(self, name: str, *, fresh: bool = True) -> DeltaTable | None:
        """Table ``name`` at its latest version (``fresh``), or None when it does not exist."""
        with self._lock:
            table = self._tables.get(name)
            if table is None:
                table = open_table(self.uri(name), missing_ok=True)
                if table is None:
                    return None
                self._current[name] = check_layout(
                    table, spec(name), self.uri(name), migrate=not self.read_only
                )
                self._tables[name] = table
            elif fresh:
                refresh(table)
            return table

    def require(self, name: str) -> DeltaTable:
        table = self.get(name)
        if table is None:
            raise StateError(
                f"state table {name} does not exist at {self.uri(name)}: the state directory is incomplete; "
                "open it with a writing store once (it creates missing tables) or use a fresh directory",
                table=name,
                path=self.uri(name),
            )
        return table

    def read(
        self,
        name: str,
        *,
        partitions: Sequence[tuple[str, str, Any]] | None = None,
        filter: Any = None,
        columns: Sequence[str] | None = None,
        table: DeltaTable | None = None,
    ) -> pa.Table:
        """Rows of ``name`` (:func:`read_rows`); an empty table when it does not exist."""
        found = table if table is not None else self.get(name)
        if found is None:
            empty = spec(name).empty()
            return empty.select(list(columns)) if columns is not None else empty
        return read_rows(found, spec(name), partitions=partitions, filter=filter, columns=columns)

    def append(self, name: str, data: pa.Table) -> DeltaTable:
        """One append of ``data`` (this table's schema) to ``name``, landed exactly once (rule 4)."""
        from deltalake import write_deltalake
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import CommitProperties, Transaction

        self._refuse_write(f"append to table {name}")
        table = self.require(name)
        with self._lock:
            lock = self._append_locks.setdefault(name, threading.Lock())
        with lock:  # this writer's appends to one table are numbered in commit order
            number = self._appends.get(name, 0) + 1
            self._appends[name] = number
            app_id = self.append_app_id
            properties = CommitProperties(
                app_transactions=[Transaction(app_id, number)],
                custom_metadata={"app_id": app_id, "append": number},
            )
            try:
                _send_until_landed(
                    table,
                    f"the append to table {name}",
                    "state_append",
                    lambda: write_deltalake(table, data, mode="append", commit_properties=properties),
                    landed=lambda: (table.transaction_version(app_id) or 0) >= number,
                )
            except (CommitFailedError, OSError) as failure:
                raise StateError(
                    f"the append to table {name} at {table.table_uri} failed in the store "
                    f"{APPEND_ATTEMPTS} times (last: {failure}), and the table, read again, does not record "
                    "it: this run stops. A put still in flight may yet land, once (its app transaction "
                    "refuses a second copy). Run again once the store answers: the next run's open "
                    "finishes or discards the epoch from its decision record",
                    table=name,
                ) from failure
        return table

    def delete(self, name: str, predicate: str) -> int:
        """Delete the rows of ``name`` that ``predicate`` (a delta-rs SQL predicate over settled rows)
        names, landed whatever the store does to the answer (rule 5); the rows the landing call deleted."""
        from deltalake.exceptions import CommitFailedError

        self._refuse_write(f"delete from table {name}")
        table = self.require(name)
        try:
            metrics = _send_until_landed(
                table,
                f"the delete from table {name}",
                "state_delete",
                lambda: table.delete(predicate),
                landed=lambda: False,  # a delete sent again finds what is left to delete
            )
        except (CommitFailedError, OSError) as failure:
            raise StateError(
                f"the delete from table {name} at {table.table_uri} ({predicate}) failed in the store "
                f"{APPEND_ATTEMPTS} times (last: {failure}): this run stops; what it deletes are settled "
                "rows, so the next run deletes them again. Run again once the store answers",
                table=name,
            ) from failure
        return int((metrics or {}).get("num_deleted_rows") or 0)

    def version(self, name: str) -> int:
        """The latest version of ``name``; -1 when it does not exist."""
        table = self.get(name)
        return -1 if table is None else table.version()

    def _refuse_write(self, what: str) -> None:
        if self.read_only:
            raise StateError(
                f"state at {self.root} is opened read-only (a dry run or status): refusing to {what}",
                root=self.root,
            )
