"""The restart checks: protocol section 6 as Great Expectations suites on the Delta state and the sink.

Who calls it: the Airflow validate task and ``splitkeeper validate``, on the driver,
after a pipeline (re)started or ran epochs: :func:`run_restart_checks` then
:func:`raise_on_failure`. It only reads (the state tables, the sink table) and writes
the Data Docs site under the folder the caller gives; it may be called any number of
times, also while no pipeline runs.

How: every rule is decided by :mod:`splitkeeper.core.invariants`, the module the
simulator checks with, on plain values built from the checked checkpoint's state (read
through :class:`~splitkeeper.delta.history.StateHistory`, Arrow tables, on the driver) and
from a per-split summary of the sink (islands, duplicates; ONE Spark query, :func:`scan_sink`,
of which only one row per split reaches the driver; no Spark session starts when the sink
has no data file) (:func:`build_restart_frames`). The Great Expectations suites (the JSON
files in ``expectations/``, see ``expectations/README.md``) are the report: each runs on a
dataset that carries the core's verdicts, one column per rule (NULL when the rule holds),
and expects those columns to be NULL; they never re-decide a rule. The datasets are small
(one row per split, reader, region): GE runs on pandas frames of them (each written to a
parquet file of a run's temporary folder, indexed by its suite's index columns, so every suite
has its own batch). The suites run as ONE ``gx.Checkpoint`` of an ephemeral GE context, with a
COMPLETE result format that lists the offending rows by their index columns; its actions are
``UpdateDataDocsAction`` (the Data Docs site) and the pipeline's own (``checks.actions``:
:func:`resolve_actions`).
:class:`CheckReport` also carries the core's violations themselves: a verdict no
expectation reported (a suite file edited to drop it) still fails the report.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import tempfile
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper import resources
from splitkeeper.core.assignment import AssignmentStrategy, WeightedStrategy, strategy_by_name
from splitkeeper.core.invariants import (
    COUNT_TOLERANCE,
    SinkSplitSummary,
    Violation,
    ViolationKind,
    check_balance,
    check_content,
    check_finished_not_assigned,
    check_ownership,
    check_region_ref,
    check_subscriptions,
    content_digest,
    judge_sink_split,
    merge_spans,
    ref_chain_depths,
    region_chain_depth,
)
from splitkeeper.core.source import RegionReader
from splitkeeper.core.types import (
    DISCOVERED_DETAIL_PATTERN,
    AuditRecord,
    EnumeratorSnapshot,
    RecoveryDecision,
    Split,
)
from splitkeeper.errors import (
    CheckpointError,
    ConfigError,
    EnvironmentNotReadyError,
    InvalidParameterError,
    InvariantViolation,
)
from splitkeeper.sinks.port import SinkReader, SinkTable

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.records.upsert import UpsertSpec

__all__ = [
    "ENV_EXPECTATIONS_DIR",
    "FOLD_SUITE",
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
    "resolve_actions",
    "run_restart_checks",
]

log = logging.getLogger(__name__)

#: Overrides where the suite JSON files are read from (default: ``<checkout>/expectations``).
ENV_EXPECTATIONS_DIR = resources.EXPECTATIONS_DIR_ENV

#: The suites, by file stem, in the order they run and are reported.
SUITES: tuple[str, ...] = ("ownership", "lifecycle", "sink_records", "sink_splits", "balance", "ref_chains")

#: The suite of an upsert sink (``sink.mode: upsert``): its keyed table is the fold of its change table
#: (:mod:`splitkeeper.quality.upsert`; runs on Spark, after :data:`SUITES`).
FOLD_SUITE = "upsert_fold"

#: The datasets the suites run on (``meta.splitkeeper.dataset`` of each suite file).
DATASETS: tuple[str, ...] = (
    "split_places",
    "sink_records",
    "sink_splits",
    "reader_loads",
    "region_refs",
    "upsert_fold",
)

DATA_DOCS_SITE = "splitkeeper"
#: Every validation's result is kept in a folder beside the Data Docs (``<data_docs>_validations``:
#: GE's validation results store on the file system), so the site's index lists every validation,
#: not only the last one; the latest KEEP_VALIDATIONS per suite are kept (older ones, and their
#: pages, are removed before the next checkpoint run, to bound the disk the history takes).
VALIDATIONS_SUFFIX = "_validations"
KEEP_VALIDATIONS = 50

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
    keys: tuple[str, ...] = ()  # the offending keys (the upsert fold suite)
    details: tuple[str, ...] = ()  # the first verdicts of the offending rows (the core's sentences)

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
        if self.keys:
            parts.append("keys " + _short(self.keys))
        if self.truncated:
            parts.append("(a sample: see Data Docs)")
        if self.details:
            parts.append("first: " + " | ".join(self.details))
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
    found: tuple[Violation, ...] = ()  # the core's violations, whatever the suites reported

    @property
    def unreported(self) -> tuple[Violation, ...]:
        """The core's violations of a rule no failed expectation reports (a suite lost its expectation)."""
        reported = {e.rule for s in self.suites for e in s.failed}
        skipped = {"unbalanced", "weight_unbalanced"} if self._balance_skipped else set()
        return tuple(v for v in self.found if v.kind.value not in reported | skipped)

    @property
    def _balance_skipped(self) -> bool:
        return any(s.key == "balance" and s.status is SuiteStatus.SKIPPED for s in self.suites)

    @property
    def success(self) -> bool:
        return all(s.success for s in self.suites) and not self.unreported

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
        return tuple(
            sorted(
                {x for s in self.suites for x in s.split_ids}
                | {x for v in self.unreported for x in v.split_ids}
            )
        )

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
        lines.extend(f"  not reported by a suite: {v}" for v in self.unreported)
        if self.data_docs_index is not None:
            lines.append(f"  Data Docs: {self.data_docs_index}")
        return "\n".join(lines)

    def violations(self) -> tuple[Violation, ...]:
        """The failed expectations as core violations (kind, offending split ids, sentence)."""
        found: list[Violation] = []
        for s in self.suites:
            for e in s.failed:
                found.append(Violation(_violation_kind(e.rule), e.split_ids, f"suite {s.name}: {e.line()}"))
        return (*found, *self.unreported)


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


