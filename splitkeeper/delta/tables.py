"""The one definition of every table: pyarrow schemas parsed from ``state/<table>.ddl``.

Each ``state/<table>.ddl`` file at the repository root lists a table's columns in the
subset of Spark DDL this module parses (rule 1). Everything that needs a table's
columns takes them from here: the state store and the sink create their tables with
:func:`ensure_table`, the region tasks write staged files of :data:`STAGED_FILE_SCHEMA`,
Spark readers get frames built from the same pyarrow types.

Rules:

1. The DDL subset: ``name TYPE [NOT NULL]`` separated by commas; names may be
   back-quoted; types ``BIGINT``, ``INT``/``INTEGER``, ``STRING``, ``BOOLEAN``,
   ``DOUBLE``, ``TIMESTAMP``, ``BINARY``, ``ARRAY<type>``, ``STRUCT<name: type [NOT NULL], ...>``;
   ``--`` starts a comment. ``TIMESTAMP`` is ``timestamp("us", tz="UTC")``: Spark's
   TIMESTAMP is an instant, never a wall-clock time (that would be TIMESTAMP_NTZ and
   a table feature older readers lack). Array elements and struct fields are nullable
   unless ``NOT NULL`` says otherwise, as in Spark. Anything else is a StateError
   naming the file and the token.
2. :func:`~splitkeeper.delta.ddl.ddl_path` is the only place that locates a DDL file
   (package data through :mod:`splitkeeper.resources`).
3. Per table, :data:`TABLES` fixes the partition column, the columns that carry
   statistics and the table properties: ``delta.checkpointInterval=10`` (log replay
   stays bounded however many small commits there are) and no deletion vectors
   (delta-rs, the only writer, cannot write them).
4. :func:`ensure_table` creates a missing table (create-if-absent: of two processes
   creating it at once, one commits version 0 and the other opens it) and checks an
   existing one with :func:`check_layout`: the same columns with the same types and
   the same partitioning, or a StateError that names the table, what it has and what
   is expected. The one migration that exists adds nullable columns at the end
   (:attr:`TableSpec.added_columns`, ``ALTER TABLE ADD COLUMNS``); old rows read NULL.
5. :func:`open_table` wraps every load of a table: a damaged log becomes a StateError
   naming the table, the log file and what to do (:func:`log_error`); an unreadable data
   file one naming the table and the file (:func:`data_file_error`).
6. A write the operating system refuses (read-only file system, no space, no
   permission) is a StateError naming the path (:func:`os_error`), from every write
   through :func:`guarded` and the fence.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from splitkeeper.delta import storage
from splitkeeper.delta.ddl import SCHEMA_DIR_ENV, ddl_path, read_ddl, schema_dir
from splitkeeper.errors import DamagedTableError, InvalidParameterError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable

__all__ = [
    "REPAIRABLE",
    "REPAIR_ADVICE",
    "data_file_error",
    "SCHEMA_DIR_ENV",
    "META_COLUMNS",
    "SINK_TABLE",
    "STAGED_COLUMNS",
    "STAGED_FILE_SCHEMA",
    "STAGED_SCHEMA",
    "STATE_TABLES",
    "TABLES",
    "TableSpec",
    "check_layout",
    "ddl_path",
    "ensure_table",
    "open_table",
    "parse_ddl",
    "read_ddl",
    "schema_dir",
    "sql_string",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Properties of every table (rule 3).
BASE_PROPERTIES: dict[str, str] = {
    "delta.checkpointInterval": "10",
    "delta.enableDeletionVectors": "false",
}


# --------------------------------------------------------------------------- DDL files (rules 1, 2)


_TOKEN = re.compile(r"\s*(?:(`[^`]*`)|([A-Za-z_][A-Za-z0-9_]*)|([<>,:])|(\S))")
_PRIMITIVES: dict[str, pa.DataType] = {
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "STRING": pa.string(),
    "BOOLEAN": pa.bool_(),
    "DOUBLE": pa.float64(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "BINARY": pa.binary(),
}


class _Tokens:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.items: list[tuple[str, bool]] = []  # (token, was back-quoted)
        for m in _TOKEN.finditer(text):
            quoted, word, punct, other = m.groups()
            if other is not None:
                self.fail(f"unexpected character {other!r}")
            if quoted is not None:
                self.items.append((quoted[1:-1], True))
            elif word is not None or punct is not None:
                self.items.append((word or punct, False))
        self.pos = 0

    def fail(self, what: str) -> StateError:
        raise StateError(
            f"{self.source}: {what}; the DDL files use 'name TYPE [NOT NULL]' with BIGINT, INT, STRING, "
            "BOOLEAN, DOUBLE, TIMESTAMP, BINARY, ARRAY<..> and STRUCT<name: type, ..>",
            source=self.source,
        )

    def peek(self) -> str | None:
        return self.items[self.pos][0] if self.pos < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        if self.pos >= len(self.items):
            self.fail(f"unexpected end, expected {expected or 'more'}")
        token, _quoted = self.items[self.pos]
        if expected is not None and token.upper() != expected:
            self.fail(f"expected {expected!r}, found {token!r}")
        self.pos += 1
        return token

    def name(self) -> str:
        token, quoted = self.items[self.pos] if self.pos < len(self.items) else ("", False)
        if not token or (not quoted and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token)):
            self.fail(f"expected a column name, found {token!r}")
        self.pos += 1
        return token

    def not_null(self) -> bool:
        if (self.peek() or "").upper() == "NOT":
            self.take("NOT")
            self.take("NULL")
            return True
        return False

    def data_type(self) -> pa.DataType:
        word = self.take().upper()
        if word in _PRIMITIVES:
            return _PRIMITIVES[word]
        if word == "ARRAY":
            self.take("<")
            element = self.data_type()
            self.take(">")
            return pa.list_(pa.field("element", element, nullable=True))
        if word == "STRUCT":
            self.take("<")
            fields = []
            while True:
                name = self.name()
                if self.peek() == ":":
                    self.take(":")
                child = self.data_type()
                fields.append(pa.field(name, child, nullable=not self.not_null()))
                if self.peek() == ",":
                    self.take(",")
                    continue
                self.take(">")
                return pa.struct(fields)
        self.fail(f"unknown type {word!r}")
        raise AssertionError("unreachable")  # pragma: no cover


def parse_ddl(text: str, source: str = "DDL") -> pa.Schema:
    """The pyarrow schema of a DDL column list (rule 1); ``source`` names it in errors."""
    text = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    tokens = _Tokens(text, source)
    fields: list[pa.Field] = []
    while tokens.peek() is not None:
        name = tokens.name()
        data_type = tokens.data_type()
        fields.append(pa.field(name, data_type, nullable=not tokens.not_null()))
        if tokens.peek() is not None:
            tokens.take(",")
    if not fields:
        tokens.fail("no columns")
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        tokens.fail(f"duplicate column names in {names}")
    return pa.schema(fields)


# --------------------------------------------------------------------------- the tables (rule 3)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table: its DDL file (``state/<name>.ddl``), partition column, statistics, migration."""

    name: str
    partition: str | None = None
    stats_columns: tuple[str, ...] = ()
    added_columns: frozenset[str] = frozenset()  # nullable columns added to the DDL later (rule 4)
    extra_properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def schema(self) -> pa.Schema:
        return _schema_of(self.name)

    @property
    def partition_by(self) -> list[str]:
        return [self.partition] if self.partition else []

    @property
    def properties(self) -> dict[str, str]:
        props = {**BASE_PROPERTIES, **self.extra_properties}
        if self.stats_columns:
            props["delta.dataSkippingStatsColumns"] = ",".join(self.stats_columns)
        return props

    def empty(self) -> pa.Table:
        return self.schema.empty_table()

    def rows(self, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
        """``rows`` (dicts by column name, missing keys NULL) as a table of this schema."""
        names = self.schema.names
        return pa.Table.from_pylist([{n: row.get(n) for n in names} for row in rows], self.schema)


@functools.cache
def _schema_of(table: str) -> pa.Schema:
    return parse_ddl(read_ddl(table), str(ddl_path(table)))


#: The records table the sink commits to (not a state table; its columns live here too).
SINK_TABLE = "sink_records"
#: The sink's source-metadata columns (Kafka's key, topic, partition, timestamp, headers),
#: after ``ingested_at``; NULL for a files source; added to older sink tables by migration.
META_COLUMNS: tuple[str, ...] = ("key", "topic", "partition", "timestamp", "headers")

TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        # which pipeline owns the directory: one row, in the table's first commit
        TableSpec("pipeline", stats_columns=("name",)),
        # restore, redo and retention address one epoch or checkpoint: partitions prune to it
        TableSpec("epoch_plans", partition="epoch_id", stats_columns=("region_id",)),
        TableSpec(
            "decisions",
            partition="epoch_id",
            stats_columns=("attempt_id",),
            added_columns=frozenset({"split_weights"}),
        ),
        TableSpec(
            "checkpoints",
            partition="checkpoint_id",
            stats_columns=("attempt_id",),
            added_columns=frozenset(
                {"configured_parallelism", "split_weights", "enumerator_base", "enumerator_row_count"}
            ),
        ),
        TableSpec(
            "enumerator_state",
            partition="checkpoint_id",
            stats_columns=("attempt_id",),
            added_columns=frozenset({"identity"}),
        ),
        # history, kept past retention: unpartitioned, compaction bounds its files
        TableSpec("audit", stats_columns=("checkpoint_id", "attempt_id")),
        TableSpec("checkpoint_log", stats_columns=("checkpoint_id", "kind")),
        TableSpec("lease", stats_columns=("generation",), added_columns=frozenset({"process"})),
        TableSpec("control", stats_columns=("requested_at",)),
        TableSpec(
            SINK_TABLE,
            stats_columns=("split_id", "offset", "next_offset", "epoch", "region", "ingested_at"),
            added_columns=frozenset(META_COLUMNS),
        ),
    )
}

