"""The one definition of every table: its pyarrow schema, partitioning, statistics and migration.

Every table's columns are written here, in Python, once. Everything that needs them
takes them from here: the state store and the sink create their tables with
:func:`splitkeeper.delta.tables.ensure_table`, the region tasks write staged files of
:data:`STAGED_FILE_SCHEMA`, Spark readers get frames built from the same pyarrow types.
The ``state/<table>.ddl`` files at the repository root document the same columns in
Spark DDL, with comments; :func:`ddl` renders a schema as that text, and
``tests/state/test_tables.py`` checks that every file says what this module defines
(nothing reads the files at run time).

Rules:

1. Types: ``BIGINT`` is int64, ``INT`` int32, ``STRING`` string, ``BOOLEAN`` bool,
   ``DOUBLE`` float64, ``BINARY`` binary, ``TIMESTAMP`` ``timestamp("us", tz="UTC")``
   (Spark's TIMESTAMP is an instant, never a wall-clock time: that would be
   TIMESTAMP_NTZ and a table feature older readers lack). Array elements and struct
   fields are nullable unless :func:`required` says otherwise, as in Spark.
2. Per table, :data:`TABLES` fixes the partition column, the columns that carry
   statistics and the table properties: ``delta.checkpointInterval=10`` (log replay
   stays bounded however many small commits there are) and no deletion vectors
   (delta-rs, the only writer, cannot write them).
3. The one migration that exists adds nullable columns at the end of a table
   (:attr:`TableSpec.added_columns`); old rows read NULL.

Only pyarrow is imported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from splitkeeper.errors import InvalidParameterError

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.records.spec import DecodeSpec

__all__ = [
    "BASE_PROPERTIES",
    "DEAD_LETTER_SCHEMA",
    "DEAD_LETTER_TABLE",
    "FILTERED_SCHEMA",
    "FILTERED_TABLE",
    "META_COLUMNS",
    "SCHEMAS",
    "SINK_TABLE",
    "STAGED_COLUMNS",
    "STAGED_FILE_SCHEMA",
    "STAGED_SCHEMA",
    "STATE_TABLES",
    "TABLES",
    "TableSpec",
    "ddl",
    "sink_schema",
    "sink_spec",
    "spec",
]

# --------------------------------------------------------------------------- column types (rule 1)

BIGINT = pa.int64()
INT = pa.int32()
STRING = pa.string()
BOOLEAN = pa.bool_()
DOUBLE = pa.float64()
BINARY = pa.binary()
TIMESTAMP = pa.timestamp("us", tz="UTC")


def required(name: str, data_type: pa.DataType) -> pa.Field:
    """A column (or struct field) that is never NULL (``NOT NULL``)."""
    return pa.field(name, data_type, nullable=False)


def optional(name: str, data_type: pa.DataType) -> pa.Field:
    """A nullable column (or struct field)."""
    return pa.field(name, data_type, nullable=True)


def array(element: pa.DataType) -> pa.DataType:
    """``ARRAY<element>``; elements may be NULL."""
    return pa.list_(pa.field("element", element, nullable=True))


def struct(*fields: pa.Field) -> pa.DataType:
    """``STRUCT<...>``."""
    return pa.struct(list(fields))


def _struct_of(**types: pa.DataType) -> pa.DataType:
    """A struct whose fields are all nullable, in the order given."""
    return struct(*(optional(name, t) for name, t in types.items()))


# --------------------------------------------------------------------------- the shared shapes

#: A split's state inside a region (``checkpoints.regions[*].splits``).
_SPLIT = _struct_of(split_id=STRING, subscription=STRING, position=BIGINT, end=BIGINT, backlog_end=BIGINT)
#: One region's state in a checkpoint (or a decision).
_REGION = _struct_of(
    region_id=INT,
    outcome=STRING,
    ref_checkpoint_id=BIGINT,
    ref_depth=INT,
    operator_state=array(STRING),
    splits=array(_SPLIT),
)
#: What the per-split ``enumerator_state`` rows cannot hold of the enumerator snapshot.
_ENUMERATOR = _struct_of(
    checkpoint_id=BIGINT, parallelism=INT, readers=array(INT), subscriptions=array(STRING)
)
_SPLIT_WEIGHTS = array(_struct_of(split_id=STRING, weight=DOUBLE))
#: The source's own discovery positions (:attr:`EnumeratorSnapshot.discovery`: a files source's
#: event-topic offsets in notification mode).
_DISCOVERY = array(_struct_of(key=STRING, position=BIGINT))
#: Why each failed region failed (:class:`splitkeeper.core.failures.RegionFailure`).
_FAILURES = array(
    _struct_of(
        region_id=INT, outcome=STRING, error_class=STRING, message=STRING, split_id=STRING, offset=BIGINT
    )
)
#: A checkpoint's phase times (``core.failures.PHASES`` but ``commit``, which is ``commit_ms``) and
#: its failed regions' causes: nullable columns added to ``checkpoints`` and ``checkpoint_log``.
_INCIDENT_COLUMNS = ("plan_ms", "read_ms", "sink_ms", "failures")

#: The columns a ``checkpoints`` row and a ``decisions`` row share ("up to enumerator").
_DECIDED = (
    required("kind", STRING),
    required("parallelism", INT),
    required("consecutive_regional", INT),
    required("processing_backlog", BOOLEAN),
    required("regions", array(_REGION)),
    optional("enumerator", _ENUMERATOR),
)

# --------------------------------------------------------------------------- the schemas

#: Every table's columns, by table name (the ``state/<table>.ddl`` files document them).
#: An ``enumerator_state`` entry's fields, as a decision's enumerator rows (older decisions) and
#: entries (with ``identity``) hold them.
_ENUMERATOR_ENTRY: dict[str, pa.DataType] = {
    "status": STRING,
    "owner": INT,
    "seq": INT,
    "split_id": STRING,
    "subscription": STRING,
    "position": BIGINT,
    "end": BIGINT,
    "backlog_end": BIGINT,
    "backlog_finished": BOOLEAN,
}

SCHEMAS: dict[str, pa.Schema] = {
    "pipeline": pa.schema(
        [
            required("name", STRING),
            required("source_fingerprint", STRING),
            required("state_format", INT),
            required("created_at", TIMESTAMP),
        ]
    ),
    "epoch_plans": pa.schema(
        [
            required("epoch_id", BIGINT),
            required("region_id", INT),
            required("seq", INT),
            optional("split_id", STRING),
            optional("start", BIGINT),
            optional("end", BIGINT),
            required("run_id", STRING),
            required("planned_at", TIMESTAMP),
        ]
    ),
    "decisions": pa.schema(
        [
            required("epoch_id", BIGINT),
            required("attempt_id", STRING),
            *_DECIDED,
            required(
                "enumerator_rows",
                array(_struct_of(**_ENUMERATOR_ENTRY)),
            ),
            required(
                "audit",
                array(
                    _struct_of(
                        seq=INT,
                        split_id=STRING,
                        reader_id=INT,
                        decision=STRING,
                        decision_checkpoint_id=BIGINT,
                        detail=STRING,
                    )
                ),
            ),
            required("acknowledged", array(INT)),
            optional("configured_parallelism", INT),
            required("reason", STRING),
            required("run_id", STRING),
            required("decided_at", TIMESTAMP),
            optional("split_weights", _SPLIT_WEIGHTS),
            optional("discovery", _DISCOVERY),
            optional("enumerator_base", BIGINT),
            optional(
                "enumerator_entries",
                array(_struct_of(**_ENUMERATOR_ENTRY, identity=STRING)),
            ),
        ]
    ),
    "checkpoints": pa.schema(
        [
            required("checkpoint_id", BIGINT),
            *_DECIDED,
            required("attempt_id", STRING),
            required("run_id", STRING),
            required("created_at", TIMESTAMP),
            required("commit_ms", BIGINT),
            optional("configured_parallelism", INT),
            optional("split_weights", _SPLIT_WEIGHTS),
            optional("enumerator_base", BIGINT),
            optional("enumerator_row_count", BIGINT),
            optional("plan_ms", BIGINT),
            optional("read_ms", BIGINT),
            optional("sink_ms", BIGINT),
            optional("failures", _FAILURES),
            optional("discovery", _DISCOVERY),
        ]
    ),
    "enumerator_state": pa.schema(
        [
            required("checkpoint_id", BIGINT),
            required("attempt_id", STRING),
            required("status", STRING),
            optional("owner", INT),
            required("seq", INT),
            required("split_id", STRING),
            optional("subscription", STRING),
            optional("position", BIGINT),
            optional("end", BIGINT),
            optional("backlog_end", BIGINT),
            optional("backlog_finished", BOOLEAN),
            optional("identity", STRING),
        ]
    ),
    "audit": pa.schema(
        [
            required("checkpoint_id", BIGINT),
            required("attempt_id", STRING),
            required("seq", INT),
            required("split_id", STRING),
            optional("reader_id", INT),
            required("decision", STRING),
            optional("decision_checkpoint_id", BIGINT),
            required("detail", STRING),
        ]
    ),
    "checkpoint_log": pa.schema(
        [
            required("checkpoint_id", BIGINT),
            required("kind", STRING),
            required(
                "regions",
                array(_struct_of(region_id=INT, outcome=STRING, ref_checkpoint_id=BIGINT, splits=INT)),
            ),
            required("reason", STRING),
            required("run_id", STRING),
            required("logged_at", TIMESTAMP),
            optional("attempt_id", STRING),
            optional("parallelism", INT),
            optional("processing_backlog", BOOLEAN),
            optional("backlog_splits", INT),
            optional("commit_ms", BIGINT),
            optional("created_at", TIMESTAMP),
            optional("plan_ms", BIGINT),
            optional("read_ms", BIGINT),
            optional("sink_ms", BIGINT),
            optional("failures", _FAILURES),
        ]
    ),
    "lease": pa.schema(
        [
            required("pipeline", STRING),
            required("generation", BIGINT),
            required("token", STRING),
            required("host", STRING),
            required("pid", INT),
            required("command", STRING),
            required("acquired_at", TIMESTAMP),
            required("heartbeat_at", TIMESTAMP),
            required("expires_at", TIMESTAMP),
            required("released", BOOLEAN),
            optional("process", STRING),
        ]
    ),
    "control": pa.schema(
        [
            required("pipeline", STRING),
            required("request", STRING),
            required("requested_at", TIMESTAMP),
            required("requested_by", STRING),
        ]
    ),
    "validations": pa.schema(
        [
            required("pipeline", STRING),
            required("checkpoint_id", BIGINT),
            required("validated_at", TIMESTAMP),
            required("validated_by", STRING),
            required("tables", STRING),
            required("suites", STRING),
            optional("data_docs", STRING),
            optional("verdict", STRING),
            optional("restore", STRING),
            optional("epoch_id", BIGINT),
            optional("readers", array(INT)),
            optional("detail", STRING),
        ]
    ),
    # not a state table: the records table the sink commits to; the staged files carry every column
    "sink_records": pa.schema(
        [
            required("split_id", STRING),
            required("offset", BIGINT),
            required("next_offset", BIGINT),
            optional("value", BINARY),  # decode.kind raw (the default); see sink_schema
            required("epoch", BIGINT),
            required("region", INT),
            required("ingested_at", TIMESTAMP),
            optional("key", BINARY),
            optional("topic", STRING),
            optional("partition", INT),
            optional("timestamp", TIMESTAMP),
            optional("headers", array(_struct_of(key=STRING, value=BINARY))),
        ]
    ),
    # not a state table: the bad records (errors.tolerance: all), committed with the sink's epoch;
    # a region's staged dead.parquet carries every column, so the sink commit adopts it as it is
    "dead_letters": pa.schema(
        [
            required("split_id", STRING),
            required("offset", BIGINT),
            required("next_offset", BIGINT),
            optional("key", BINARY),
            optional("value", BINARY),
            required("stage", STRING),
            required("error_class", STRING),
            required("error_message", STRING),
            required("epoch", BIGINT),
            required("region", INT),
            required("attempt_id", STRING),
            required("failed_at", TIMESTAMP),
            optional("topic", STRING),
            optional("partition", INT),
            optional("timestamp", TIMESTAMP),
        ]
    ),
    "filtered_offsets": pa.schema(
        [
            required("split_id", STRING),
            required("start_offset", BIGINT),
            required("end_offset", BIGINT),
            required("records", BIGINT),
            required("epoch", BIGINT),
            required("region", INT),
            required("function", STRING),
        ]
    ),
}

# --------------------------------------------------------------------------- the tables (rules 2, 3)

#: Properties of every table (rule 2).
BASE_PROPERTIES: dict[str, str] = {
    "delta.checkpointInterval": "10",
    "delta.enableDeletionVectors": "false",
}


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table: its schema (:data:`SCHEMAS`), partition column, statistics, migration."""

    name: str
    partition: str | None = None
    stats_columns: tuple[str, ...] = ()
    added_columns: frozenset[str] = frozenset()  # nullable columns added later (rule 3)
    extra_properties: Mapping[str, str] = field(default_factory=dict)
    #: A schema and partition columns other than SCHEMAS[name] (a sink of a configured decode spec).
    columns: pa.Schema | None = None
    partitions: tuple[str, ...] = ()

    @property
    def schema(self) -> pa.Schema:
        return SCHEMAS[self.name] if self.columns is None else self.columns

    @property
    def partition_by(self) -> list[str]:
        if self.partitions:
            return list(self.partitions)
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
            added_columns=frozenset({"split_weights", "discovery", "enumerator_base", "enumerator_entries"}),
        ),
        TableSpec(
            "checkpoints",
            partition="checkpoint_id",
            stats_columns=("attempt_id",),
            added_columns=frozenset(
                {
                    "configured_parallelism",
                    "split_weights",
                    "enumerator_base",
                    "enumerator_row_count",
                    *_INCIDENT_COLUMNS,
                    "discovery",
                }
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
        TableSpec(
            "checkpoint_log",
            stats_columns=("checkpoint_id", "kind"),
            added_columns=frozenset(_INCIDENT_COLUMNS),
        ),
        TableSpec("lease", stats_columns=("generation",), added_columns=frozenset({"process"})),
        TableSpec("control", stats_columns=("requested_at",)),
        TableSpec(
            "validations",
            stats_columns=("checkpoint_id", "validated_at"),
            added_columns=frozenset({"verdict", "restore", "epoch_id", "readers", "detail"}),
        ),
        TableSpec(
            SINK_TABLE,
            stats_columns=("split_id", "offset", "next_offset", "epoch", "region", "ingested_at"),
            added_columns=frozenset(META_COLUMNS),
        ),
        # the epoch (= checkpoint id) is the commit unit; split and offset find a record
        TableSpec(
            "dead_letters",
            stats_columns=("split_id", "offset", "next_offset", "epoch", "region", "stage", "failed_at"),
        ),
        TableSpec("filtered_offsets", stats_columns=("split_id", "start_offset", "end_offset", "epoch")),
    )
}