def load_suite_specs(
    directory: str | os.PathLike[str] | None = None, keys: Sequence[str] = SUITES
) -> dict[str, SuiteSpec]:
    """Read every suite of ``keys`` (default :data:`SUITES`; :data:`FOLD_SUITE` is the upsert sink's) from
    ``directory`` (default :func:`expectations_dir`).

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
    for key in keys:
        path = folder / f"{key}.json"
        try:
            definition = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise EnvironmentNotReadyError(
                f"suite file {path} is missing (every suite of {', '.join(keys)} is required)",
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
    """The core's verdicts on one checked checkpoint, as Arrow tables keyed by dataset name.

    Every rule is decided by :mod:`splitkeeper.core.invariants`; a frame carries the inputs
    the rule saw and, per rule, a verdict column named after its :class:`ViolationKind` value
    holding the core's sentence (NULL when the rule holds). The suites expect those columns
    to be NULL, so they report the core's verdicts and never re-decide them.

    - ``split_places``: one row per split pooled, assigned or quarantined in the enumerator
      state, or held by a region but in no place (a lost split): places, owner, subscription,
      position, end; ``owned_more_than_once``, ``not_owned``, ``finished_assigned``,
      ``removed_subscription``;
    - ``sink_records``: per split with records (epochs up to the checkpoint), the records among
      themselves: records, islands, first_offset, last_next_offset; ``offset_duplicate``,
      ``offset_missing`` (between records), ``offset_unexpected`` (a record ending where it starts);
    - ``sink_splits``: per split with records or known to the checkpoint, the records against it:
      state, records, start_position, committed_position, known; ``offset_unexpected`` (unknown
      split, offsets outside its range), ``offset_missing`` (before the first / after the last
      record), ``content_mismatch``;
    - ``reader_loads``: per registered reader: splits, load; ``unbalanced``, ``weight_unbalanced``;
    - ``region_refs``: per kept checkpoint up to this one, region and split of its state:
      outcome, ref_checkpoint_id, ref_depth; ``ref_chain_too_deep``, ``ref_missing``,
      ``ref_not_earlier``.

    ``violations`` are the core's violations, all of them; ``records`` the sink records summarised.
    """

    checkpoint_id: int
    frames: dict[str, pa.Table]
    notes: tuple[str, ...] = ()
    loads: dict[int, int] = field(default_factory=dict)
    violations: tuple[Violation, ...] = ()
    records: int = 0


def resolve_strategy(strategy: str | AssignmentStrategy) -> AssignmentStrategy:
    """A strategy instance from a registry name or an instance (weights and capacities kept)."""
    if isinstance(strategy, AssignmentStrategy):
        return strategy
    if isinstance(strategy, str):
        return strategy_by_name(strategy)
    raise InvalidParameterError("strategy", strategy, "a strategy name or an AssignmentStrategy")


@dataclass(frozen=True, slots=True)
class SplitLife:
    """What the audit trail says about splits over their whole life (kept through retention).

    ``starts``: where each split started when it was discovered (the latest DISCOVERED
    record with a position). ``lost``: per split, the merged ``[start, end)`` ranges the
    pipeline skipped because the source no longer had them (SKIPPED_LOST_RANGE records,
    ``on_offset_out_of_range: skip``) or an operator skipped (``offsets reset`` forward,
    SKIPPED_BY_OPERATOR records); the only gaps the sink may have. A later operator checkpoint
    that reads the split again from an offset (a backward reset, a rewind:
    :func:`~splitkeeper.core.operator.read_again_from`) ends the gaps recorded before it there.
    """

    starts: dict[str, int] = field(default_factory=dict)
    lost: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def note(self) -> str | None:
        """One sentence naming the accepted gaps, or None when nothing was lost."""
        rows = [(sid, a, b) for sid, ranges in sorted(self.lost.items()) for a, b in ranges]
        if not rows:
            return None
        shown = [f"{sid} [{a}, {b})" for sid, a, b in rows]
        return (
            f"{sum(b - a for _s, a, b in rows)} offset(s) of {len(self.lost)} split(s) were skipped (lost to "
            "retention: SKIPPED_LOST_RANGE, on_offset_out_of_range=skip; or by an operator's offsets reset: "
            "SKIPPED_BY_OPERATOR, in the audit trail); exactly these gaps are "
            f"accepted in the sink: {_short(shown)}"
        )


def read_split_life(state_store: DeltaStateStore, checkpoint_id: int) -> SplitLife:
    """The DISCOVERED and SKIPPED_LOST_RANGE audit records up to ``checkpoint_id`` (see :class:`SplitLife`).

    The audit trail outlives retention; which rows count is the history's orphan-attempt
    rule (:meth:`splitkeeper.delta.history.StateHistory.committed_audit`).
    """
    import re

    from splitkeeper.core.operator import read_again_from, skipped_range
    from splitkeeper.core.source import LostRange

    decisions = (
        RecoveryDecision.DISCOVERED.value,
        RecoveryDecision.SKIPPED_LOST_RANGE.value,
        RecoveryDecision.SKIPPED_BY_OPERATOR.value,  # offsets reset forward (core.operator rule 4)
        RecoveryDecision.RESET_BY_OPERATOR.value,  # backward: a gap from the new offset on is read again
        RecoveryDecision.REWOUND.value,  # likewise from the split's place in the rewind's target
    )
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
        record = AuditRecord(sid, None, decision, None, detail)
        again = read_again_from(record)
        if again is not None:  # rows are in commit order: only gaps recorded before it are undone
            kept = [(a, min(b, again)) for a, b in lost.get(sid, []) if a < again]
            lost[sid] = kept
            continue
        gone = LostRange.from_audit(record)
        if gone is not None:
            lost.setdefault(sid, []).append((gone.start, gone.new_start))
        skipped = skipped_range(record)
        if skipped is not None:
            lost.setdefault(sid, []).append(skipped)
    return SplitLife(
        starts={sid: position for sid, (_order, position) in starts.items()},
        lost={sid: spans for sid, ranges in lost.items() if (spans := merge_spans(ranges))},
    )


def _content_rows(
    reader: RegionReader,
    source_rows: Sequence[tuple[str, int, int | None]],
    finished: Collection[str],
    life: SplitLife,
) -> dict[str, tuple[int, str]]:
    """split_id -> :func:`~splitkeeper.core.invariants.content_digest` (records, digest of its values in
    offset order) of each finished split with an end among the source rows, read by ``reader`` from
    its start to its end.

    Splits with a reported lost range are left out (the sink lacks exactly those records); a
    split whose data cannot be read now (gone, changed: SourceError) is left out with a
    warning: the other checks still see its offsets.
    """
    from splitkeeper.errors import SourceError

    rows: dict[str, tuple[int, str]] = {}
    for split_id, start, end in source_rows:
        if end is None or split_id not in finished or split_id in life.lost:
            continue
        split = Split(split_id, position=start, end=end)
        try:
            values = [record.value for record in reader.read_range(split, start, end)]
        except SourceError as err:
            log.warning("content check: split %s is not checked: %s", split_id, err)
            continue
        rows[split_id] = content_digest(values)
    return rows


def _verdicts(
    violations: Iterable[Violation], key: Callable[[Violation], Iterable[Any]]
) -> dict[Any, dict[str, str]]:
    """row key -> {violation kind value: the core's sentence(s)}, for the verdict columns of a frame."""
    out: dict[Any, dict[str, str]] = {}
    for v in violations:
        for k in key(v):
            cell = out.setdefault(k, {})
            cell[v.kind.value] = f"{cell[v.kind.value]}; {v.detail}" if v.kind.value in cell else v.detail
    return out


def _detail(v: Violation | None) -> str | None:
    return None if v is None else v.detail


@dataclass(frozen=True, slots=True)
class SinkScan:
    """What the one Spark query over the sink found (:func:`scan_sink`).

    ``summaries``: per split with records of epochs up to the checkpoint, the core's
    :class:`SinkSplitSummary`. ``later``: records of epochs after the checkpoint (not
    checked). ``hashes``: per split asked for that has records, the
    :func:`~splitkeeper.core.invariants.content_digest` of its values (sink values and dead
    letters' raw values) in offset order; a split missing has :data:`_NO_VALUES`.
    """

    summaries: dict[str, SinkSplitSummary] = field(default_factory=dict)
    later: int = 0
    hashes: dict[str, tuple[int, str]] = field(default_factory=dict)


#: (records, SHA-256) of a split without records in the sink.
_NO_VALUES = content_digest(())


def scan_sink(
    sink: DataFrame,
    checkpoint_id: int,
    content_ids: Collection[str] = (),
    dead: DataFrame | None = None,
    filtered: DataFrame | None = None,
) -> SinkScan:
    """Summarise the sink's records per split in ONE Spark query, of which only one row per split
    reaches the driver (``collect``); see :class:`SinkScan`.

    With ``dead`` (the dead-letter table's frame) the query reads the sink and the dead letters
    together (a union, the same one shuffle): the islands are of both, the duplicates are offsets
    covered twice within one table, the overlaps offsets covered by both (running maxima of the
    sink's and of the dead letters' ``next_offset`` over the offset order tell them apart).

    Gaps and islands over each split's records ordered by offset (a window partitioned by split:
    the one shuffle), then an aggregation per island and one per split on that partitioning. Records
    of epochs after ``checkpoint_id`` are counted, and take no other part. Duplicate spans and
    malformed offsets are kept to their first 1000 per split. The values are read only for the
    splits of ``content_ids`` (the content check), as bytes (a string value's UTF-8 bytes): the
    content check needs a sink with a ``value`` column (raw or text); for a typed sink the caller
    passes none and only the offsets are checked.

    With ``filtered`` (the ``filtered_offsets`` table's frame: ``split_id, start_offset, end_offset,
    epoch``) each range a Spark transform dropped is one more row of the union, covering
    ``[start_offset, end_offset)``: a third side, so an offset both filtered and a record or a dead
    letter is a filtered overlap, a range twice a duplicate. Without it the query is as before."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    offset, nxt, before = F.col("offset"), F.col("next_offset"), F.col("_before")
    is_dead = F.col("_dead")
    checked = F.col("epoch") <= checkpoint_id
    valid = checked & (nxt > offset)
    ordered = Window.partitionBy("split_id").orderBy("offset", "next_offset")
    content = sorted(content_ids)
    columns = ["split_id", "offset", "next_offset", "epoch"]

    is_filtered = F.col("_filtered") if filtered is not None else F.lit(False)
    is_record = ~is_dead & ~is_filtered

    def side(frame: DataFrame, dead_side: bool) -> DataFrame:
        picked = [F.col(c) for c in columns]
        if content:
            picked.append(F.col("value").cast("binary").alias("value"))
        marks = [F.lit(dead_side).alias("_dead")]
        if filtered is not None:
            marks.append(F.lit(False).alias("_filtered"))
        return frame.select(*picked, *marks)

    union = side(sink, False)
    if dead is not None:
        union = union.unionByName(side(dead, True))
    if filtered is not None:
        ranges = filtered.select(
            "split_id",
            F.col("start_offset").alias("offset"),
            F.col("end_offset").alias("next_offset"),
            "epoch",
            *([F.lit(None).cast("binary").alias("value")] if content else []),
            F.lit(False).alias("_dead"),
            F.lit(True).alias("_filtered"),
        )
        union = union.unionByName(ranges)
    preceding = ordered.rowsBetween(Window.unboundedPreceding, -1)
    rows = union.select(
        *columns,
        "_dead",
        *(["_filtered"] if filtered is not None else []),
        *(["value"] if content else []),
        F.max(F.when(valid, nxt)).over(preceding).alias("_before"),
        F.max(F.when(valid & is_record, nxt)).over(preceding).alias("_before_sink"),
        F.max(F.when(valid & is_dead, nxt)).over(preceding).alias("_before_dead"),
        *(
            [F.max(F.when(valid & is_filtered, nxt)).over(preceding).alias("_before_filtered")]
            if filtered is not None
            else []
        ),
    )
    rows = rows.withColumn(
        "_island",
        F.sum((valid & (before.isNull() | (offset > before))).cast("long")).over(
            ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    )
    same = F.when(is_dead, F.col("_before_dead")).otherwise(F.col("_before_sink"))
    other = F.when(is_dead, F.col("_before_sink")).otherwise(F.col("_before_dead"))
    if filtered is not None:
        same = F.when(is_filtered, F.col("_before_filtered")).otherwise(same)
        other = F.when(is_filtered, F.lit(None)).otherwise(other)
        # a filtered range against a record or dead letter before it, and a record or dead letter
        # against a filtered range before it (greatest skips NULLs)
        beside = F.when(is_filtered, F.greatest(F.col("_before_sink"), F.col("_before_dead"))).otherwise(
            F.col("_before_filtered")
        )
    dup = F.when(valid & (offset < same), F.struct(offset.alias("a"), F.least(nxt, same).alias("b")))
    cross = F.when(valid & (offset < other), F.struct(offset.alias("a"), F.least(nxt, other).alias("b")))
    island_aggs = [
        F.min(F.when(valid, offset)).alias("a"),
        F.max(F.when(valid, nxt)).alias("b"),
        F.count(F.when(checked & ~is_filtered, F.lit(1))).alias("records"),
        F.count(F.when(checked & is_dead, F.lit(1))).alias("dead"),
        F.count(F.when(~checked & ~is_filtered, F.lit(1))).alias("later"),
        F.collect_list(dup).alias("dups"),
        F.collect_list(cross).alias("cross"),
        F.collect_list(F.when(checked & (nxt <= offset), offset)).alias("bad"),
    ]
    split_aggs = [
        F.sum("records").alias("records"),
        F.sum("dead").alias("dead"),
        F.sum("later").alias("later"),
        F.array_sort(F.collect_list(F.when(F.col("a").isNotNull(), F.struct("a", "b")))).alias("islands"),
        F.slice(F.array_sort(F.flatten(F.collect_list("dups"))), 1, 1000).alias("duplicates"),
        F.slice(F.array_sort(F.flatten(F.collect_list("cross"))), 1, 1000).alias("overlaps"),
        F.slice(F.array_sort(F.flatten(F.collect_list("bad"))), 1, 1000).alias("malformed"),
    ]
    if filtered is not None:
        fcross = F.when(
            valid & (offset < beside), F.struct(offset.alias("a"), F.least(nxt, beside).alias("b"))
        )
        island_aggs += [
            F.count(F.when(checked & is_filtered, F.lit(1))).alias("filtered"),
            F.collect_list(fcross).alias("fcross"),
        ]
        split_aggs += [
            F.sum("filtered").alias("filtered"),
            F.slice(F.array_sort(F.flatten(F.collect_list("fcross"))), 1, 1000).alias("filtered_overlaps"),
        ]
    if content:
        wanted = checked & ~is_filtered & F.col("split_id").isin(content)
        island_aggs.append(
            F.collect_list(F.when(wanted, F.struct(offset, is_dead, F.col("value")))).alias("vals")
        )
        by_offset = F.array_sort(F.flatten(F.collect_list("vals")))
        digests = F.transform(by_offset, lambda r: F.coalesce(F.sha2(r["value"], 256), F.lit("null")))
        split_aggs.append(F.sha2(F.concat_ws("", digests), 256).alias("h"))
    found = (
        rows.groupBy("split_id", "_island").agg(*island_aggs).groupBy("split_id").agg(*split_aggs).collect()
    )

    def spans(items: Any) -> tuple[tuple[int, int], ...]:
        return tuple((int(x["a"]), int(x["b"])) for x in items or ())

    return SinkScan(
        summaries={
            r["split_id"]: SinkSplitSummary(
                r["split_id"],
                int(r["records"]),
                spans(r["islands"]),
                spans(r["duplicates"]),
                tuple(int(o) for o in r["malformed"] or ()),
                dead_letters=int(r["dead"] or 0),
                overlaps=merge_spans(spans(r["overlaps"])),
                filtered=int(r["filtered"] or 0) if filtered is not None else 0,
                filtered_overlaps=(
                    merge_spans(spans(r["filtered_overlaps"])) if filtered is not None else ()
                ),
            )
            for r in found
            if r["records"] or (filtered is not None and r["filtered"])
        },
        later=sum(int(r["later"]) for r in found),
        hashes={
            r["split_id"]: (int(r["records"]), str(r["h"]))
            for r in found
            if content and r["split_id"] in content
        },
    )


# Column name and pyarrow type factory of each verdict table (pyarrow is imported when a table is
# built: the base install, without pyarrow, still reads the suites).
_STR, _INT, _BIGINT = "string", "int32", "int64"
_PLACES_SCHEMA = (
    ("split_id", _STR),
    ("status", _STR),
    ("places", _STR),
    ("owner", _INT),
    ("subscription", _STR),
    ("position", _BIGINT),
    ("end", _BIGINT),
    ("owned_more_than_once", _STR),
    ("not_owned", _STR),
    ("finished_assigned", _STR),
    ("removed_subscription", _STR),
)
_SINK_RECORDS_SCHEMA = (
    ("split_id", _STR),
    ("records", _BIGINT),
    ("dead_letters", _BIGINT),
    ("filtered_ranges", _BIGINT),
    ("islands", _INT),
    ("first_offset", _BIGINT),
    ("last_next_offset", _BIGINT),
    ("offset_duplicate", _STR),
    ("offset_missing", _STR),
    ("offset_unexpected", _STR),
    ("dead_letter_overlap", _STR),
    ("filtered_overlap", _STR),
)
_SINK_SPLITS_SCHEMA = (
    ("split_id", _STR),
    ("state", _STR),
    ("records", _BIGINT),
    ("start_position", _BIGINT),
    ("committed_position", _BIGINT),
    ("known", "bool_"),
    ("offset_unexpected", _STR),
    ("offset_missing", _STR),
    ("content_mismatch", _STR),
)
_LOADS_SCHEMA = (
    ("reader_id", _INT),
    ("splits", _INT),
    ("load", "float64"),
    ("unbalanced", _STR),
    ("weight_unbalanced", _STR),
)
_REFS_SCHEMA = (
    ("checkpoint_id", _BIGINT),
    ("region_id", _INT),
    ("outcome", _STR),
    ("ref_checkpoint_id", _BIGINT),
    ("ref_depth", _INT),
    ("split_id", _STR),
    ("ref_chain_too_deep", _STR),
    ("ref_missing", _STR),
    ("ref_not_earlier", _STR),
)


def _table(rows: Sequence[Sequence[Any]], spec: Sequence[tuple[str, str]]) -> pa.Table:
    """An Arrow table of the columns ``spec`` names from row tuples in its column order."""
    import pyarrow as pa

    schema = pa.schema([(name, getattr(pa, kind)()) for name, kind in spec])
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    return pa.Table.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
    )


def build_restart_frames(
    spark: SparkSession | Callable[[], SparkSession],
    state_store: DeltaStateStore,
    sink: SinkReader,
    checkpoint_id: int,
    *,
    strategy: AssignmentStrategy,
    subscriptions: Collection[str],
    max_consecutive_failures: int,
    source_splits: Iterable[Split] | None = None,
    content_reader: RegionReader | None = None,
) -> RestartFrames:
    """Run the core's section 6 checks on checkpoint ``checkpoint_id`` and the sink; return the
    verdicts as the suites' datasets (see :class:`RestartFrames`), small Arrow tables.

    The state is read through :class:`~splitkeeper.delta.history.StateHistory` (Arrow tables,
    turned into the core's values: the enumerator snapshot, the regions' refs and positions) on
    the driver, without Spark. The sink is summarised per split by one Spark query
    (:func:`scan_sink`); ``spark`` is the session or a function returning it, called only when
    the sink table has data files (no session starts for a missing or empty sink). ``source_splits``
    are the splits as the source has them (at their initial position): their position is the
    start the sink must begin at (default 0), and a finished bounded split must end at its
    ``end``. Where the audit trail recorded the position a split was discovered at, that
    position is its start instead (a source with retention, Kafka, no longer knows it).
    Offsets the pipeline reported as lost (:class:`SplitLife`) are the only gaps accepted.
    With ``content_reader`` (the source's region reader) each finished split among
    ``source_splits`` is read from its start to its end and compared with the sink's count
    and digest of its values in offset order (:func:`~splitkeeper.core.invariants.check_content`).
    ``sink`` reads the pipeline's sink (:class:`~splitkeeper.sinks.port.SinkReader`): its records
    table (:attr:`~splitkeeper.sinks.port.SinkTable.RECORDS`: an upsert sink's change table, the
    keyed table is not the log). With dead letters (``errors.tolerance: all``) the sink and the
    dead-letter table are checked TOGETHER, in the same one query: their offsets cover each split's
    range once, an offset in both is DEAD_LETTER_OVERLAP, and the content is the sink's values and
    the dead letters' raw values in offset order (a typed sink, without a ``value`` column, is
    checked on offsets only).
    With filtered offsets (the ``filtered_offsets`` table of a Spark transform; nothing when no table
    is there) their ranges account for offsets too, in the same query: records, dead letters and
    filtered ranges cover each split's range exactly once (an offset filtered and also a record or
    dead letter is FILTERED_OVERLAP).
    CheckpointError when ``checkpoint_id`` is not a completed checkpoint.
    """
    from splitkeeper.delta import serde

    notes: list[str] = []
    history = state_store.history
    heads = {int(r["checkpoint_id"]): r for r in history.checkpoints().to_pylist()}
    kept_ids = sorted(heads)
    if checkpoint_id not in heads:
        raise CheckpointError(
            f"checkpoint {checkpoint_id} of pipeline {state_store.pipeline_name!r} is not a completed "
            f"checkpoint (available: {kept_ids})",
            checkpoint_id=checkpoint_id,
        )
    head = heads[checkpoint_id]
    subscribed = set(subscriptions)
    found: list[Violation] = []

    # -- the enumerator state: rules 6.1, 6.2, 6.3, 6.5 --------------------------------
    if head["enumerator"] is None:
        notes.append(f"checkpoint {checkpoint_id} has no enumerator snapshot: ownership rules see no entries")
        readers = list(range(int(head["parallelism"])))
        snapshot = EnumeratorSnapshot(
            checkpoint_id, int(head["parallelism"]), assignments={r: () for r in readers}
        )
    else:
        readers = [int(r) for r in head["enumerator"]["readers"] or ()]
        snapshot = serde.enumerator_from_rows(
            head["enumerator"], history.enumerator_rows([checkpoint_id]).to_pylist()
        )
    finished = set(snapshot.finished)
    regions = list(head["regions"] or ())
    region_held = {
        s["split_id"]: s for g in regions for s in g["splits"] or () if s["subscription"] in subscribed
    }
    known_live = sorted(set(region_held) - finished)
    enumerator_found = check_ownership(snapshot, known_live, registered=readers)
    enumerator_found += check_finished_not_assigned(snapshot)
    enumerator_found += check_subscriptions(snapshot, subscribed)
    found += enumerator_found

    places: dict[str, list[tuple[str, int | None, Split]]] = {}
    for split in snapshot.pool:
        places.setdefault(split.split_id, []).append(("pool", None, split))
    for split in snapshot.quarantined:
        places.setdefault(split.split_id, []).append(("quarantined", None, split))
    for reader_id in sorted(snapshot.assignments):
        for split in snapshot.assignments[reader_id]:
            places.setdefault(split.split_id, []).append(("assigned", reader_id, split))
    verdicts = _verdicts(enumerator_found, lambda v: v.split_ids)
    place_rows = []
    for sid in sorted(set(places) | set(verdicts)):
        where = places.get(sid, [])
        held = region_held.get(sid)
        first = where[0][2] if where else None
        v = verdicts.get(sid, {})
        place_rows.append(
            (
                sid,
                where[0][0] if where else None,
                ", ".join(status if owner is None else f"reader {owner}" for status, owner, _s in where),
                where[0][1] if where else None,
                first.subscription if first else (held["subscription"] if held else None),
                first.position if first else None,
                first.end if first else None,
                v.get(ViolationKind.OWNED_MORE_THAN_ONCE.value),
                v.get(ViolationKind.NOT_OWNED.value),
                v.get(ViolationKind.FINISHED_ASSIGNED.value),
                v.get(ViolationKind.REMOVED_SUBSCRIPTION.value),
            )
        )
    split_places = _table(place_rows, _PLACES_SCHEMA)

    owned = {r: [s.split_id for s in snapshot.assignments.get(r, ())] for r in readers}
    for r, splits in snapshot.assignments.items():
        owned.setdefault(r, [s.split_id for s in splits])
    balance_found: list[Violation] = []
    if isinstance(strategy, WeightedStrategy):
        balance_found = check_balance(
            snapshot,
            readers=readers,
            weights={sid: strategy.weight(sid) for ids in owned.values() for sid in ids},
            capacities={r: strategy.capacity(r) for r in owned},
        )
    elif strategy.balanced:
        balance_found = check_balance(snapshot, readers=readers)
    found += balance_found
    by_reader = _verdicts(balance_found, lambda v: v.reader_ids)
    weight = strategy.weight if isinstance(strategy, WeightedStrategy) else (lambda _sid: 1.0)
    reader_loads = _table(
        [
            (
                r,
                len(ids),
                float(sum(weight(sid) for sid in ids)),
                by_reader.get(r, {}).get(ViolationKind.UNBALANCED.value),
                by_reader.get(r, {}).get(ViolationKind.WEIGHT_UNBALANCED.value),
            )
            for r, ids in sorted(owned.items())
        ],
        _LOADS_SCHEMA,
    )

    # -- ref chains: rule 6.6 ------------------------------------------------------------
    # one row per kept checkpoint up to this one, region and split of its state (a checkpoint
    # without regions and a region without splits keep one row, NULL where nothing is)
    refs_found: list[Violation] = []
    ref_rows: list[tuple[Any, ...]] = []
    chain_depths = ref_chain_depths(
        {
            cid: {
                int(g["ref_checkpoint_id"])
                for g in heads[cid]["regions"] or ()
                if g["ref_checkpoint_id"] is not None
            }
            for cid in kept_ids
            if cid <= checkpoint_id
        }
    )
    for cid in kept_ids:
        if cid > checkpoint_id:
            continue
        if not heads[cid]["regions"]:
            ref_rows.append((cid, None, None, None, None, None, None, None, None))
        for g in heads[cid]["regions"] or ():
            ref = g["ref_checkpoint_id"]
            region_found = check_region_ref(
                cid,
                int(g["region_id"]),
                None if ref is None else int(ref),
                region_chain_depth(None if ref is None else int(ref), chain_depths),
                kept_ids,
                max_consecutive_failures,
                (s["split_id"] for s in g["splits"] or ()),
            )
            refs_found += region_found
            v = _verdicts(region_found, lambda _v: [0]).get(0, {})
            said = (
                v.get(ViolationKind.REF_CHAIN_TOO_DEEP.value),
                v.get(ViolationKind.REF_MISSING.value),
                v.get(ViolationKind.REF_NOT_EARLIER.value),
            )
            region = (cid, g["region_id"], g["outcome"], ref, g["ref_depth"])
            ref_rows += [(*region, s["split_id"], *said) for s in g["splits"] or ()] or [
                (*region, None, *said)
            ]
    found += refs_found
    region_refs = _table(ref_rows, _REFS_SCHEMA)

    # -- the sink: rule 6.4 --------------------------------------------------------------
    files = sink.files(SinkTable.RECORDS)
    if files is None:
        notes.append(f"no sink table at {sink.location(SinkTable.RECORDS)} yet: the sink is checked as empty")
    life = read_split_life(state_store, checkpoint_id)
    source_rows = [] if source_splits is None else [(s.split_id, s.position, s.end) for s in source_splits]
    wanted = (
        _content_rows(
            content_reader,
            [(sid, life.starts.get(sid, start), end) for sid, start, end in source_rows],
            finished,
            life,
        )
        if content_reader is not None and source_splits is not None
        else {}
    )
    dead_files = sink.files(SinkTable.DEAD_LETTERS)
    filtered_files = sink.files(SinkTable.FILTERED)
    if filtered_files and wanted:
        notes.append(
            "a Spark transform filtered records out (filtered_offsets): the content check is left out, "
            "the offsets (records, dead letters and filtered ranges together) are checked"
        )
        wanted = {}
    scan = SinkScan()
    if files or dead_files or filtered_files:
        from pyspark.sql import functions as F

        session = spark() if callable(spark) else spark
        records = sink.frame(session, SinkTable.RECORDS) if files else None
        dead = sink.frame(session, SinkTable.DEAD_LETTERS) if dead_files else None
        filtered = sink.frame(session, SinkTable.FILTERED) if filtered_files else None
        if records is None and dead is not None:  # only dead letters so far: the sink's columns, no rows
            records = dead.select("split_id", "offset", "next_offset", "epoch", "value").limit(0)
        elif records is None:
            assert filtered is not None  # only filtered ranges so far
            records = filtered.select(
                "split_id",
                F.col("start_offset").alias("offset"),
                F.col("end_offset").alias("next_offset"),
                "epoch",
                F.lit(None).cast("binary").alias("value"),
            ).limit(0)
        if wanted and (
            "value" not in records.columns
            or records.schema["value"].dataType.typeName() not in ("string", "binary")
        ):
            notes.append(
                "the sink has typed columns (no raw or text value column): the content check is left out, "
                "its offsets (sink and dead letters together) are checked"
            )
            wanted = {}
        scan = scan_sink(records, checkpoint_id, wanted, dead, filtered)
    if scan.later:
        notes.append(
            f"the sink holds {scan.later} record(s) of epochs after checkpoint {checkpoint_id}; they are "
            "not part of this checkpoint and not checked (a newer checkpoint, or a commit whose "
            "checkpoint row recovery will write)"
        )
    lost_note = life.note()
    if lost_note:
        notes.append(lost_note)
    summaries, got = scan.summaries, scan.hashes
    if source_splits is None:
        notes.append(
            "no source splits given: every split's start position is taken as 0, and finished splits are "
            "checked for duplicates and gaps but not for ending at the source's end"
        )
    source_start = {sid: start for sid, start, _end in reversed(source_rows)}
    source_end = {sid: end for sid, _start, end in reversed(source_rows)}
    # a live split's committed position: its region's (an acknowledging region's first), else the
    # enumerator's
    region_pos: dict[str, tuple[bool, int]] = {}
    for g in regions:
        for s in g["splits"] or ():
            rank = (g["outcome"] == "ack", int(s["position"]))
            if s["split_id"] not in region_pos or region_pos[s["split_id"]] < rank:
                region_pos[s["split_id"]] = rank
    committed: dict[str, int | None] = {}
    state: dict[str, str] = {}
    for sid, where in places.items():
        if sid not in finished:
            committed[sid] = max(s.position for _st, _o, s in where)
            state[sid] = "quarantined" if any(st == "quarantined" for st, _o, _s in where) else "live"
    for sid, (_ack, position) in region_pos.items():
        if sid not in finished:
            committed[sid] = position
            state.setdefault(sid, "live")
    for sid in finished:
        committed[sid] = source_end.get(sid)
        state[sid] = "finished"
    dropped_rows = history.committed_audit(checkpoint_id, _DROPPED_DECISIONS).column("split_id").to_pylist()
    for sid in set(dropped_rows) - set(state):
        committed[sid] = None
        state[sid] = "dropped"
    if source_splits is not None:
        unchecked = sorted(sid for sid in finished if source_end.get(sid) is None)
        if unchecked:
            notes.append(
                f"{len(unchecked)} finished split(s) have no bounded end among the source splits given, so "
                f"their last position is not checked: {_short(unchecked)}"
            )
    record_rows = []
    split_rows = []
    for sid in sorted(set(summaries) | set(state)):
        summary = summaries.get(sid, SinkSplitSummary(sid, 0))
        start = life.starts.get(sid, source_start.get(sid, 0))
        verdict = judge_sink_split(
            summary, start, committed.get(sid), known=sid in state, lost=life.lost.get(sid, ())
        )
        content = check_content(sid, wanted[sid], got.get(sid, _NO_VALUES)) if sid in wanted else None
        found += verdict.violations() + ([content] if content is not None else [])
        if summary.records or summary.filtered:
            record_rows.append(
                (
                    sid,
                    summary.records,
                    summary.dead_letters,
                    summary.filtered,
                    len(summary.islands),
                    summary.islands[0][0] if summary.islands else None,
                    summary.islands[-1][1] if summary.islands else None,
                    _detail(verdict.duplicate()),
                    _detail(verdict.gap()),
                    _detail(verdict.bad_record()),
                    _detail(verdict.overlap()),
                    _detail(verdict.filtered_overlap()),
                )
            )
        split_rows.append(
            (
                sid,
                state.get(sid),
                summary.records,
                start,
                committed.get(sid),
                sid in state,
                _detail(verdict.unknown_or_outside()),
                _detail(verdict.unexpected_end()),
                _detail(content),
            )
        )
    sink_records = _table(record_rows, _SINK_RECORDS_SCHEMA)
    sink_splits = _table(split_rows, _SINK_SPLITS_SCHEMA)

    frames = {
        "split_places": split_places,
        "sink_records": sink_records,
        "sink_splits": sink_splits,
        "reader_loads": reader_loads,
        "region_refs": region_refs,
    }
    return RestartFrames(
        checkpoint_id=checkpoint_id,
        frames=frames,
        notes=tuple(notes),
        loads={r: len(s) for r, s in owned.items()},
        violations=tuple(found),
        records=sum(s.records for s in summaries.values()),
    )


# ---------------------------------------------------------------------------------------
# Running the suites
# ---------------------------------------------------------------------------------------


def validations_dir(data_docs_dir: Path) -> Path:
    """Where every validation result of the Data Docs at ``data_docs_dir`` is kept."""
    return data_docs_dir.with_name(data_docs_dir.name + VALIDATIONS_SUFFIX)


def _prune_validations(data_docs_dir: Path, keep: int | None = None) -> None:
    """Keep the latest ``keep`` (KEEP_VALIDATIONS) validation results per suite (by time), and the
    pages of those only."""
    keep = KEEP_VALIDATIONS if keep is None else keep
    store = validations_dir(data_docs_dir)
    if not store.is_dir():
        return
    for suite in (p for p in store.iterdir() if p.is_dir()):
        results = sorted(suite.rglob("*.json"), key=lambda p: (p.stat().st_mtime, str(p)))
        for old in results[: max(0, len(results) - keep)]:
            relative = old.relative_to(store)
            old.unlink(missing_ok=True)
            data_docs_dir.joinpath("validations", relative).with_suffix(".html").unlink(missing_ok=True)


def _write_batch(table: pa.Table, index_columns: Sequence[str], path: Path) -> tuple[Path, Any]:
    """Write ``table`` to the parquet file ``path`` as a pandas frame indexed by ``index_columns``,
    so GE names an offending row by them (its unexpected index list). A frame whose index columns
    are not unique keeps its row positions instead; that frame is returned, to read the rows back by
    position (:func:`_outcome_of`), else None."""
    frame = table.to_pandas()
    indexed = frame.set_index(list(index_columns)) if set(index_columns) <= set(frame.columns) else None
    if indexed is not None and indexed.index.is_unique:
        indexed.to_parquet(path)
        return path, None
    frame.to_parquet(path)
    return path, frame


def _context(data_docs_dir: Path) -> Any:
    """An ephemeral GE context (no analytics, no progress bars) with one local Data Docs site and a
    validation results store on the file system beside it (:func:`validations_dir`)."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    defaults = InMemoryStoreBackendDefaults(init_temp_docs_sites=False)
    defaults.stores[defaults.validation_results_store_name] = {
        "class_name": "ValidationResultsStore",
        "store_backend": {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(validations_dir(data_docs_dir)),
        },
    }
    config = DataContextConfig(
        store_backend_defaults=defaults,
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


def _outcome_of(result: Any, spec: SuiteSpec, frame: Any = None) -> ExpectationOutcome:
    """One expectation's outcome from its GE result.

    The offending rows are GE's unexpected index list: dicts of the index columns and the verdict
    (a frame indexed by the suite's index columns), or row positions in ``frame`` (a frame whose
    index columns are not unique: read back here). A SUMMARY suite ran in the checkpoint's COMPLETE
    format: its report keeps the first ``partial_unexpected_count`` rows, marked ``truncated``, as
    before (the Data Docs list them all)."""
    config = result.expectation_config
    meta = config.meta or {}
    details = result.result or {}
    column = str(config.kwargs.get("column", ""))
    rows = details.get("unexpected_index_list")
    partial = spec.result_format["result_format"] == "SUMMARY"
    if rows is None:
        rows = details.get("partial_unexpected_index_list") or []
    count = int(details.get("unexpected_count") or 0)
    if partial:
        rows = rows[: int(spec.result_format.get("partial_unexpected_count", 20))]
    if frame is not None:
        wanted = [c for c in (*spec.index_columns, column) if c in frame.columns]
        rows = [r if isinstance(r, dict) else {c: frame.iloc[int(r)][c] for c in wanted} for r in rows]
    rows = [r for r in rows if isinstance(r, dict)]

    def values(name: str) -> list[Any]:
        return [r[name] for r in rows if r.get(name) is not None]

    error = _exception_text(result.exception_info)
    return ExpectationOutcome(
        expectation=str(config.type),
        target=_target(config.kwargs),
        rule=str(meta.get("rule", "")),
        description=str(getattr(config, "description", None) or ""),
        success=bool(result.success) and not error,
        unexpected_count=count,
        split_ids=tuple(sorted({str(v) for v in values("split_id")})),
        reader_ids=tuple(sorted({int(v) for v in values("reader_id")})),
        checkpoint_ids=tuple(sorted({int(v) for v in values("checkpoint_id")})),
        keys=tuple(sorted({str(v) for v in values("key")})),
        details=tuple(dict.fromkeys(str(v) for v in values(column)))[:3],
        truncated=partial and bool(count) and len(rows) < count,
        error=error,
    )


def resolve_actions(specs: Sequence[str], key: str = "checks.actions") -> list[Any]:
    """The Great Expectations actions ``specs`` name (``checks.actions``), one fresh instance each.

    Each spec is ``'module:function'`` naming a module-level function marked
    ``@checkpoint_action`` (:mod:`splitkeeper.callables`) that returns an instance of a
    ``great_expectations.checkpoint.ValidationAction`` subclass (GX's own, e.g.
    ``SlackNotificationAction``, or the team's). ConfigError naming ``key[i]`` when a spec is not
    such a function or returns anything else.
    """
    from great_expectations.checkpoint import UpdateDataDocsAction, ValidationAction

    from splitkeeper.callables import Role, callable_error, resolve_callable

    actions: list[Any] = []
    for i, spec in enumerate(specs):
        where = f"{key}[{i}]"
        factory = resolve_callable(spec, where, Role.CHECKPOINT_ACTION)
        action = factory()
        if not isinstance(action, ValidationAction) or isinstance(action, UpdateDataDocsAction):
            got = type(action).__name__
            why = (
                "it returned an UpdateDataDocsAction: the restart checks add theirs (their Data Docs site)"
                if isinstance(action, UpdateDataDocsAction)
                else f"it returned a {got}, not an instance of a great_expectations.checkpoint."
                "ValidationAction subclass; return one, e.g. SlackNotificationAction(name=..., ...)"
            )
            raise callable_error(spec, why, where, Role.CHECKPOINT_ACTION)
        actions.append(action)
    return actions


def _checkpoint_actions(actions: Sequence[Any]) -> list[Any]:
    """The Data Docs update first (an ``UpdateDataDocsAction`` building the site once per run:
    :mod:`splitkeeper.quality.gx_actions`), then the pipeline's actions (GX runs a Data Docs update
    first anyway, so an action may link to the pages)."""
    from splitkeeper.quality.gx_actions import UpdateDataDocsOnce

    return [UpdateDataDocsOnce(name="update_data_docs", site_names=[DATA_DOCS_SITE]), *actions]


def run_restart_checks(
    spark: SparkSession | Callable[[], SparkSession],
    state_store: DeltaStateStore,
    sink: SinkReader,
    *,
    checkpoint_id: int | None = None,
    strategy: str | AssignmentStrategy,
    max_consecutive_failures: int,
    subscriptions: Collection[str],
    data_docs_dir: str | os.PathLike[str],
    source_splits: Iterable[Split] | None = None,
    expectations: str | os.PathLike[str] | None = None,
    content_reader: RegionReader | None = None,
    deferred_assignment: bool = True,
    actions: Sequence[Any] = (),
) -> CheckReport:
    """Run every protocol section 6 suite on checkpoint ``checkpoint_id`` (default: the latest) and its sink.

    ``spark``: the session, or a function returning it, called only when the sink has data to
    scan (:func:`build_restart_frames`: one Spark query); the suites run in Great Expectations on
    pandas frames of the verdicts.
    ``strategy`` is the pipeline's assignment strategy (a registry name, or the instance
    with its weights); the balance suite is SKIPPED for an unbalanced one (legacy-hash),
    with a note saying so, and for legacy readers (``deferred_assignment`` False,
    ``source.reader_mode: legacy``: they keep what they restored, so rule 6.5 does not
    bind them). ``subscriptions`` are the current subscriptions (what the
    source has now). ``data_docs_dir`` receives the Data Docs site (``index.html``).
    ``sink`` (the sink's reader), ``source_splits``, ``content_reader``: see
    :func:`build_restart_frames`.
    An upsert sink (the reader's ``upsert``: its key and deletes): the records accounted are its
    change table's (its keyed table is not the log), and
    the :data:`FOLD_SUITE` suite runs on Spark after the others: the keyed table equals the fold of
    the change table (:mod:`splitkeeper.quality.upsert`; its result is also written beside the Data
    Docs, :data:`~splitkeeper.quality.upsert.FOLD_RESULT_FILE`, for the report).
    ``expectations`` overrides the suites folder.
    The suites run as one ``gx.Checkpoint`` named ``<pipeline>-checkpoint-<id>`` (the upsert fold
    suite as a second one, ``<pipeline>-checkpoint-<id>-upsert-fold``: it runs on Spark, with its
    own result format) whose actions are an ``UpdateDataDocsAction`` and then ``actions``: instances
    of ``great_expectations.checkpoint.ValidationAction`` subclasses (a pipeline's ``checks.actions``,
    :func:`resolve_actions`), each run with the checkpoint's result whether it passed or failed; an
    action that raises fails the checks with its exception (GE's behaviour).
    Returns the report; never raises on a failed expectation (call
    :func:`raise_on_failure`). CheckpointError when there is no such checkpoint.
    """
    if isinstance(max_consecutive_failures, bool) or not isinstance(max_consecutive_failures, int):
        raise InvalidParameterError("max_consecutive_failures", max_consecutive_failures, "an integer >= 0")
    if max_consecutive_failures < 0:
        raise InvalidParameterError("max_consecutive_failures", max_consecutive_failures, "an integer >= 0")
    if isinstance(subscriptions, str):
        raise InvalidParameterError("subscriptions", subscriptions, "a collection of subscription names")
    upsert = sink.upsert
    chosen = resolve_strategy(strategy)
    specs = load_suite_specs(expectations)
    if upsert is not None:
        specs.update(load_suite_specs(expectations, (FOLD_SUITE,)))
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
        sink,
        checkpoint_id,
        strategy=chosen,
        subscriptions=subscriptions,
        max_consecutive_failures=max_consecutive_failures,
        source_splits=source_splits,
        content_reader=content_reader,
    )
    report_notes = list(frames.notes)
    found = list(frames.violations)
    if upsert is not None:
        report_notes.insert(
            0,
            f"upsert sink: the records accounted are the change table's "
            f"({sink.location(SinkTable.RECORDS)}); the keyed table ({sink.location(SinkTable.KEYED)}) is "
            f"checked by the {FOLD_SUITE} suite",
        )
    run_name = f"{state_store.pipeline_name}-checkpoint-{checkpoint_id}"
    run_id = RunIdentifier(run_name=run_name)
    checkpoint_actions = _checkpoint_actions(actions)
    context = _context(docs_dir)
    source = context.data_sources.add_pandas(name="splitkeeper")
    _prune_validations(docs_dir, keep=KEEP_VALIDATIONS - 1)  # the run adds one per suite
    skipped: dict[str, SuiteOutcome] = {}
    ran: list[tuple[str, SuiteSpec, Any]] = []  # key, spec, the pandas frame when read back by position
    definitions: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="splitkeeper-checks-") as batches_dir:
        batches: dict[tuple[str, tuple[str, ...]], tuple[Any, Any]] = {}
        for key, spec in specs.items():
            if key == FOLD_SUITE:
                continue
            if key == "balance" and not (chosen.balanced and deferred_assignment):
                why = (
                    f"strategy {chosen.name} is not balanced (protocol rule 1.6: kept to show its skew)"
                    if not chosen.balanced
                    else "legacy readers keep the splits they restored (source.reader_mode: legacy; "
                    "protocol rule 6.5 binds deferred assignment)"
                )
                skipped[key] = SuiteOutcome(
                    key=key,
                    name=spec.name,
                    status=SuiteStatus.SKIPPED,
                    dataset=spec.dataset,
                    rows=len(frames.loads),
                    notes=(
                        f"{why}: per-reader load is not checked; loads {dict(sorted(frames.loads.items()))}",
                    ),
                )
                continue
            batch_key = (spec.dataset, spec.index_columns)
            if batch_key not in batches:
                taken = any(d == spec.dataset for d, _cols in batches)
                name = f"{spec.dataset}-{len(batches)}" if taken else spec.dataset
                path, by_position = _write_batch(
                    frames.frames[spec.dataset], spec.index_columns, Path(batches_dir) / f"{name}.parquet"
                )
                asset = source.add_parquet_asset(name=name, path=path)
                batches[batch_key] = (asset.add_batch_definition_whole_dataframe(f"{name}-all"), by_position)
            batch, by_position = batches[batch_key]
            suite = context.suites.add(spec.to_suite())
            definitions.append(
                context.validation_definitions.add(
                    gx.ValidationDefinition(name=f"{key}-checkpoint-{checkpoint_id}", data=batch, suite=suite)
                )
            )
            ran.append((key, spec, by_position))
        results: dict[str, Any] = {}
        if definitions:
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=run_name,
                    validation_definitions=definitions,
                    actions=checkpoint_actions,
                    result_format={"result_format": "COMPLETE", "return_unexpected_index_query": False},
                )
            )
            checkpoint_result = checkpoint.run(run_id=run_id)
            results = {r.suite_name: r for r in checkpoint_result.run_results.values()}
    outcomes: list[SuiteOutcome] = []
    for key, spec in specs.items():
        if key == FOLD_SUITE:
            continue
        if key in skipped:
            outcomes.append(skipped[key])
            continue
        by_position = next(f for k, _s, f in ran if k == key)
        result = results[spec.name]
        expectations_out = tuple(_outcome_of(r, spec, by_position) for r in result.results)
        failed = any(not e.success for e in expectations_out)
        notes: tuple[str, ...] = ()
        if key == "balance":
            bound = "weighted bound" if isinstance(chosen, WeightedStrategy) else f"within {COUNT_TOLERANCE}"
            notes = (f"strategy {chosen.name}: {bound}; loads {dict(sorted(frames.loads.items()))}",)
        elif key == "sink_records":
            notes = (
                f"{frames.records} sink record(s) of epochs up to checkpoint {checkpoint_id} summarised",
            )
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
    if upsert is not None:
        outcome, fold_found = _run_fold_suite(
            spark,
            context,
            specs[FOLD_SUITE],
            upsert,
            sink,
            checkpoint_id,
            run_id,
            docs_dir,
            checkpoint_actions,
        )
        outcomes.append(outcome)
        found += fold_found
        report_notes.append(f"{FOLD_SUITE}: {outcome.notes[0]}")  # the verdict, for validate's output
    if not definitions and upsert is None:  # no checkpoint ran (every suite skipped): the site as it is
        context.build_data_docs(site_names=[DATA_DOCS_SITE])
    index = docs_dir / "index.html"
    return CheckReport(
        pipeline=state_store.pipeline_name,
        checkpoint_id=checkpoint_id,
        strategy=chosen.name,
        suites=tuple(outcomes),
        data_docs_index=index if index.is_file() else None,
        notes=tuple(report_notes),
        found=tuple(found),
    )


