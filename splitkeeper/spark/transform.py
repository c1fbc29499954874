"""A Spark transform: ``fn(df: pyspark.sql.DataFrame) -> DataFrame`` over an epoch's records.

``transform: {kind: spark, function: 'module:fn'}``. The region tasks stage the decoded records
as they are (the identity transform, unpartitioned: :meth:`SparkTransform.input_policy`); once
an epoch's regions finished, :meth:`SparkTransform.apply` reads every acknowledged region's
staged file into ONE DataFrame (the records with their bookkeeping columns), calls ``fn`` on it
and writes what it returns back as each region's new staged output, in the staged format the
sink adopts (:class:`~splitkeeper.spark.task.StagedWriter`, a new attempt folder per region:
``part.parquet`` or the ``parts.json`` manifest of a partitioned sink, the region's
``dead.parquet`` copied beside it, and ``filtered.parquet``, the ranges of offsets ``fn``
dropped, :data:`~splitkeeper.delta.schemas.FILTERED_SCHEMA`).

With staging on an object store (:mod:`splitkeeper.staging` rule 5) Spark reads the staged files
through S3A (``s3a://``, :func:`~splitkeeper.delta.storage.spark_uri`): the session needs the
``spark.hadoop.fs.s3a.*`` settings of the store; the writes go through ``pyarrow.fs`` as a region
task's do.

One Spark job per epoch does the checks, the writes and the filtered ranges: the input's
bookkeeping columns are joined (full outer, on ``split_id, offset``) with ``fn``'s output,
repartitioned by region, and each partition writes its regions' files (``mapInArrow``).

Contract of ``fn`` (its module marks it ``@spark_transform``: :mod:`splitkeeper.callables`):

- **keeps ``split_id`` and ``offset``** on every row it emits (checked: a row without them
  fails the epoch);
- **invents no row**: every output ``(split_id, offset)`` is one the epoch read, at most once
  (checked);
- may drop rows (every dropped offset is recorded in ``filtered.parquet``, ranges per split of
  records consecutive in read order) and add, drop or change data columns. The other
  bookkeeping columns (``next_offset, epoch, region, ingested_at``, the Kafka metadata,
  ``tombstone``) are taken from the input by ``(split_id, offset)``, whatever ``fn`` did to them;
- **deterministic on a replay of the same epoch** (documented, not checked): an epoch that
  crashed or failed before its sink commit is read and transformed again, and the replay must
  make the same records: the same rows and the same dropped offsets, so that what is committed
  (sink, filtered ranges, an upsert's fold) does not depend on whether a crash happened. Order
  by the bookkeeping where a choice is arbitrary (``dropDuplicates`` keeps any one row of a
  key: a window ``row_number()`` over the key ordered by ``split_id, offset`` keeps the same one).

The sink's columns are what ``fn`` returns for an EMPTY DataFrame of the staged schema
(:meth:`SparkTransform.output_data`, when the pipeline opens); each epoch's output is cast to
them, and a column missing, added or of another type fails the epoch.

A failure (``fn`` raising on the driver while it builds the plan, on an executor while the job
runs, or a broken contract) fails every acknowledged region of the epoch: the transform sees
all their records together, so none of them can be committed without its output. The error
starts with the function's name and holds the Python traceback of its code.

The step has the region timeout (``checkpoint.region_timeout_s``, protocol rule 2.3) as its
deadline, from its start: it runs in a thread of its own with a job group of its own; past the
deadline the group is cancelled (its tasks killed: a UDF that hangs is stopped) and every
acknowledged region of the epoch TIMES OUT, naming the function, so nothing of the epoch is
committed and it is read again (a hang on every try ends the run with ``[RUN_STALLED]``). A
driver-side ``fn`` that hangs outside any Spark job cannot be stopped: its thread is left
behind and what it writes is never committed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import traceback
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from splitkeeper.callables import Role, resolve_callable
from splitkeeper.core.ports import RegionRun
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import FILTERED_SCHEMA, META_COLUMNS
from splitkeeper.delta.storage import spark_uri
from splitkeeper.errors import SparkTransformError
from splitkeeper.records.spec import INGESTED_DATE, NOT_DATA_COLUMNS
from splitkeeper.spark.task import RecordPolicy, StagedWriter
from splitkeeper.staging import (
    DEAD_FILE,
    FILTERED_FILE,
    PART_FILE,
    PARTS_FILE,
    StagedRegion,
    attempt_dir,
    copy_file,
    exists,
    write_table,
)

__all__ = ["SparkTransform", "SparkTransformError", "exchanges_over", "python_traceback"]

#: The output of the per-partition writer: one row per region written (or one error row).
_RESULT = pa.schema(
    [
        pa.field("region", pa.int32()),
        pa.field("path", pa.string()),
        pa.field("records", pa.int64()),
        pa.field("bytes", pa.int64()),
        pa.field("error", pa.string()),
    ]
)
log = logging.getLogger("splitkeeper.spark.transform")
#: How long a transform step past its deadline waits for its cancelled job to wind down.
CANCEL_WAIT_S = 30.0

#: The columns of the joined frame that are not the input's bookkeeping nor output data.
_OUT_SPLIT, _OUT_OFFSET, _IN, _OUT = "__sk_out_split_id", "__sk_out_offset", "__sk_in", "__sk_out"
_JVM_FRAME = re.compile(r"^\s*at [\w.$]+\(.*\)\s*$")


def python_traceback(err: BaseException) -> str:
    """The Python traceback in ``err``: from a PythonException / Py4JJavaError, the Python worker's
    traceback without the JVM stack around it; from any other exception, its own traceback."""
    text = str(err)
    start = text.find("Traceback (most recent call last)")
    if start < 0:
        return "".join(traceback.format_exception(err)).rstrip()
    lines: list[str] = []
    for line in text[start:].splitlines():
        if _JVM_FRAME.match(line) or line.startswith(("JVM stacktrace:", "\tat ")):
            break
        lines.append(line)
    return "\n".join(lines).rstrip()


@dataclass(frozen=True, slots=True)
class _Job:
    """What every partition writer needs (pickled to the executors with the function)."""

    spec: str
    staging: str
    epoch: int
    attempt: str
    schema: pa.Schema  # the sink's (staged files') schema
    partition_by: tuple[str, ...]
    carried: tuple[str, ...]  # data-table columns taken from the input (tombstone)


class SparkTransform:
    """The Spark transform of one pipeline (created on the driver with its Spark session).

    ``policy``: the pipeline's record policy as the sink sees it (its ``data`` the transform's
    output columns, see :meth:`output_data`); the region tasks run :meth:`input_policy`.
    """

    def __init__(self, spark: Any, spec: str, policy: RecordPolicy, staging_path: str) -> None:
        self.spark = spark
        self.spec = spec
        self.function = resolve_callable(spec, "transform.function", Role.SPARK_TRANSFORM)
        self.policy = policy
        self.staging_path = staging_path

    # -- schemas -----------------------------------------------------------------------------

    @staticmethod
    def input_policy(policy: RecordPolicy) -> RecordPolicy:
        """What the region tasks stage for the transform: the decoded records with their
        bookkeeping, unpartitioned (the transform's writer partitions its output)."""
        return replace(policy, data=None, partition_by=())

    def _input_struct(self) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self.input_policy(self.policy).schema)

    def output_data(self) -> pa.Schema:
        """The data columns the function makes of an EMPTY DataFrame of the staged schema (its
        output minus the bookkeeping columns): the sink's data columns. Raises
        :class:`SparkTransformError` when it raises or drops ``split_id``/``offset``."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        empty = self.spark.createDataFrame([], self._input_struct())
        out = self._call(empty, "on an empty DataFrame of the staged columns, when the pipeline opened")
        self._check_keys(out.columns)
        fields = [f for f in out.schema.fields if f.name not in NOT_DATA_COLUMNS]
        arrow = to_arrow_schema(StructType(fields))
        return pa.schema([f.with_nullable(True) for f in arrow])

    def shuffles(self) -> tuple[str, ...]:
        """The exchanges in the physical plan of the function's output that move the epoch's
        records between partitions (a join, an aggregate, a window, ``dropDuplicates``,
        ``repartition``, a sort; a broadcast of them): where one region's output can depend on
        another region's records, so regions are not independent (protocol rule 2.9). One line
        per exchange, as Spark prints it; empty when the plan shuffles nothing of the input (a
        broadcast of a static table does not count).

        Planned, not run, over a zero-row parquet file of the staged columns in a local temporary
        folder: a file scan, which the optimizer cannot fold away as it folds an empty local
        DataFrame. Raises :class:`SparkTransformError` when the function raises."""
        import tempfile

        folder = tempfile.mkdtemp(prefix="splitkeeper-plan-")
        try:
            path = os.path.join(folder, PART_FILE)
            schema = pa.schema([f.with_nullable(True) for f in self.input_policy(self.policy).schema])
            pq.write_table(schema.empty_table(), path)
            location = "file://" + folder
            df = self.spark.read.schema(self._input_struct()).parquet(location + "/" + PART_FILE)
            out = self._call(df, "while its plan was checked for shuffles, when the pipeline opened")
            plan = str(out._jdf.queryExecution().executedPlan().toString())
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return exchanges_over(plan, folder)

    def _call(self, df: Any, where: str) -> Any:
        from pyspark.sql import DataFrame

        try:
            out = self.function(df)
        except Exception as err:
            # the function's own frames (this frame is not the user's)
            tb = traceback.format_exception(
                type(err), err, err.__traceback__.tb_next if err.__traceback__ else None
            )
            text = (
                python_traceback(err)
                if "Traceback (most recent call last)" in str(err)
                else "".join(tb).rstrip()
            )
            raise SparkTransformError(
                f"{self.spec}: raised {_first_line(err)} {where}\n{text}",
                function=self.spec,
            ) from err
        if not isinstance(out, DataFrame):
            raise SparkTransformError(
                f"{self.spec}: returned {type(out).__name__} {where}; a spark transform returns a "
                "pyspark.sql.DataFrame",
                function=self.spec,
            )
        return out

    def _check_keys(self, columns: Sequence[str]) -> None:
        missing = [c for c in ("split_id", "offset") if c not in columns]
        if missing:
            raise SparkTransformError(
                f"{self.spec}: broke the rule 'every output row keeps split_id and offset': its output "
                f"has no column {', '.join(missing)} (it has {list(columns)}); keep them (select them, "
                "or pass them through a join or groupBy)",
                function=self.spec,
            )

    # -- per epoch ---------------------------------------------------------------------------

    def apply(
        self, epoch: int, runs: Mapping[int, RegionRun], timeout_s: float | None = None
    ) -> dict[int, RegionRun]:
        """The epoch's region runs with every acknowledged region's output replaced by its share
        of the transform's output; on any failure every acknowledged region DECLINEs, naming the
        function, and when the step does not end within ``timeout_s`` (the region timeout; None:
        no deadline) its job is cancelled and every acknowledged region TIMES OUT (a declined or
        timed-out region is returned as it is, and so is an idle one: the driver acknowledged it
        without a task, it staged nothing)."""
        acks = {r: run for r, run in runs.items() if run.acknowledged and run.output is not None}
        out = dict(runs)
        if not acks:
            return out
        try:
            written = self._run_within(epoch, acks, timeout_s)
        except _StepTimedOut as late:
            error = (
                f"{self.spec}: did not finish within {late.timeout_s:g}s (checkpoint.region_timeout_s) "
                f"in epoch {epoch}: its Spark job was cancelled. The spark transform sees the records "
                f"of every region of the epoch together: all {len(acks)} acknowledged regions time out, "
                "nothing of the epoch is committed, and it is read again. Make the function finish "
                "(a UDF that waits on a service needs a timeout of its own), or raise "
                "checkpoint.region_timeout_s"
            )
            log.warning("%s", error.split(". The spark transform")[0], extra={"epoch": epoch})
            for r, run in acks.items():
                out[r] = replace(run, outcome=RegionOutcome.TIMEOUT, error=error, output=None, records=0)
            return out
        except SparkTransformError as err:
            error = err.message
        except Exception as err:  # noqa: BLE001 - an executor failure of the user's code, or Spark's
            error = f"{self.spec}: failed in epoch {epoch}: {_first_line(err)}\n{python_traceback(err)}"
        else:
            for r, run in acks.items():
                staged, records = written[r]
                out[r] = replace(run, output=staged, records=records)
            return out
        error += (
            f"\n(the spark transform sees the records of every region of epoch {epoch} together: all "
            f"{len(acks)} acknowledged regions decline, nothing of the epoch is committed, and it is "
            "read again)"
        )
        for r, run in acks.items():
            out[r] = replace(run, outcome=RegionOutcome.DECLINE, error=error, output=None, records=0)
        return out

    def _run_within(
        self, epoch: int, acks: Mapping[int, RegionRun], timeout_s: float | None
    ) -> dict[int, tuple[StagedRegion, int]]:
        """:meth:`_run` in a thread of its own, in a job group of its own; past ``timeout_s`` the group
        is cancelled (interrupting its tasks) and :class:`_StepTimedOut` raised once the thread ended
        (at most :data:`CANCEL_WAIT_S` later: a driver-side hang is left behind)."""
        if timeout_s is None:
            return self._run(epoch, acks)
        sc = self.spark.sparkContext
        group = f"splitkeeper-transform-e{epoch}-{uuid.uuid4().hex[:8]}"
        done: dict[str, Any] = {}

        def step() -> None:
            sc.setJobGroup(group, f"splitkeeper spark transform {self.spec}, epoch {epoch}", True)
            try:
                done["written"] = self._run(epoch, acks)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
                done["error"] = err

        thread = threading.Thread(target=step, name=f"splitkeeper-transform-e{epoch}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            sc.cancelJobGroup(group)
            thread.join(CANCEL_WAIT_S)
            raise _StepTimedOut(timeout_s)
        if "error" in done:
            raise done["error"]
        return dict(done["written"])

    def _run(self, epoch: int, acks: Mapping[int, RegionRun]) -> dict[int, tuple[StagedRegion, int]]:
        from pyspark.sql import functions as F  # noqa: N812

        policy = self.policy
        files = [spark_uri(_staged(run.output).path) for run in acks.values()]
        for path in files:
            if path.endswith(PARTS_FILE):  # pragma: no cover - input_policy stages no partitions
                raise SparkTransformError(f"{self.spec}: staged input {path} is partitioned", path=path)
        df = self.spark.read.schema(self._input_struct()).parquet(*files)
        out = self._call(df, f"in epoch {epoch}")
        self._check_keys(out.columns)
        data = [f for f in policy.schema if f.name not in NOT_DATA_COLUMNS]
        self._check_data(epoch, out, data)
        book_columns = [c for c in df.columns if c in NOT_DATA_COLUMNS]
        carried = tuple(c for c in book_columns if c not in _WRITER_OWN)
        book = df.select(*book_columns, F.lit(True).alias(_IN))
        produced = out.select(
            F.col("split_id").alias(_OUT_SPLIT),
            F.col("offset").cast("bigint").alias(_OUT_OFFSET),
            *(F.col(f.name).alias(f.name) for f in data),
            F.lit(True).alias(_OUT),
        )
        joined = book.join(
            produced,
            (book["split_id"] == produced[_OUT_SPLIT]) & (book["offset"] == produced[_OUT_OFFSET]),
            "full_outer",
        )
        job = _Job(
            self.spec,
            self.staging_path,
            epoch,
            uuid.uuid4().hex,
            policy.schema,
            tuple(policy.partition_by),
            carried,
        )
        written: dict[int, tuple[StagedRegion, int]] = {}
        errors: list[str] = []
        rows = (
            joined.repartition(max(1, len(acks)), "region")
            .mapInArrow(partial(_write_partition, job), _result_struct())
            .collect()
        )
        for row in rows:
            if row["error"]:
                errors.append(row["error"])
            else:
                region = int(row["region"])
                published = os.path.basename(row["path"])
                written[region] = (
                    StagedRegion(self.staging_path, epoch, region, job.attempt, published),
                    int(row["records"]),
                )
        if errors:
            raise SparkTransformError(sorted(errors)[0], function=self.spec)
        for r, run in acks.items():
            if r not in written:  # a region that read no record: an empty output all the same
                with StagedWriter(
                    os.path.join(attempt_dir(self.staging_path, epoch, r, job.attempt), PART_FILE),
                    epoch,
                    r,
                    policy.schema,
                    partition_by=policy.partition_by,
                ) as writer:
                    staged = writer.commit()
                published = os.path.basename(staged.path)
                written[r] = (
                    StagedRegion(self.staging_path, epoch, r, job.attempt, published),
                    staged.records,
                )
            _carry_dead_letters(_staged(run.output), written[r][0])
        return written

    def _check_data(self, epoch: int, out: Any, data: Sequence[pa.Field]) -> None:
        """The output's data columns are the sink's, with the types they had when the pipeline opened."""
        from pyspark.sql.pandas.types import from_arrow_type

        types = {f.name: f.dataType for f in out.schema.fields}
        known = {f.name for f in data}
        extra = [n for n in types if n not in known and n not in NOT_DATA_COLUMNS]
        if extra:
            raise SparkTransformError(
                f"{self.spec}: its output in epoch {epoch} has the columns {extra}, which the sink does "
                f"not have (its data columns: {sorted(known)}, what it returned for an empty DataFrame "
                "when the pipeline opened); a spark transform returns the same columns every epoch",
                function=self.spec,
            )
        for f in data:
            wanted = from_arrow_type(f.type)
            if f.name not in types:
                raise SparkTransformError(
                    f"{self.spec}: its output in epoch {epoch} has no column {f.name!r}, a column of the "
                    f"sink ({wanted.simpleString()}, what it returned for an empty DataFrame when the "
                    "pipeline opened); a spark transform returns the same columns every epoch",
                    function=self.spec,
                )
            if types[f.name] != wanted:
                raise SparkTransformError(
                    f"{self.spec}: its output in epoch {epoch} has column {f.name!r} of type "
                    f"{types[f.name].simpleString()}, but the sink's {f.name!r} is "
                    f"{wanted.simpleString()}; cast it in the function (a column's type does not change)",
                    function=self.spec,
                )


_EXCHANGE = re.compile(r"\b(\w*Exchange)\b")
_IDS = re.compile(r"#\d+|, \[plan_id=\d+\]")


def exchanges_over(plan: str, relation: str) -> tuple[str, ...]:
    """The exchange nodes of a physical plan's tree string (``executedPlan().toString()``) whose
    subtree reads ``relation`` (a path its file scan names), as lines without Spark's expression
    ids; the exchanges of an adaptive plan's initial plan included. Pure text: a node's subtree is
    the lines after it that are indented deeper."""
    lines = plan.splitlines()

    def depth(line: str) -> int:
        return next((i for i, ch in enumerate(line) if ch.isalnum()), len(line))

    found: list[str] = []
    for i, line in enumerate(lines):
        match = _EXCHANGE.search(line)
        if match is None or match.start() != depth(line):
            continue
        below = []
        for later in lines[i + 1 :]:
            if depth(later) <= depth(line):
                break
            below.append(later)
        if any(relation in text for text in below):
            node = _IDS.sub("", line[depth(line) :]).strip()
            if node not in found:
                found.append(node)
    return tuple(found)


#: The columns the StagedWriter stamps itself (the rest of the bookkeeping rides in its data table).
_WRITER_OWN = frozenset(
    ("split_id", "offset", "next_offset", "epoch", "region", "ingested_at", *META_COLUMNS)
)


class _StepTimedOut(Exception):
    """The transform step did not end within its deadline (its job group was cancelled)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"no result within {timeout_s:g}s")
        self.timeout_s = timeout_s