#: The dead-letter table (``errors.dead_letter.path``): what a staged ``dead.parquet`` holds, too.
DEAD_LETTER_TABLE = "dead_letters"
DEAD_LETTER_SCHEMA: pa.Schema = SCHEMAS[DEAD_LETTER_TABLE]
#: The offsets a Spark transform dropped (a table beside the sink): ranges per split, one row each.
FILTERED_TABLE = "filtered_offsets"
FILTERED_SCHEMA: pa.Schema = SCHEMAS[FILTERED_TABLE]

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


def spec(table: str) -> TableSpec:
    """The :class:`TableSpec` of ``table``; InvalidParameterError naming the known tables otherwise."""
    if table not in TABLES:
        raise InvalidParameterError("table", table, f"one of {', '.join(TABLES)}")
    return TABLES[table]


# --------------------------------------------------------------------------- the sink's schema

#: The date column a sink may be partitioned by (``sink.partition_by: [ingested_date]``).
INGESTED_DATE_TYPE = pa.date32()


def data_schema(decode: DecodeSpec) -> pa.Schema:
    """The sink's data columns of ``decode`` (``decode.data_columns()``) with their Arrow types."""
    from splitkeeper.records.ddl import arrow_type

    return pa.schema(
        [pa.field(c.name, arrow_type(c.type), nullable=c.nullable) for c in decode.data_columns()]
    )