#: The tables a :class:`~splitkeeper.delta.checkpoints.DeltaStateStore` owns, in creation order.
STATE_TABLES: tuple[str, ...] = (
    "pipeline",
    "epoch_plans",
    "decisions",
    "checkpoints",
    "enumerator_state",
    "audit",
    "checkpoint_log",
)


def sql_string(text: str) -> str:
    """``text`` as a SQL string literal for a delta-rs predicate (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def spec(table: str) -> TableSpec:
    if table not in TABLES:
        raise InvalidParameterError("table", table, f"one of {', '.join(TABLES)}")
    return TABLES[table]


# --------------------------------------------------------------------------- staged records

#: A staged file's record columns: the sink table's columns minus ``ingested_at``.
STAGED_COLUMNS: tuple[str, ...] = ("split_id", "offset", "next_offset", "value", "epoch", "region")
#: What a staged file holds: every column of ``state/sink_records.ddl``, in its order.
STAGED_FILE_SCHEMA: pa.Schema = _schema_of(SINK_TABLE)
#: The record columns of a staged file (what ``read_staged`` returns).
STAGED_SCHEMA: pa.Schema = pa.schema([STAGED_FILE_SCHEMA.field(name) for name in STAGED_COLUMNS])

if STAGED_FILE_SCHEMA.names != [*STAGED_COLUMNS, "ingested_at", *META_COLUMNS]:  # pragma: no cover
    raise StateError(
        f"{ddl_path(SINK_TABLE)} must list {[*STAGED_COLUMNS, 'ingested_at', *META_COLUMNS]} in this "
        f"order (staged files are adopted into the sink as they are); it lists {STAGED_FILE_SCHEMA.names}",
        path=str(ddl_path(SINK_TABLE)),
    )


# --------------------------------------------------------------------------- create, open, check (4, 5)


def _shape(data_type: Any) -> Any:
    """A comparable form of an arrow type without nullability or list item names."""
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
    """A StateError for a table whose log delta-rs cannot read: names the damaged log file (rule 5)."""
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
    gone): names the table and the file, and what to do (rule 5)."""
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