def _result_struct() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_RESULT)


def _first_line(err: BaseException) -> str:
    lines = [ln for ln in str(err).splitlines() if ln.strip()]
    tb = python_traceback(err).splitlines()
    last = tb[-1] if tb and "Traceback" in str(err) else ""
    return last or (f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__)


def _error_row(message: str) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"error": message}], schema=_RESULT)


def _write_partition(job: _Job, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """One partition of the joined frame (whole regions): check the contract, then write each
    region's kept rows as its new staged output and its dropped offsets as filtered ranges."""
    received = [b for b in batches if b.num_rows]
    if not received:
        return
    table = pa.Table.from_batches(received)
    produced = pc.fill_null(table[_OUT], False)
    read = pc.fill_null(table[_IN], False)
    keyless = pc.and_(produced, pc.or_(pc.is_null(table[_OUT_SPLIT]), pc.is_null(table[_OUT_OFFSET])))
    if pc.any(keyless).as_py():
        row = table.filter(keyless).slice(0, 1).to_pylist()[0]
        yield _error_row(
            f"{job.spec}: broke the rule 'every output row keeps split_id and offset': in epoch "
            f"{job.epoch} a row has split_id {row[_OUT_SPLIT]!r} and offset {row[_OUT_OFFSET]!r}"
        )
        return
    invented = pc.and_(produced, pc.invert(read))
    if pc.any(invented).as_py():
        row = table.filter(invented).slice(0, 1).to_pylist()[0]
        yield _error_row(
            f"{job.spec}: broke the rule 'no rows invented': in epoch {job.epoch} it emitted split "
            f"{row[_OUT_SPLIT]!r} offset {row[_OUT_OFFSET]}, which the epoch did not read"
        )
        return
    kept = table.filter(produced)
    if kept.num_rows:
        counts = kept.group_by(["split_id", "offset"]).aggregate([([], "count_all")])
        twice = counts.filter(pc.greater(counts["count_all"], 1))
        if twice.num_rows:
            row = twice.slice(0, 1).to_pylist()[0]
            yield _error_row(
                f"{job.spec}: broke the rule 'no rows invented': in epoch {job.epoch} it emitted split "
                f"{row['split_id']!r} offset {row['offset']} {row['count_all']} times (at most once)"
            )
            return
    for region in sorted(pc.unique(table["region"]).to_pylist()):
        rows = table.filter(pc.equal(table["region"], region)).sort_by(
            [("split_id", "ascending"), ("offset", "ascending")]
        )
        yield _write_region(job, int(region), rows)


def _write_region(job: _Job, region: int, rows: pa.Table) -> pa.RecordBatch:
    folder = attempt_dir(job.staging, job.epoch, region, job.attempt)
    produced = pc.fill_null(rows[_OUT], False)
    kept, dropped = rows.filter(produced), rows.filter(pc.invert(produced))
    data_names = [f.name for f in job.schema if f.name not in NOT_DATA_COLUMNS or f.name in job.carried]
    data_names = [n for n in data_names if n != INGESTED_DATE]
    with StagedWriter(
        os.path.join(folder, PART_FILE), job.epoch, region, job.schema, partition_by=job.partition_by
    ) as writer:
        splits = kept["split_id"]
        for split_id in pc.unique(splits).to_pylist():
            part = kept.filter(pc.equal(splits, split_id))
            writer.add_table(
                split_id,
                part["offset"].combine_chunks(),
                part["next_offset"].combine_chunks(),
                part.select([n for n in data_names if n in part.column_names]),
                [part[name].combine_chunks() for name in META_COLUMNS],
                None,
            )
        staged = writer.commit()
    if dropped.num_rows:
        _write_filtered(job, region, folder, dropped)
    return pa.RecordBatch.from_pylist(
        [{"region": region, "path": staged.path, "records": staged.records, "bytes": staged.bytes}],
        schema=_RESULT,
    )


def _write_filtered(job: _Job, region: int, folder: str, dropped: pa.Table) -> None:
    """The dropped records (sorted by split and offset) as ranges of records consecutive in read
    order (one record's ``next_offset`` is the next one's ``offset``): ``filtered.parquet``."""
    ranges: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for split_id, offset, next_offset in zip(
        dropped["split_id"].to_pylist(),
        dropped["offset"].to_pylist(),
        dropped["next_offset"].to_pylist(),
        strict=True,
    ):
        if current is not None and current["split_id"] == split_id and current["end_offset"] == offset:
            current["end_offset"] = next_offset
            current["records"] += 1
            continue
        current = {
            "split_id": split_id,
            "start_offset": offset,
            "end_offset": next_offset,
            "records": 1,
            "epoch": job.epoch,
            "region": region,
            "function": job.spec,
        }
        ranges.append(current)
    write_table(pa.Table.from_pylist(ranges, schema=FILTERED_SCHEMA), os.path.join(folder, FILTERED_FILE))


def _staged(output: Any) -> StagedRegion:
    """A region's staged output: what its task published (a path given by hand read back)."""
    if isinstance(output, StagedRegion):
        return output
    found = StagedRegion.at(str(output))
    if found is None:
        raise SparkTransformError(f"staged input {output} is not in the staging layout", path=str(output))
    return found


def _carry_dead_letters(old_output: StagedRegion, new_output: StagedRegion) -> None:
    """The region's ``dead.parquet`` beside its new output (the sink looks for it there)."""
    source = old_output.side(DEAD_FILE).path
    if exists(source):
        copy_file(source, new_output.side(DEAD_FILE).path)