def sink_schema(
    decode: DecodeSpec | None = None,
    partition_by: Sequence[str] = (),
    data: pa.Schema | None = None,
    *,
    tombstone: bool = False,
) -> pa.Schema:
    """The one definition of a sink table's columns, from the pipeline's ``decode`` spec:
    ``split_id, offset, next_offset``, the spec's data columns (``decode.data_columns()``, each
    with :func:`splitkeeper.records.ddl.arrow_type`), ``epoch, region, ingested_at``, the Kafka
    metadata columns, and ``ingested_date DATE`` only when ``partition_by`` names it. ``None``
    (or the default spec) is the raw sink: ``value BINARY``, the bytes as read. ``data``: the data
    columns a batch transform makes of the decoded ones
    (:func:`splitkeeper.transforms.output_schema`), in place of the spec's. ``tombstone``: the
    ``tombstone BOOLEAN NOT NULL`` column after the Kafka metadata (an upsert sink's change table and
    staged files, :mod:`splitkeeper.records.upsert`); the data columns are then nullable (a
    tombstone's are null; a declared NOT NULL column is still checked on every record with a value)."""
    from splitkeeper.records.spec import INGESTED_DATE, TOMBSTONE, DecodeSpec

    spec = decode if decode is not None else DecodeSpec()
    base = SCHEMAS[SINK_TABLE]
    head = [base.field(name) for name in ("split_id", "offset", "next_offset")]
    columns = list(data_schema(spec) if data is None else data)
    if tombstone:
        columns = [f.with_nullable(True) for f in columns]
    tail = [f for f in base if f.name not in {"split_id", "offset", "next_offset", "value"}]
    dated = [optional(INGESTED_DATE, INGESTED_DATE_TYPE)] if INGESTED_DATE in partition_by else []
    marked = [required(TOMBSTONE, BOOLEAN)] if tombstone else []
    return pa.schema(head + columns + tail + marked + dated)