def _is_log_error(err: BaseException) -> bool:
    text = str(err)
    return any(s in text for s in ("Json error", "json", "Invalid JSON", "EOF while parsing", "Truncated"))


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
    """A StateError for a write the operating system refused under ``path`` (rule 6)."""
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
    """``call()``, with a damaged-log DeltaError turned into :func:`log_error` (rule 5) and a write the
    operating system refused (read-only, full, no permission) into :func:`os_error` (rule 6)."""
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
    """Rule 4 on an existing table; True when it matches (after migrating, if ``migrate``).

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
        f"({ddl_path(spec.name)}): the directory was written by another splitkeeper state format; use a "
        "fresh state directory (or migrate the table)",
        table=spec.name,
        path=uri,
    )


def ensure_table(
    uri: str, spec: TableSpec, *, data: pa.Table | None = None, commit_properties: Any = None
) -> tuple[DeltaTable, bool]:
    """The table at ``uri``, created when absent (rule 4); returns (table, created by this call).

    ``data`` goes into the creating commit (version 0) itself: the create is then also
    a first-writer-wins claim (the commit is never retried as a later version). An
    existing table is checked and migrated, never written.
    """
    from deltalake import DeltaTable, write_deltalake
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
    try:
        if data is None:
            created = DeltaTable.create(
                uri,
                spec.schema,
                mode="error",
                partition_by=spec.partition_by or None,
                configuration=spec.properties,
                storage_options=options,
                commit_properties=once,
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
    except (CommitFailedError, DeltaError) as err:
        # Another process created it at the same moment: fine if it is there now (rule 4).
        found = open_table(uri, missing_ok=True)
        if found is None:
            raise StateError(f"cannot create table {spec.name} at {uri}: {err}", table=spec.name) from err
        check_layout(found, spec, uri, migrate=True)
        return found, False
    return created, True


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
    not-yet-migrated table lacks (rule 4) read as NULL."""
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

    def uri(self, name: str) -> str:
        spec(name)
        return storage.join(self.root, name)

    def ensure(
        self, name: str, *, data: pa.Table | None = None, commit_properties: Any = None
    ) -> tuple[DeltaTable, bool]:
        """Create ``name`` when absent (rule 4); (table, created by this call)."""
        self._refuse_write(f"create table {name}")
        with self._lock:
            table, created = ensure_table(
                self.uri(name), spec(name), data=data, commit_properties=commit_properties
            )
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

    def append(self, name: str, data: pa.Table, *, commit_properties: Any = None) -> DeltaTable:
        """One blind append of ``data`` (this table's schema) to ``name``."""
        from deltalake import write_deltalake

        self._refuse_write(f"append to table {name}")
        table = self.require(name)
        guarded(
            table.table_uri,
            lambda: write_deltalake(table, data, mode="append", commit_properties=commit_properties),
        )
        return table

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
