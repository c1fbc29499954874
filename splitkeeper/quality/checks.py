"""The restart checks: protocol section 6 as Great Expectations suites on the Delta state and the sink.

Who calls it: the Airflow validate task and ``splitkeeper validate``, on the driver,
after a pipeline (re)started or ran epochs: :func:`run_restart_checks` then
:func:`raise_on_failure`. It only reads (the state tables, the sink table) and writes
the Data Docs site under the folder the caller gives; it may be called any number of
times, also while no pipeline runs.

How: the suites are the JSON files in ``expectations/`` (one per suite; see
``expectations/README.md``). Each names the *dataset* it runs on; this module derives
those datasets as Spark DataFrames from the checked checkpoint's state, read through
:mod:`splitkeeper.delta.history` (the only reader of the state tables; its pyarrow
tables become frames with ``spark.createDataFrame``), and from the sink table, read
with Spark (:func:`build_restart_frames`). It runs every suite through an ephemeral GE
context with a COMPLETE (or, per record, SUMMARY) result format that lists the
offending rows by their index columns, and builds the Data Docs site.

The rules' thresholds come from the protocol core (``COUNT_TOLERANCE``,
``weighted_bound_tolerance``); the failures are reported as core
:class:`~splitkeeper.core.invariants.Violation` values, so a restart check and the
simulator speak the same vocabulary.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper import resources
from splitkeeper.core.assignment import AssignmentStrategy, WeightedStrategy, strategy_by_name
from splitkeeper.core.invariants import (
    COUNT_TOLERANCE,
    Violation,
    ViolationKind,
    weighted_bound_tolerance,
    weighted_deviations,
)
from splitkeeper.core.source import RegionReader
from splitkeeper.core.types import DISCOVERED_DETAIL_PATTERN, AuditRecord, RecoveryDecision, Split
from splitkeeper.errors import (
    CheckpointError,
    ConfigError,
    EnvironmentNotReadyError,
    InvalidParameterError,
    InvariantViolation,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from splitkeeper.delta.checkpoints import DeltaStateStore

__all__ = [
    "ENV_EXPECTATIONS_DIR",
    "SUITES",
    "CheckReport",
    "ExpectationOutcome",
    "RestartFrames",
    "SuiteOutcome",
    "SuiteSpec",
    "SuiteStatus",
    "build_restart_frames",
    "expectations_dir",
    "load_suite_specs",
    "raise_on_failure",
    "run_restart_checks",
]

log = logging.getLogger(__name__)

#: Overrides where the suite JSON files are read from (default: ``<checkout>/expectations``).
ENV_EXPECTATIONS_DIR = resources.EXPECTATIONS_DIR_ENV

#: The suites, by file stem, in the order they run and are reported.
SUITES: tuple[str, ...] = ("ownership", "lifecycle", "sink_records", "sink_splits", "balance", "ref_chains")

#: The datasets the suites run on (``meta.splitkeeper.dataset`` of each suite file).
DATASETS: tuple[str, ...] = ("split_places", "sink_records", "sink_splits", "reader_loads", "region_refs")

DATA_DOCS_SITE = "splitkeeper"

_DROPPED_DECISIONS = (
    RecoveryDecision.DROPPED_REMOVED_SUBSCRIPTION.value,
    RecoveryDecision.DROPPED_UNKNOWN.value,
    RecoveryDecision.DROPPED_BY_OPERATOR.value,  # recover --drop: its file is gone
)


# ---------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------


class SuiteStatus(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # not applicable (legacy-hash balance); the suite's notes say why


@dataclass(frozen=True, slots=True)
class ExpectationOutcome:
    """One expectation of one suite, as GE evaluated it.

    ``rule`` is the core :class:`ViolationKind` value the expectation guards.
    ``split_ids`` / ``reader_ids`` / ``checkpoint_ids`` are the offending ones, read from
    GE's unexpected index list (complete, or a sample when ``truncated``).
    """

    expectation: str
    target: str
    rule: str
    description: str
    success: bool
    unexpected_count: int = 0
    split_ids: tuple[str, ...] = ()
    reader_ids: tuple[int, ...] = ()
    checkpoint_ids: tuple[int, ...] = ()
    truncated: bool = False
    error: str = ""

    def line(self) -> str:
        """One sentence naming the expectation, how often it failed and the offenders."""
        text = f"{self.expectation}({self.target})"
        if self.success:
            return f"{text}: ok"
        if self.error:
            return f"{text}: raised {self.error}"
        parts = [f"{text}: {self.unexpected_count} unexpected row(s)"]
        if self.split_ids:
            parts.append("splits " + _short(self.split_ids))
        if self.reader_ids:
            parts.append("readers " + _short([str(r) for r in self.reader_ids]))
        if self.checkpoint_ids:
            parts.append("checkpoints " + _short([str(c) for c in self.checkpoint_ids]))
        if self.truncated:
            parts.append("(a sample: see Data Docs)")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class SuiteOutcome:
    """One suite's result: status, per-expectation outcomes, rows checked, notes."""

    key: str
    name: str
    status: SuiteStatus
    dataset: str
    rows: int
    expectations: tuple[ExpectationOutcome, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def success(self) -> bool:
        """True unless an expectation failed (a SKIPPED suite counts as success; see notes)."""
        return self.status is not SuiteStatus.FAILED

    @property
    def failed(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(e for e in self.expectations if not e.success)

    @property
    def split_ids(self) -> tuple[str, ...]:
        """Every offending split id of this suite, sorted."""
        return tuple(sorted({s for e in self.failed for s in e.split_ids}))


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What :func:`run_restart_checks` found for one checkpoint of one pipeline."""

    pipeline: str
    checkpoint_id: int
    strategy: str
    suites: tuple[SuiteOutcome, ...]
    data_docs_index: Path | None
    notes: tuple[str, ...] = ()

    @property
    def success(self) -> bool:
        return all(s.success for s in self.suites)

    def suite(self, key: str) -> SuiteOutcome:
        """The outcome of suite ``key`` (a file stem of :data:`SUITES`)."""
        for s in self.suites:
            if s.key == key:
                return s
        raise InvalidParameterError("suite", key, "one of " + ", ".join(s.key for s in self.suites))

    @property
    def failed_suites(self) -> tuple[SuiteOutcome, ...]:
        return tuple(s for s in self.suites if not s.success)

    @property
    def split_ids(self) -> tuple[str, ...]:
        """Every offending split id, over all suites, sorted."""
        return tuple(sorted({x for s in self.suites for x in s.split_ids}))

    def summary(self) -> str:
        """A few lines for a terminal or a task log."""
        verdict = "PASSED" if self.success else "FAILED"
        lines = [
            f"restart checks of pipeline {self.pipeline!r} at checkpoint {self.checkpoint_id} "
            f"(strategy {self.strategy}): {verdict}"
        ]
        for s in self.suites:
            lines.append(f"  {s.key:<13} {s.status.value:<8} {s.rows} row(s) checked")
            lines.extend(f"      {e.line()}" for e in s.failed)
            lines.extend(f"      note: {n}" for n in s.notes)
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.data_docs_index is not None:
            lines.append(f"  Data Docs: {self.data_docs_index}")
        return "\n".join(lines)

    def violations(self) -> tuple[Violation, ...]:
        """The failed expectations as core violations (kind, offending split ids, sentence)."""
        found: list[Violation] = []
        for s in self.suites:
            for e in s.failed:
                found.append(Violation(_violation_kind(e.rule), e.split_ids, f"suite {s.name}: {e.line()}"))
        return tuple(found)


def raise_on_failure(report: CheckReport) -> None:
    """Raise :class:`InvariantViolation` when any suite failed; return quietly otherwise.

    The message names every failing expectation with its offending split ids (or reader
    / checkpoint ids) and the Data Docs index; ``params`` carry ``violations`` (core
    :class:`Violation` values), ``split_ids`` and ``report``. Called by the Airflow
    validate task and ``splitkeeper validate`` right after :func:`run_restart_checks`.
    """
    if report.success:
        return
    violations = report.violations()
    shown = "; ".join(f"{v.kind.value}: {v.detail}" for v in violations[:10])
    more = f" (and {len(violations) - 10} more)" if len(violations) > 10 else ""
    docs = f". Data Docs: {report.data_docs_index}" if report.data_docs_index else ""
    raise InvariantViolation(
        f"restart checks of pipeline {report.pipeline!r} at checkpoint {report.checkpoint_id} failed "
        f"({', '.join(s.key for s in report.failed_suites)}): {shown}{more}{docs}",
        violations=violations,
        split_ids=report.split_ids,
        checkpoint_id=report.checkpoint_id,
        report=report,
    )


def _violation_kind(rule: str) -> ViolationKind:
    try:
        return ViolationKind(rule)
    except ValueError:
        return ViolationKind.OFFSET_UNEXPECTED if rule.startswith("offset") else ViolationKind.NOT_OWNED


def _short(items: Sequence[str], limit: int = 12) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


# ---------------------------------------------------------------------------------------
# Suite files
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SuiteSpec:
    """One suite file: its GE definition plus where and how splitkeeper runs it."""

    key: str
    name: str
    dataset: str
    index_columns: tuple[str, ...]
    result_format: dict[str, Any]
    definition: dict[str, Any]

    def to_suite(self) -> Any:
        """A fresh ``great_expectations.ExpectationSuite`` of this definition.

        GE drops an invalid expectation with only a log line; this refuses that (ConfigError).
        """
        import great_expectations as gx

        expected = self.definition["expectations"]
        suite = gx.ExpectationSuite(
            name=self.name,
            expectations=[dict(e) for e in expected],
            meta=dict(self.definition.get("meta") or {}),
            notes=self.definition.get("notes"),
        )
        if len(suite.expectations) != len(expected):
            raise ConfigError(
                f"suite {self.key}: Great Expectations accepted {len(suite.expectations)} of "
                f"{len(expected)} expectations; fix the invalid ones in {self.key}.json",
                suite=self.key,
            )
        return suite


def expectations_dir(env: Mapping[str, str] | None = None) -> Traversable:
    """Where the suite files live: ``$SPLITKEEPER_EXPECTATIONS_DIR``, else the package's ``expectations/``."""
    return resources.expectations_dir(env)


def load_suite_specs(directory: str | os.PathLike[str] | None = None) -> dict[str, SuiteSpec]:
    """Read every suite of :data:`SUITES` from ``directory`` (default :func:`expectations_dir`).

    EnvironmentNotReadyError when the folder or a file is missing; ConfigError when a file
    is not a suite this module can run (bad JSON, unknown dataset, no index columns).
    """
    folder: Traversable = Path(directory) if directory is not None else expectations_dir()
    if not folder.is_dir():
        raise EnvironmentNotReadyError(
            f"the expectation suites folder {folder} does not exist: the suites ship with splitkeeper "
            f"(expectations/ of the source tree); set {ENV_EXPECTATIONS_DIR} to where they are mounted",
            path=str(folder),
        )
    specs: dict[str, SuiteSpec] = {}
    for key in SUITES:
        path = folder / f"{key}.json"
        try:
            definition = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise EnvironmentNotReadyError(
                f"suite file {path} is missing (every suite of {', '.join(SUITES)} is required)",
                path=str(path),
            ) from err
        except json.JSONDecodeError as err:
            raise ConfigError(f"suite file {path} is not valid JSON: {err}", path=str(path)) from err
        sk = ((definition.get("meta") or {}).get("splitkeeper")) or {}
        dataset = sk.get("dataset")
        if dataset not in DATASETS:
            raise ConfigError(
                f"suite file {path}: meta.splitkeeper.dataset={dataset!r} is not allowed: one of "
                f"{', '.join(DATASETS)}",
                path=str(path),
            )
        index_columns = tuple(sk.get("index_columns") or ())
        if not index_columns or not definition.get("name") or not definition.get("expectations"):
            raise ConfigError(
                f"suite file {path} needs a name, expectations and meta.splitkeeper.index_columns",
                path=str(path),
            )
        mode = sk.get("result_format", "COMPLETE")
        if mode not in ("COMPLETE", "SUMMARY"):
            raise ConfigError(
                f"suite file {path}: meta.splitkeeper.result_format={mode!r} is not allowed: "
                "COMPLETE or SUMMARY",
                path=str(path),
            )
        result_format: dict[str, Any] = {
            "result_format": mode,
            "unexpected_index_column_names": list(index_columns),
            "return_unexpected_index_query": False,
        }
        if mode == "SUMMARY":
            result_format["partial_unexpected_count"] = int(sk.get("partial_unexpected_count", 20))
        specs[key] = SuiteSpec(
            key=key,
            name=str(definition["name"]),
            dataset=str(dataset),
            index_columns=index_columns,
            result_format=result_format,
            definition=definition,
        )
    return specs


# ---------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestartFrames:
    """The datasets of one checked checkpoint, as Spark DataFrames keyed by dataset name.

    - ``split_places``: one row per pooled/assigned/quarantined enumerator entry (split_id, status,
      owner, subscription, position, end, finished, owner_consistent), plus one row with
      ``status`` NULL for each subscribed split a region's state holds that the enumerator
      has neither pooled, assigned nor finished (a lost split);
    - ``sink_records``: the sink's records of epochs up to the checkpoint, with
      ``following_offset`` = the next larger offset of the same split and ``resumes_at`` =
      ``next_offset``, or the end of a reported lost range that begins there;
    - ``sink_splits``: per split with records or known to the checkpoint: records,
      first_offset, last_next_offset, last_resumes_at, start_position, committed_position,
      state, known;
    - ``reader_loads``: per registered reader: splits, load, imbalance, allowed;
    - ``region_refs``: per kept checkpoint up to this one, region and split of its state:
      ref_checkpoint_id, ref_depth, ref_kept, ref_earlier.
    """

    checkpoint_id: int
    frames: dict[str, DataFrame]
    notes: tuple[str, ...] = ()
    loads: dict[int, int] = field(default_factory=dict)
    cached: tuple[DataFrame, ...] = ()

    def unpersist(self) -> None:
        """Release the cached frames; call once the suites ran."""
        for frame in (*self.frames.values(), *self.cached):
            frame.unpersist()


def _sink_frame(spark: SparkSession, sink_path: str | os.PathLike[str]) -> tuple[DataFrame, bool]:
    """The sink table (read with Spark), or an empty frame of its schema when no table exists there yet."""
    from splitkeeper.delta.sink import sink_frame

    return sink_frame(spark, sink_path)


def resolve_strategy(strategy: str | AssignmentStrategy) -> AssignmentStrategy:
    """A strategy instance from a registry name or an instance (weights and capacities kept)."""
    if isinstance(strategy, AssignmentStrategy):
        return strategy
    if isinstance(strategy, str):
        return strategy_by_name(strategy)
    raise InvalidParameterError("strategy", strategy, "a strategy name or an AssignmentStrategy")


def _reader_rows(
    owned: Mapping[int, Sequence[str]], strategy: AssignmentStrategy
) -> list[tuple[int, int, float, float, float]]:
    """(reader_id, splits, load, imbalance, allowed) per reader, by the core's balance rules."""
    if not owned:
        return []
    counts = {r: len(s) for r, s in owned.items()}
    if isinstance(strategy, WeightedStrategy):
        weights = {r: [strategy.weight(s) for s in splits] for r, splits in owned.items()}
        loads = {r: float(sum(w)) for r, w in weights.items()}
        all_weights = [w for ws in weights.values() for w in ws]
        tolerance = weighted_bound_tolerance(max(all_weights, default=0.0), sum(all_weights))
        deviations = weighted_deviations(loads, strategy.capacity)
        return [(r, counts[r], loads[r], abs(deviations[r]), tolerance) for r in sorted(owned)]
    least = min(counts.values())
    return [
        (r, counts[r], float(counts[r]), float(counts[r] - least), float(COUNT_TOLERANCE))
        for r in sorted(owned)
    ]


@dataclass(frozen=True, slots=True)
class SplitLife:
    """What the audit trail says about splits over their whole life (kept through retention).

    ``starts``: where each split started when it was discovered (the latest DISCOVERED
    record with a position). ``lost``: per split, the merged ``[start, end)`` ranges the
    pipeline skipped because the source no longer had them (SKIPPED_LOST_RANGE records,
    ``on_offset_out_of_range: skip``); the only gaps the sink may have.
    """

    starts: dict[str, int] = field(default_factory=dict)
    lost: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def resume(self, split_id: str, offset: int) -> int:
        """``offset``, or the end of the reported lost range that begins exactly there."""
        for start, end in self.lost.get(split_id, ()):
            if start == offset:
                return end
        return offset

    def gap_rows(self) -> list[tuple[str, int, int]]:
        return [(sid, a, b) for sid, ranges in sorted(self.lost.items()) for a, b in ranges]

    def note(self) -> str | None:
        """One sentence naming the accepted gaps, or None when nothing was lost."""
        rows = self.gap_rows()
        if not rows:
            return None
        shown = [f"{sid} [{a}, {b})" for sid, a, b in rows]
        return (
            f"{sum(b - a for _s, a, b in rows)} offset(s) of {len(self.lost)} split(s) were skipped as lost "
            f"(SKIPPED_LOST_RANGE in the audit trail, on_offset_out_of_range=skip); exactly these gaps are "
            f"accepted in the sink: {_short(shown)}"
        )


def _merge(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(r for r in ranges if r[1] > r[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def read_split_life(state_store: DeltaStateStore, checkpoint_id: int) -> SplitLife:
    """The DISCOVERED and SKIPPED_LOST_RANGE audit records up to ``checkpoint_id`` (see :class:`SplitLife`).

    The audit trail outlives retention; which rows count is the history's orphan-attempt
    rule (:meth:`splitkeeper.delta.history.StateHistory.committed_audit`).
    """
    import re

    from splitkeeper.core.source import LostRange

    decisions = (RecoveryDecision.DISCOVERED.value, RecoveryDecision.SKIPPED_LOST_RANGE.value)
    rows = state_store.history.committed_audit(checkpoint_id, decisions).to_pylist()
    at = re.compile(DISCOVERED_DETAIL_PATTERN)
    starts: dict[str, tuple[tuple[int, int], int]] = {}
    lost: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        sid, decision, detail = row["split_id"], RecoveryDecision(row["decision"]), row["detail"] or ""
        if decision is RecoveryDecision.DISCOVERED:
            match = at.match(detail)
            order = (int(row["checkpoint_id"]), int(row["seq"]))
            if match is not None and (sid not in starts or starts[sid][0] < order):
                starts[sid] = (order, int(match.group(1)))  # the latest discovery is this life's start
            continue
        gone = LostRange.from_audit(AuditRecord(sid, None, decision, None, detail))
        if gone is not None:
            lost.setdefault(sid, []).append((gone.start, gone.new_start))
    return SplitLife(
        starts={sid: position for sid, (_order, position) in starts.items()},
        lost={sid: _merge(ranges) for sid, ranges in lost.items()},
    )


def _content_rows(
    reader: RegionReader,
    source_rows: Sequence[tuple[str, int, int | None]],
    finished: Collection[str],
    life: SplitLife,
) -> list[tuple[str, int, str]]:
    """(split_id, records, SHA-256 of its values joined by newlines) of each finished split with an
    end among the source rows, read by ``reader`` from its start to its end.

    Splits with a reported lost range are left out (the sink lacks exactly those records); a
    split whose data cannot be read now (gone, changed: SourceError) is left out with a
    warning: the other checks still see its offsets.
    """
    import hashlib

    from splitkeeper.errors import SourceError

    rows: list[tuple[str, int, str]] = []
    for split_id, start, end in source_rows:
        if end is None or split_id not in finished or split_id in life.lost:
            continue
        split = Split(split_id, position=start, end=end)
        try:
            values = [record.value for record in reader.read_range(split, start, end)]
        except SourceError as err:
            log.warning("content check: split %s is not checked: %s", split_id, err)
            continue
        digest = hashlib.sha256("\n".join(values).encode("utf-8")).hexdigest()
        rows.append((split_id, len(values), digest))
    return rows


def build_restart_frames(
    spark: SparkSession,
    state_store: DeltaStateStore,
    sink_path: str | os.PathLike[str],
    checkpoint_id: int,
    *,
    strategy: AssignmentStrategy,
    subscriptions: Collection[str],
    source_splits: Iterable[Split] | None = None,
    content_reader: RegionReader | None = None,
) -> RestartFrames:
    """Derive the datasets the suites run on (see :class:`RestartFrames`); cached, small.

    ``source_splits`` are the splits as the source has them (at their initial position):
    their position is the start the sink must begin at (default 0, as the core's
    ``check_sink_offsets``), and a finished bounded split must end at its ``end``. Where
    the audit trail recorded the position a split was discovered at, that position is
    its start instead (a source with retention, Kafka, no longer knows it). Offsets the
    pipeline reported as lost (:class:`SplitLife`) are the only gaps accepted.
    With ``content_reader`` (the source's region reader) each finished split among
    ``source_splits`` is read from its start to its end and ``sink_splits`` gets
    ``content_matches``: the sink's count and SHA-256 of the split's values (in offset
    order) equal the data's (NULL for the splits not checked). See :func:`_content_rows`.
    CheckpointError when ``checkpoint_id`` is not a completed checkpoint.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        BooleanType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    notes: list[str] = []
    history = state_store.history
    checkpoints = spark.createDataFrame(history.checkpoints()).cache()
    heads = {
        int(r["checkpoint_id"]): r
        for r in checkpoints.select("checkpoint_id", "parallelism", "enumerator").collect()
    }
    kept_ids = sorted(heads)
    if checkpoint_id not in heads:
        checkpoints.unpersist()
        raise CheckpointError(
            f"checkpoint {checkpoint_id} of pipeline {state_store.pipeline_name!r} is not a completed "
            f"checkpoint (available: {kept_ids})",
            checkpoint_id=checkpoint_id,
        )
    header = heads[checkpoint_id]["enumerator"]
    if header is None:
        notes.append(f"checkpoint {checkpoint_id} has no enumerator snapshot: ownership rules see no entries")
        readers: list[int] = list(range(int(heads[checkpoint_id]["parallelism"])))
    else:
        readers = [int(r) for r in header["readers"] or ()]
    subscribed = sorted(set(subscriptions))

    enum_rows = spark.createDataFrame(history.enumerator_rows([checkpoint_id])).cache()
    # One checkpoint's enumerator state is small (one row per split): read it once.
    owned: dict[int, list[str]] = {r: [] for r in readers}
    finished_set: set[str] = set()
    for row in enum_rows.select("status", "owner", "split_id").collect():
        if row["status"] == "finished":
            finished_set.add(row["split_id"])
        elif row["status"] == "assigned" and row["owner"] is not None:
            owned.setdefault(int(row["owner"]), []).append(row["split_id"])
    # a quarantined split is live (parked at its position, read by nobody): neither lost nor duplicated
    entries = enum_rows.where(F.col("status").isin("assigned", "pool", "quarantined")).select(
        "split_id", "status", "owner", "subscription", "position", "end"
    )
    finished_ids = enum_rows.where(F.col("status") == "finished").select("split_id").distinct()
    region_splits = (
        checkpoints.where(F.col("checkpoint_id") == checkpoint_id)
        .select(F.explode("regions").alias("r"))
        .select(
            F.col("r.region_id").alias("region_id"),
            F.col("r.outcome").alias("outcome"),
            F.explode("r.splits").alias("s"),
        )
        .select(
            "region_id",
            "outcome",
            F.col("s.split_id").alias("split_id"),
            F.col("s.subscription").alias("subscription"),
            F.col("s.position").alias("position"),
        )
    )

    # -- split_places -------------------------------------------------------------------
    owner_ok = (F.col("status").isin("pool", "quarantined") & F.col("owner").isNull()) | (
        (F.col("status") == "assigned")
        & F.col("owner").isNotNull()
        & (F.col("owner").isin(readers) if readers else F.lit(False))
    )
    places_cols = [
        "split_id",
        "status",
        "owner",
        "subscription",
        "position",
        "end",
        "finished",
        "owner_consistent",
    ]
    present = entries.join(finished_ids.withColumn("_fin", F.lit(True)), "split_id", "left").select(
        "split_id",
        "status",
        "owner",
        "subscription",
        "position",
        "end",
        F.coalesce(F.col("_fin"), F.lit(False)).alias("finished"),
        owner_ok.alias("owner_consistent"),
    )
    lost = (
        region_splits.where(F.col("subscription").isin(subscribed) if subscribed else F.lit(False))
        .select("split_id", "subscription")
        .dropDuplicates(["split_id"])
        .join(entries.select("split_id"), "split_id", "left_anti")
        .join(finished_ids, "split_id", "left_anti")
        .select(
            "split_id",
            F.lit(None).cast("string").alias("status"),
            F.lit(None).cast("int").alias("owner"),
            "subscription",
            F.lit(None).cast("long").alias("position"),
            F.lit(None).cast("long").alias("end"),
            F.lit(None).cast("boolean").alias("finished"),
            F.lit(None).cast("boolean").alias("owner_consistent"),
        )
    )
    split_places = present.select(places_cols).unionByName(lost.select(places_cols))

    # -- sink_records -------------------------------------------------------------------
    sink, sink_exists = _sink_frame(spark, sink_path)
    if not sink_exists:
        notes.append(f"no sink table at {os.fspath(sink_path)} yet: the sink is checked as empty")
    later = sink.where(F.col("epoch") > checkpoint_id).count() if sink_exists else 0
    if later:
        notes.append(
            f"the sink holds {later} record(s) of epochs after checkpoint {checkpoint_id}; they are not "
            "part of this checkpoint and not checked (a newer checkpoint, or a commit whose checkpoint "
            "row recovery will write)"
        )
    sink = sink.where(F.col("epoch") <= checkpoint_id)
    life = read_split_life(state_store, checkpoint_id)
    lost_note = life.note()
    if lost_note:
        notes.append(lost_note)
    gaps = spark.createDataFrame(life.gap_rows(), "split_id STRING, _gap_start BIGINT, _gap_end BIGINT").hint(
        "broadcast"
    )
    following = Window.partitionBy("split_id").orderBy("offset").rangeBetween(1, Window.unboundedFollowing)
    sink_records = sink.select("split_id", "offset", "next_offset", "epoch", "region").withColumn(
        "following_offset", F.min("offset").over(following)
    )
    if life.lost:  # a record followed by a reported lost range: the next record comes after the gap
        sink_records = sink_records.join(
            gaps.withColumnRenamed("_gap_start", "next_offset"), ["split_id", "next_offset"], "left"
        ).withColumn("resumes_at", F.coalesce(F.col("_gap_end"), F.col("next_offset")))
        sink_records = sink_records.drop("_gap_end")
    else:
        sink_records = sink_records.withColumn("resumes_at", F.col("next_offset"))

    # -- sink_splits --------------------------------------------------------------------
    per_split = sink.groupBy("split_id").agg(
        F.count(F.lit(1)).alias("records"),
        F.min("offset").alias("first_offset"),
        F.max_by("next_offset", "offset").alias("last_next_offset"),
    )
    src_schema = StructType(
        [
            StructField("split_id", StringType(), False),
            StructField("src_start", LongType(), True),
            StructField("src_end", LongType(), True),
        ]
    )
    source_rows = [] if source_splits is None else [(s.split_id, s.position, s.end) for s in source_splits]
    given = {sid for sid, _start, _end in source_rows}
    source_rows += [(sid, start, None) for sid, start in sorted(life.starts.items()) if sid not in given]
    # the start the sink must begin at: where the split was discovered, past a loss reported there
    source_rows = [
        (sid, life.resume(sid, life.starts.get(sid, start)), end) for sid, start, end in source_rows
    ]
    source = spark.createDataFrame(source_rows, src_schema).dropDuplicates(["split_id"])
    if source_splits is None:
        notes.append(
            "no source splits given: every split's start position is taken as 0, and finished splits are "
            "checked for duplicates and gaps but not for ending at the source's end"
        )
    by_ack = Window.partitionBy("split_id").orderBy(F.desc(F.col("outcome") == "ack"), F.desc("position"))
    region_pos = (
        region_splits.withColumn("_rank", F.row_number().over(by_ack))
        .where(F.col("_rank") == 1)
        .select("split_id", F.col("position").alias("_region_pos"))
    )
    entry_pos = entries.groupBy("split_id").agg(
        F.max("position").alias("_entry_pos"),
        F.max(F.col("status") == "quarantined").alias("_parked"),
    )
    live = (
        entry_pos.join(region_pos, "split_id", "full_outer")
        .join(finished_ids, "split_id", "left_anti")
        .select(
            "split_id",
            F.when(F.col("_parked"), F.lit("quarantined")).otherwise(F.lit("live")).alias("state"),
            F.coalesce(F.col("_region_pos"), F.col("_entry_pos")).alias("_committed"),
        )
    )
    finished_state = finished_ids.join(source, "split_id", "left").select(
        "split_id", F.lit("finished").alias("state"), F.col("src_end").alias("_committed")
    )
    audit = spark.createDataFrame(
        history.committed_audit(checkpoint_id, _DROPPED_DECISIONS).select(["split_id"])
    )
    dropped = (
        audit.select("split_id")
        .distinct()
        .join(live.select("split_id"), "split_id", "left_anti")
        .join(finished_ids, "split_id", "left_anti")
        .select("split_id", F.lit("dropped").alias("state"), F.lit(None).cast("long").alias("_committed"))
    )
    expected = live.unionByName(finished_state).unionByName(dropped)
    start = F.coalesce(F.col("src_start"), F.lit(0).cast("long"))
    sink_splits = (
        per_split.join(expected, "split_id", "full_outer")
        .join(source.select("split_id", "src_start"), "split_id", "left")
        .select(
            "split_id",
            "state",
            F.coalesce(F.col("records"), F.lit(0).cast("long")).alias("records"),
            F.coalesce(F.col("first_offset"), start).alias("first_offset"),
            F.coalesce(F.col("last_next_offset"), start).alias("last_next_offset"),
            start.alias("start_position"),
            F.col("_committed").alias("committed_position"),
            F.col("state").isNotNull().alias("known"),
        )
        # a reported lost range right after the last record: the committed position is past it
        .join(
            gaps.withColumnRenamed("_gap_start", "last_next_offset"), ["split_id", "last_next_offset"], "left"
        )
        .withColumn("last_resumes_at", F.coalesce(F.col("_gap_end"), F.col("last_next_offset")))
        .drop("_gap_end")
    )
    content = (
        _content_rows(content_reader, source_rows, finished_set, life)
        if content_reader is not None and source_splits is not None
        else []
    )
    if content:
        wanted = spark.createDataFrame(
            content, "split_id STRING, _want_records BIGINT, _want_hash STRING"
        ).hint("broadcast")
        by_offset = F.array_sort(F.collect_list(F.struct("offset", "value")))
        got = (
            sink.join(wanted.select("split_id"), "split_id", "left_semi")
            .groupBy("split_id")
            .agg(
                F.count(F.lit(1)).alias("_got_records"),
                F.sha2(F.concat_ws("\n", F.transform(by_offset, lambda r: r["value"])), 256).alias(
                    "_got_hash"
                ),
            )
        )
        matches = wanted.join(got, "split_id", "left").select(
            "split_id",
            (
                (F.coalesce(F.col("_got_records"), F.lit(0).cast("long")) == F.col("_want_records"))
                & (F.coalesce(F.col("_got_hash"), F.sha2(F.lit(""), 256)) == F.col("_want_hash"))
            ).alias("content_matches"),
        )
        sink_splits = sink_splits.join(matches, "split_id", "left")
    else:
        sink_splits = sink_splits.withColumn("content_matches", F.lit(None).cast("boolean"))
    if source_splits is not None:
        ends = {split_id for split_id, _start, end in source_rows if end is not None}
        unchecked = sorted(finished_set - ends)
        if unchecked:
            notes.append(
                f"{len(unchecked)} finished split(s) have no bounded end among the source splits given, so "
                f"their last position is not checked: {_short(unchecked)}"
            )

    # -- reader_loads -------------------------------------------------------------------
    loads_schema = StructType(
        [
            StructField("reader_id", IntegerType(), False),
            StructField("splits", IntegerType(), False),
            StructField("load", DoubleType(), False),
            StructField("imbalance", DoubleType(), False),
            StructField("allowed", DoubleType(), False),
        ]
    )
    reader_loads = spark.createDataFrame(_reader_rows(owned, strategy), loads_schema)

    # -- region_refs --------------------------------------------------------------------
    ref = F.col("ref_checkpoint_id")
    region_refs = (
        checkpoints.where(F.col("checkpoint_id") <= checkpoint_id)
        .select("checkpoint_id", F.explode_outer("regions").alias("r"))
        .select(
            "checkpoint_id",
            F.col("r.region_id").alias("region_id"),
            F.col("r.outcome").alias("outcome"),
            F.col("r.ref_checkpoint_id").alias("ref_checkpoint_id"),
            F.col("r.ref_depth").alias("ref_depth"),
            F.explode_outer("r.splits").alias("s"),
        )
        .select(
            "checkpoint_id",
            "region_id",
            "outcome",
            "ref_checkpoint_id",
            "ref_depth",
            F.col("s.split_id").alias("split_id"),
            F.when(ref.isNull(), F.lit(None).cast(BooleanType()))
            .otherwise(ref.isin(kept_ids))
            .alias("ref_kept"),
            F.when(ref.isNull(), F.lit(None).cast(BooleanType()))
            .otherwise(ref < F.col("checkpoint_id"))
            .alias("ref_earlier"),
        )
    )

    frames = {
        "split_places": split_places,
        "sink_records": sink_records,
        "sink_splits": sink_splits,
        "reader_loads": reader_loads,
        "region_refs": region_refs,
    }
    for frame in frames.values():
        frame.cache()
    return RestartFrames(
        checkpoint_id=checkpoint_id,
        frames=frames,
        notes=tuple(notes),
        loads={r: len(s) for r, s in owned.items()},
        cached=(checkpoints, enum_rows),
    )


# ---------------------------------------------------------------------------------------
# Running the suites
# ---------------------------------------------------------------------------------------


def _context(data_docs_dir: Path) -> Any:
    """An ephemeral GE context (no analytics, no progress bars) with one local Data Docs site."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        data_docs_sites={
            DATA_DOCS_SITE: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(data_docs_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    return gx.get_context(mode="ephemeral", project_config=config)


def _exception_text(info: Any) -> str:
    """GE's exception_info is one dict or a dict of dicts (per metric); the first message raised."""
    if not isinstance(info, dict):
        return ""
    candidates = [info, *[v for v in info.values() if isinstance(v, dict)]]
    for item in candidates:
        if item.get("raised_exception"):
            return str(item.get("exception_message") or "an exception")
    return ""


def _target(kwargs: Mapping[str, Any]) -> str:
    if "column" in kwargs:
        return str(kwargs["column"])
    if "column_list" in kwargs:
        return ", ".join(kwargs["column_list"])
    if "column_A" in kwargs:
        return f"{kwargs['column_A']}, {kwargs['column_B']}"
    return ""


def _outcome_of(result: Any, spec: SuiteSpec) -> ExpectationOutcome:
    config = result.expectation_config
    meta = config.meta or {}
    details = result.result or {}
    rows = details.get("unexpected_index_list")
    truncated = False
    if rows is None:
        rows = details.get("partial_unexpected_index_list") or []
        truncated = (
            bool(details.get("unexpected_count", 0)) and spec.result_format["result_format"] == "SUMMARY"
        )
    rows = [r for r in rows if isinstance(r, dict)]

    def values(column: str) -> list[Any]:
        return [r[column] for r in rows if r.get(column) is not None]

    error = _exception_text(result.exception_info)
    return ExpectationOutcome(
        expectation=str(config.type),
        target=_target(config.kwargs),
        rule=str(meta.get("rule", "")),
        description=str(getattr(config, "description", None) or ""),
        success=bool(result.success) and not error,
        unexpected_count=int(details.get("unexpected_count") or 0),
        split_ids=tuple(sorted({str(v) for v in values("split_id")})),
        reader_ids=tuple(sorted({int(v) for v in values("reader_id")})),
        checkpoint_ids=tuple(sorted({int(v) for v in values("checkpoint_id")})),
        truncated=truncated and len(rows) < int(details.get("unexpected_count") or 0),
        error=error,
    )


def run_restart_checks(
    spark: SparkSession,
    state_store: DeltaStateStore,
    sink_path: str | os.PathLike[str],
    *,
    checkpoint_id: int | None = None,
    strategy: str | AssignmentStrategy,
    max_consecutive_failures: int,
    subscriptions: Collection[str],
    data_docs_dir: str | os.PathLike[str],
    source_splits: Iterable[Split] | None = None,
    expectations: str | os.PathLike[str] | None = None,
    content_reader: RegionReader | None = None,
) -> CheckReport:
    """Run every protocol section 6 suite on checkpoint ``checkpoint_id`` (default: the latest) and its sink.

    ``strategy`` is the pipeline's assignment strategy (a registry name, or the instance
    with its weights); the balance suite is SKIPPED for an unbalanced one (legacy-hash),
    with a note saying so. ``subscriptions`` are the current subscriptions (what the
    source has now). ``data_docs_dir`` receives the Data Docs site (``index.html``).
    ``source_splits``, ``content_reader``: see :func:`build_restart_frames`. ``expectations`` overrides the
    suites folder. Returns the report; never raises on a failed expectation (call
    :func:`raise_on_failure`). CheckpointError when there is no such checkpoint.
    """
    if isinstance(max_consecutive_failures, bool) or not isinstance(max_consecutive_failures, int):
        raise InvalidParameterError("max_consecutive_failures", max_consecutive_failures, "an integer >= 0")
    if max_consecutive_failures < 0:
        raise InvalidParameterError("max_consecutive_failures", max_consecutive_failures, "an integer >= 0")
    if isinstance(subscriptions, str):
        raise InvalidParameterError("subscriptions", subscriptions, "a collection of subscription names")
    chosen = resolve_strategy(strategy)
    specs = load_suite_specs(expectations)
    if checkpoint_id is None:
        ids = state_store.ids()
        if not ids:
            raise CheckpointError(
                f"pipeline {state_store.pipeline_name!r} has no completed checkpoint to check "
                f"(state at {state_store.root})",
                checkpoint_id=None,
            )
        checkpoint_id = ids[-1]
    if isinstance(chosen, WeightedStrategy):
        # weigh the loads as the driver did: the weights the checkpoint recorded (measured throughput)
        recorded = state_store.history.split_weights(checkpoint_id)
        if recorded:
            chosen = WeightedStrategy(
                weights=recorded,
                capacities=chosen.capacities,
                default_weight=chosen.default_weight,
                default_capacity=chosen.default_capacity,
            )
    docs_dir = Path(data_docs_dir).resolve()
    docs_dir.mkdir(parents=True, exist_ok=True)

    import great_expectations as gx
    from great_expectations.core.run_identifier import RunIdentifier

    frames = build_restart_frames(
        spark,
        state_store,
        sink_path,
        checkpoint_id,
        strategy=chosen,
        subscriptions=subscriptions,
        source_splits=source_splits,
        content_reader=content_reader,
    )
    parameters = {
        "subscriptions": sorted(set(subscriptions)),
        "max_consecutive_failures": max_consecutive_failures,
    }
    run_id = RunIdentifier(run_name=f"{state_store.pipeline_name}-checkpoint-{checkpoint_id}")
    outcomes: list[SuiteOutcome] = []
    try:
        context = _context(docs_dir)
        source = context.data_sources.add_spark(name="splitkeeper", persist=False)
        batches: dict[str, Any] = {}
        for key, spec in specs.items():
            frame = frames.frames[spec.dataset]
            if key == "balance" and not chosen.balanced:
                outcomes.append(
                    SuiteOutcome(
                        key=key,
                        name=spec.name,
                        status=SuiteStatus.SKIPPED,
                        dataset=spec.dataset,
                        rows=len(frames.loads),
                        notes=(
                            f"strategy {chosen.name} is not balanced (protocol rule 1.6: kept to show its "
                            f"skew): per-reader load is not checked; loads "
                            f"{dict(sorted(frames.loads.items()))}",
                        ),
                    )
                )
                continue
            if spec.dataset not in batches:
                asset = source.add_dataframe_asset(name=spec.dataset)
                batches[spec.dataset] = asset.add_batch_definition_whole_dataframe(f"{spec.dataset}-all")
            suite = context.suites.add(spec.to_suite())
            definition = context.validation_definitions.add(
                gx.ValidationDefinition(
                    name=f"{key}-checkpoint-{checkpoint_id}", data=batches[spec.dataset], suite=suite
                )
            )
            result = definition.run(
                batch_parameters={"dataframe": frame},
                expectation_parameters=parameters,
                result_format=spec.result_format,
                run_id=run_id,
            )
            expectations_out = tuple(_outcome_of(r, spec) for r in result.results)
            failed = any(not e.success for e in expectations_out)
            notes: tuple[str, ...] = ()
            if key == "balance":
                bound = (
                    "weighted bound" if isinstance(chosen, WeightedStrategy) else f"within {COUNT_TOLERANCE}"
                )
                notes = (f"strategy {chosen.name}: {bound}; loads {dict(sorted(frames.loads.items()))}",)
            outcomes.append(
                SuiteOutcome(
                    key=key,
                    name=spec.name,
                    status=SuiteStatus.FAILED if failed else SuiteStatus.PASSED,
                    dataset=spec.dataset,
                    rows=max(
                        (int((r.result or {}).get("element_count") or 0) for r in result.results), default=0
                    ),
                    expectations=expectations_out,
                    notes=notes,
                )
            )
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
    finally:
        frames.unpersist()
    index = docs_dir / "index.html"
    return CheckReport(
        pipeline=state_store.pipeline_name,
        checkpoint_id=checkpoint_id,
        strategy=chosen.name,
        suites=tuple(outcomes),
        data_docs_index=index if index.is_file() else None,
        notes=frames.notes,
    )