def sink_spec(schema: pa.Schema, partition_by: Sequence[str] = ()) -> TableSpec:
    """The sink table's :class:`TableSpec` for ``schema`` (:func:`sink_schema`) and its partitions."""
    from dataclasses import replace

    return replace(spec(SINK_TABLE), columns=schema, partitions=tuple(partition_by))


# --------------------------------------------------------------------------- staged records

#: A staged file's record columns: the sink table's columns minus ``ingested_at``.
STAGED_COLUMNS: tuple[str, ...] = ("split_id", "offset", "next_offset", "value", "epoch", "region")
#: What a staged file of the raw sink holds (``sink_schema(DecodeSpec())``): every column of the
#: sink table, in its order (staged files are adopted into the sink as they are).
STAGED_FILE_SCHEMA: pa.Schema = SCHEMAS[SINK_TABLE]
#: The record columns of a staged file (what ``read_staged`` returns).
STAGED_SCHEMA: pa.Schema = pa.schema([STAGED_FILE_SCHEMA.field(name) for name in STAGED_COLUMNS])


# --------------------------------------------------------------------------- the DDL text


_DDL_TYPES: dict[pa.DataType, str] = {
    BIGINT: "BIGINT",
    INT: "INT",
    STRING: "STRING",
    BOOLEAN: "BOOLEAN",
    DOUBLE: "DOUBLE",
    BINARY: "BINARY",
    TIMESTAMP: "TIMESTAMP",
    pa.date32(): "DATE",
}
#: Names Spark's DDL parser takes for keywords: back-quoted.
_QUOTED = frozenset({"end", "offset", "partition", "timestamp"})


def _name(name: str) -> str:
    return f"`{name}`" if name in _QUOTED else name


def _ddl_type(data_type: pa.DataType) -> str:
    if pa.types.is_list(data_type):
        return f"ARRAY<{_ddl_type(data_type.value_type)}>"
    if pa.types.is_struct(data_type):
        members = (
            f"{_name(f.name)}: {_ddl_type(f.type)}{'' if f.nullable else ' NOT NULL'}" for f in data_type
        )
        return f"STRUCT<{', '.join(members)}>"
    return _DDL_TYPES[data_type]


def ddl(table: str) -> str:
    """The columns of ``table`` as a Spark DDL column list (``name TYPE [NOT NULL], ...``), one per line:
    what ``state/<table>.ddl`` says without its comments, and what Spark's schema parser reads."""
    return ",\n".join(
        f"{_name(f.name)} {_ddl_type(f.type)}{'' if f.nullable else ' NOT NULL'}" for f in spec(table).schema
    )