def _run_fold_suite(
    spark: SparkSession | Callable[[], SparkSession],
    context: Any,
    spec: SuiteSpec,
    upsert: UpsertSpec,
    sink: SinkReader,
    checkpoint_id: int,
    run_id: Any,
    docs_dir: Path,
    actions: Sequence[Any],
) -> tuple[SuiteOutcome, list[Violation]]:
    """The :data:`FOLD_SUITE` suite on the fold comparison frame, with GE's Spark datasource, as the
    checkpoint ``<run>-upsert-fold`` with ``actions``; its outcome, the fold's violation
    (FOLD_MISMATCH, whatever the suite reports), and the result file."""
    from dataclasses import replace

    import great_expectations as gx

    from splitkeeper.quality.upsert import scan_fold

    result, frame = scan_fold(spark, sink, upsert)
    found = (
        []
        if result.success
        else [Violation(ViolationKind.FOLD_MISMATCH, result.split_ids, f"upsert sink: {result.verdict()}")]
    )
    notes = (result.verdict(), *result.notes)  # the first is the verdict
    if frame is None:
        outcome = SuiteOutcome(
            key=FOLD_SUITE,
            name=spec.name,
            status=SuiteStatus.PASSED,
            dataset=spec.dataset,
            rows=0,
            notes=notes,
        )
    else:
        try:
            source = context.data_sources.add_spark(name="splitkeeper_spark")
            asset = source.add_dataframe_asset(name=spec.dataset)
            batch = asset.add_batch_definition_whole_dataframe(f"{spec.dataset}-all")
            suite = context.suites.add(spec.to_suite())
            definition = context.validation_definitions.add(
                gx.ValidationDefinition(
                    name=f"{FOLD_SUITE}-checkpoint-{checkpoint_id}", data=batch, suite=suite
                )
            )
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=f"{run_id.run_name}-{FOLD_SUITE.replace('_', '-')}",
                    validation_definitions=[definition],
                    actions=list(actions),
                    result_format=spec.result_format,  # SUMMARY: a sample of the offenders, on Spark
                )
            )
            checkpoint_result = checkpoint.run(batch_parameters={"dataframe": frame}, run_id=run_id)
            (run,) = checkpoint_result.run_results.values()
        finally:
            frame.unpersist()
        expectations_out = tuple(_outcome_of(r, spec) for r in run.results)
        outcome = SuiteOutcome(
            key=FOLD_SUITE,
            name=spec.name,
            status=SuiteStatus.FAILED if any(not e.success for e in expectations_out) else SuiteStatus.PASSED,
            dataset=spec.dataset,
            rows=max((int((r.result or {}).get("element_count") or 0) for r in run.results), default=0),
            expectations=expectations_out,
            notes=notes,
        )
    replace(
        result, status=outcome.status.value, expectations=tuple(e.line() for e in outcome.expectations)
    ).write(docs_dir)
    return outcome, found
