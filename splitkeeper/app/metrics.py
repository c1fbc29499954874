"""Pipeline metrics: recorded with OpenTelemetry, written as Prometheus text, optionally sent over OTLP.

A :class:`PipelineMetrics` is fed each epoch's :class:`~splitkeeper.core.driver.EpochReport`
(the runtime's ``after_epoch`` hook) and records, through OpenTelemetry instruments:

- per checkpoint attempt: ``splitkeeper_checkpoints_total{kind}`` (global, regional, aborted),
  ``splitkeeper_region_outcomes_total{region, outcome}``, ``splitkeeper_records_committed_total``,
  ``splitkeeper_dead_letters_total{stage}``, and for the last checkpoint
  ``splitkeeper_checkpoint_id``, ``splitkeeper_checkpoint_records``,
  ``splitkeeper_checkpoint_commit_seconds{phase}`` (the sink commit and the state commit),
  ``splitkeeper_last_checkpoint_timestamp_seconds`` and
  ``splitkeeper_last_global_checkpoint_timestamp_seconds`` (unix seconds);
- the regional checkpoint chain (FLIP-600): ``splitkeeper_region_ref_checkpoint_id{region}`` (the
  checkpoint whose state the region contributes: the checkpoint itself when it acknowledged),
  ``splitkeeper_region_consecutive_regional_checkpoints{region}`` (its ref depth),
  ``splitkeeper_consecutive_regional_checkpoints`` (regional checkpoints since the last global
  one), ``splitkeeper_consecutive_regional_checkpoints_limit`` (``checkpoint.max_consecutive_failures``)
  and ``splitkeeper_oldest_ref_checkpoint_id`` (the oldest checkpoint the last one still
  references, transitively: what retention keeps);
- per split, from the checkpoint's positions: ``splitkeeper_split_position{split}``,
  ``splitkeeper_split_lag{split}`` (offsets left to the split's end, or to its backlog
  boundary while in backlog; absent when neither is known), ``splitkeeper_split_records_per_second
  {split}`` (offsets advanced between the last two checkpoints over the time between them),
  ``splitkeeper_split_in_backlog{split}``, ``splitkeeper_split_finished{split}`` (a split read
  to its end is reported once more, at its end, then no longer updated);
- per in-run restart check (a restore inside a run proven before it reads on, protocol section 6):
  ``splitkeeper_restart_checks_total{verdict}`` (passed, failed), written at once (a failed check
  stops the run before any epoch);
- ``splitkeeper_store_retries_total{operation}``: the retries of store calls splitkeeper itself
  made in this process (:mod:`splitkeeper.delta.retries`: the fence's re-reads after a lost
  answer, a state append or delete sent again, the store probe's, the lease heartbeat's; the storage
  clients' own retries are not seen). Unlike the other counters it starts at 0 with each run
  (process), which Prometheus reads as a counter reset; :meth:`PipelineMetrics.close` writes the
  file once more when an epoch wrote it or this run retried a store call, so the retries after the
  last epoch, and those of a run the store stopped before its first epoch, are in it too.
- ``splitkeeper_discovery_listings_total`` and ``splitkeeper_discovery_skipped_events_total``: a
  files source in notification mode (``source.discovery: notifications``), its full listings of
  the prefix and the messages of its event topic that were not S3 events (skipped: each one made
  that discovery list the prefix whole), counted by the source
  (:class:`~splitkeeper.core.source.SupportsDiscoveryCounts`). Like the retries they start at 0 with
  each run, and are absent for a source that counts nothing. ``splitkeeper status`` shows the last
  run's (:func:`discovery_counts`).

Every metric carries the label ``pipeline``. The counters are cumulative across runs: a run
starts them from the state (:func:`seed_from_state`: the ``checkpoints`` and ``checkpoint_log``
tables give every attempt's kind and region outcomes, the ``validations`` table every in-run restart
check's verdict, the dead-letter table every stage; delta-rs
and pyarrow, no Spark), and ``records_committed_total``, which the state does not hold, from the
last ``metrics.prom`` when that file is as recent as the state (else it restarts at 0 with a
warning, which Prometheus reads as a counter reset). The two timestamps and the ref chain are
seeded from the state too.

Readers of the recorded data:

1. always: the Prometheus text exposition format (``prometheus_client``), written after each
   epoch to ``<state>/metrics.prom`` (a temporary object, then renamed, on local disk; on an
   object store one put), which node_exporter's textfile collector can pick up and
   ``splitkeeper status --metrics`` prints;
2. when ``metrics.otlp_endpoint`` (or ``$OTEL_EXPORTER_OTLP_ENDPOINT``) is set: an OTLP/HTTP
   exporter that sends the same data after each epoch.

Nothing here decides anything: a metrics failure is logged and the run goes on.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from splitkeeper.core.backlog import split_lag
from splitkeeper.core.restarts import RestartCheck
from splitkeeper.core.source import SupportsDiscoveryCounts
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, Split
from splitkeeper.delta import storage
from splitkeeper.sinks.port import SinkReader, SinkTable

__all__ = [
    "DISCOVERY_COUNTS",
    "METRICS_FILE",
    "PipelineMetrics",
    "Seed",
    "discovery_counts",
    "metrics_path",
    "read_metrics_text",
    "seed_from_state",
]

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.prom"
OTLP_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"


def metrics_path(state_path: str) -> str:
    """Where a pipeline's Prometheus text file lives: ``<state>/metrics.prom``."""
    return storage.join(state_path, METRICS_FILE)


def read_metrics_text(state_path: str) -> str | None:
    """The last written Prometheus text of the pipeline at ``state_path``; None when none was written."""
    fs, inner = storage.filesystem(metrics_path(state_path))
    info = fs.get_file_info(inner)
    if info.type.name != "File":
        return None
    with fs.open_input_stream(inner) as handle:
        return bytes(handle.read()).decode("utf-8")


#: The discovery counts a source may keep (SupportsDiscoveryCounts), each a counter
#: ``splitkeeper_discovery_<name>_total`` of the run.
DISCOVERY_COUNTS = {
    "listings": "full listings of the source's prefix discovery made in this run (notification mode)",
    "skipped_events": "messages of the event topic that were not S3 events, skipped in this run",
}


def discovery_counts(text: str) -> dict[str, int]:
    """The discovery counts (DISCOVERY_COUNTS) in a metrics text (``metrics.prom``); empty: none."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {f"splitkeeper_discovery_{name}": name for name in DISCOVERY_COUNTS}
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name in names:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[names[family.name]] = int(sample.value)
    return counts


@dataclass
class Seed:
    """Where a run's counters and state gauges start: what earlier runs of the pipeline did."""

    checkpoints: Counter[str] = field(default_factory=Counter)  # kind -> attempts
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (region, outcome) -> count
    dead_letters: Counter[str] = field(default_factory=Counter)  # stage -> rows
    restart_checks: Counter[str] = field(default_factory=Counter)  # verdict -> in-run restart checks
    records_committed: int = 0
    latest_id: int | None = None  # the latest completed checkpoint
    last_at: float | None = None  # unix seconds of the latest completed checkpoint
    last_global_at: float | None = None
    refs: dict[int, frozenset[int]] = field(default_factory=dict)  # completed id -> the ids it references


def seed_from_state(state_path: str, sink: SinkReader | None, pipeline: str = "") -> Seed:
    """Read the counters' start from the state (delta-rs and pyarrow; no Spark, read-only).

    The attempts are those of :meth:`StateHistory.timeline <splitkeeper.delta.history.StateHistory.
    timeline>`, counted column-wise (10,000 checkpoints in well under a second): every kept
    checkpoint, every one retention archived (once per id), every aborted attempt logged; the
    dead letters count per ``stage``; ``records_committed`` comes from the last ``metrics.prom``
    when its ``splitkeeper_checkpoint_id`` is the state's latest checkpoint (a lost or stale
    file: 0 and a warning).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from splitkeeper.delta.history import StateHistory
    from splitkeeper.delta.tables import StateTables

    tables = StateTables(state_path, read_only=True)
    history = StateHistory(tables, pipeline)
    kept, archived, aborted = history.timeline_tables(["regions", "created_at"])  # the timeline's rule

    seed = Seed()
    for part in (kept, archived, aborted):
        seed.checkpoints.update(dict(Counter(part.column("kind").to_pylist())))
        regions = pc.list_flatten(part.column("regions"))
        if len(regions):
            pairs = pa.table(
                {
                    "region": pc.struct_field(regions, "region_id"),
                    "outcome": pc.struct_field(regions, "outcome"),
                }
            )
            for row in pairs.group_by(["region", "outcome"]).aggregate([([], "count_all")]).to_pylist():
                seed.outcomes[(str(row["region"]), str(row["outcome"]))] += int(row["count_all"])
    for row in kept.select(["checkpoint_id", "regions"]).to_pylist():  # a chain is kept whole (rule 2.7)
        seed.refs[int(row["checkpoint_id"])] = frozenset(
            int(r["ref_checkpoint_id"])
            for r in row["regions"] or ()
            if r.get("ref_checkpoint_id") is not None
        )
    columns = ["checkpoint_id", "kind", "created_at"]
    completed = pa.concat_tables(
        [kept.select(columns), archived.select(columns)], promote_options="permissive"
    )
    if completed.num_rows:
        latest = completed.sort_by([("checkpoint_id", "descending")]).slice(0, 1).to_pylist()[0]
        seed.latest_id = int(latest["checkpoint_id"])
        seed.last_at = _unix(latest["created_at"])
        globals_ = completed.filter(pc.field("kind") == CheckpointKind.GLOBAL.value).column("created_at")
        seed.last_global_at = _unix(pc.max(globals_).as_py()) if len(globals_) else None
    if sink is not None and sink.location(SinkTable.DEAD_LETTERS) is not None:
        stages = sink.rows(SinkTable.DEAD_LETTERS, ["stage"]).column("stage")
        for row in pa.table({"stage": stages}).group_by("stage").aggregate([([], "count_all")]).to_pylist():
            seed.dead_letters[str(row["stage"])] += int(row["count_all"])
    checks = tables.read(
        "validations", filter=pc.field("pipeline") == pipeline, columns=["verdict", "restore"]
    )
    for verdict, restore in zip(
        checks.column("verdict").to_pylist(), checks.column("restore").to_pylist(), strict=True
    ):
        if restore is not None:
            seed.restart_checks[verdict or "passed"] += 1
    seed.records_committed = _previous_records(state_path, seed.latest_id, pipeline)
    return seed


def _unix(value: Any) -> float | None:
    """A state table's TIMESTAMP (a datetime, UTC) as unix seconds."""
    if value is None:
        return None
    from datetime import UTC

    return float(value.replace(tzinfo=value.tzinfo or UTC).timestamp())


def _previous_records(state_path: str, latest_id: int | None, pipeline: str) -> int:
    """``records_committed_total`` of the last ``metrics.prom`` when that file is as recent as the state."""
    if latest_id is None:
        return 0
    from prometheus_client.parser import text_string_to_metric_families

    text = read_metrics_text(state_path)
    if text is None:
        log.warning(
            "pipeline %s: %s is missing: splitkeeper_records_committed_total restarts at 0 "
            "(the other counters are read from the state)",
            pipeline,
            metrics_path(state_path),
        )
        return 0
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("splitkeeper_checkpoint_id", "splitkeeper_records_committed_total"):
                found[sample.name] = sample.value
    if found.get("splitkeeper_checkpoint_id") != latest_id:
        log.warning(
            "pipeline %s: %s is of checkpoint %s, the state's latest is %s: "
            "splitkeeper_records_committed_total restarts at 0",
            pipeline,
            metrics_path(state_path),
            found.get("splitkeeper_checkpoint_id"),
            latest_id,
        )
        return 0
    return int(found.get("splitkeeper_records_committed_total", 0))


class PipelineMetrics:
    """The OpenTelemetry instruments of one pipeline run (see the module doc); one per run."""

    def __init__(
        self,
        pipeline: str,
        state_path: str,
        otlp_endpoint: str | None = None,
        *,
        sink: SinkReader | None = None,
        max_consecutive_failures: int | None = None,
        seed: Seed | None = None,
    ) -> None:
        """``seed``: where the counters start (default: :func:`seed_from_state` of ``state_path``)."""
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
        from opentelemetry.sdk.resources import Resource

        self.pipeline = pipeline
        self.path = metrics_path(state_path)
        self._reader = InMemoryMetricReader()
        readers: list[MetricReader] = [self._reader]
        self.otlp_endpoint = otlp_endpoint or os.environ.get(OTLP_ENV) or None
        self._otlp: Any = None
        if self.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            endpoint = self.otlp_endpoint.rstrip("/")
            if not endpoint.endswith("/v1/metrics"):
                endpoint += "/v1/metrics"
            self._otlp = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=endpoint, timeout=5), export_interval_millis=3_600_000
            )
            readers.append(self._otlp)
        self._provider = MeterProvider(
            # one instance per pipeline (the lease allows one run at a time): the runs of a pipeline
            # are one series to a collector, so its counters continue across runs there too
            metric_readers=readers,
            resource=Resource.create({"service.name": "splitkeeper", "service.instance.id": pipeline}),
        )
        meter = self._provider.get_meter("splitkeeper")
        self._checkpoints = meter.create_counter("splitkeeper_checkpoints", description="checkpoints by kind")
        self._outcomes = meter.create_counter(
            "splitkeeper_region_outcomes", description="region outcomes of the checkpoint attempts"
        )
        self._records = meter.create_counter(
            "splitkeeper_records_committed", description="records committed to the sink"
        )
        self._checkpoint_id = meter.create_gauge(
            "splitkeeper_checkpoint_id", description="the last checkpoint"
        )
        self._checkpoint_records = meter.create_gauge(
            "splitkeeper_checkpoint_records", description="records committed by the last checkpoint"
        )
        self._commit = meter.create_gauge(
            "splitkeeper_checkpoint_commit_seconds",
            unit="s",
            description="the last checkpoint's commit time, per phase (sink, state)",
        )
        self._position = meter.create_gauge("splitkeeper_split_position", description="the split's position")
        self._lag = meter.create_gauge(
            "splitkeeper_split_lag", description="offsets left to the split's end or backlog boundary"
        )
        self._rate = meter.create_gauge(
            "splitkeeper_split_records_per_second",
            description="offsets advanced per second between the last two checkpoints",
        )
        self._backlog = meter.create_gauge(
            "splitkeeper_split_in_backlog", description="1 while the split is before its backlog boundary"
        )
        self._finished = meter.create_gauge(
            "splitkeeper_split_finished", description="1 once the split was read to its end"
        )
        self._dead = meter.create_counter(
            "splitkeeper_dead_letters", description="records written to the dead-letter table, per stage"
        )
        self._restart_checks = meter.create_counter(
            "splitkeeper_restart_checks",
            description="in-run restart checks (each restore inside a run, proven before it reads on)",
        )
        self._last_at = meter.create_gauge(
            "splitkeeper_last_checkpoint_timestamp_seconds",
            unit="s",
            description="unix time of the last completed checkpoint (global or regional)",
        )
        self._last_global_at = meter.create_gauge(
            "splitkeeper_last_global_checkpoint_timestamp_seconds",
            unit="s",
            description="unix time of the last completed global checkpoint",
        )
        self._region_ref = meter.create_gauge(
            "splitkeeper_region_ref_checkpoint_id",
            description="the checkpoint whose state the region contributes to the last checkpoint",
        )
        self._region_consecutive = meter.create_gauge(
            "splitkeeper_region_consecutive_regional_checkpoints",
            description="checkpoints in a row the region has not acknowledged (its ref depth)",
        )
        self._consecutive = meter.create_gauge(
            "splitkeeper_consecutive_regional_checkpoints",
            description="regional checkpoints completed since the last global one",
        )
        self._consecutive_limit = meter.create_gauge(
            "splitkeeper_consecutive_regional_checkpoints_limit",
            description="checkpoint.max_consecutive_failures: the consecutive regional checkpoints allowed",
        )
        self._oldest_ref = meter.create_gauge(
            "splitkeeper_oldest_ref_checkpoint_id",
            description="the oldest checkpoint the last checkpoint still references (retention keeps it)",
        )
        meter.create_observable_counter(
            "splitkeeper_store_retries",
            callbacks=[self._observe_retries],
            description="retries of store calls splitkeeper made itself in this run, per operation",
        )
        for name, description in DISCOVERY_COUNTS.items():
            meter.create_observable_counter(
                f"splitkeeper_discovery_{name}",
                callbacks=[functools.partial(self._observe_discovery, name)],
                description=description,
            )
        self.source: SupportsDiscoveryCounts | None = None  # the run's source, when it counts discovery
        self._observed = False  # an epoch was recorded (the file written) by this run
        self._retries_at_start = _retries_counted()
        self._known: dict[str, Split] = {}  # the splits seen, as of their last checkpoint
        self._last: tuple[float, dict[str, int]] | None = None  # (time, positions) at the last checkpoint
        self.sink = sink  # the sink's reader: its dead letters are counted (None: not counted)
        self._dead_version: int | None = None  # the dead-letter table's version when last read
        if seed is None:
            try:
                seed = seed_from_state(state_path, sink, pipeline)
            except Exception as err:  # noqa: BLE001 - metrics never stop a run
                log.warning("pipeline %s: counters start at 0: state unreadable: %s", pipeline, err)
                seed = Seed()
        self.seed = seed
        self._refs = dict(self.seed.refs)
        self._start(self.seed, max_consecutive_failures)

    def _start(self, seed: Seed, limit: int | None) -> None:
        """The counters continue from ``seed``; the gauges the state knows are set from it."""
        base = {"pipeline": self.pipeline}
        for kind in CheckpointKind:  # every kind, 0 included: an alert on a missing series never fires
            self._checkpoints.add(seed.checkpoints.get(kind.value, 0), {**base, "kind": kind.value})
        for (region, outcome), count in sorted(seed.outcomes.items()):
            self._outcomes.add(count, {**base, "region": region, "outcome": outcome})
        self._records.add(seed.records_committed, base)
        for stage, count in sorted(seed.dead_letters.items()):
            self._dead.add(count, {**base, "stage": stage})
        for verdict in ("passed", "failed"):  # both, 0 included: an alert on the failed series can fire
            self._restart_checks.add(seed.restart_checks.get(verdict, 0), {**base, "verdict": verdict})
        if limit is not None:
            self._consecutive_limit.set(limit, base)
        if seed.latest_id is not None:
            self._checkpoint_id.set(seed.latest_id, base)
            self._oldest_ref.set(self._oldest_ref_of(seed.latest_id), base)
        if seed.last_at is not None:
            self._last_at.set(round(seed.last_at, 3), base)
        if seed.last_global_at is not None:
            self._last_global_at.set(round(seed.last_global_at, 3), base)

    def _observe_retries(self, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        from splitkeeper.delta import retries

        for operation, count in retries.counts().items():
            yield Observation(count, {"pipeline": self.pipeline, "operation": operation})

    def watch_source(self, source: object) -> None:
        """Count what ``source``'s discovery does (when it counts: SupportsDiscoveryCounts)."""
        if isinstance(source, SupportsDiscoveryCounts):
            self.source = source

    def _observe_discovery(self, name: str, _options: Any) -> Iterable[Any]:
        from opentelemetry.metrics import Observation

        counts = self.source.discovery_counts() if self.source is not None else {}
        if name in counts:
            yield Observation(counts[name], {"pipeline": self.pipeline})

    def _oldest_ref_of(self, checkpoint_id: int) -> int:
        """The oldest id of ``checkpoint_id``'s ref chain (itself when it references nothing)."""
        seen: set[int] = set()
        todo = [checkpoint_id]
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self._refs.get(current, ()))
        return min(seen)

    # -- recording --

    def observe(self, report: Any) -> None:
        """Record one epoch (an EpochReport), then write the text file and push OTLP. Never raises."""
        self._observed = True
        try:
            self._record(report)
            self.flush()
        except Exception as err:  # noqa: BLE001 - metrics never stop a run
            log.warning("pipeline %s: metrics not written: %s", self.pipeline, err)

    def restart_checked(self, check: RestartCheck) -> None:
        """Count one in-run restart check by its verdict, then write the file and push OTLP (a failed
        check stops the run before any epoch would). Never raises."""
        self._observed = True
        try:
            self._restart_checks.add(1, {"pipeline": self.pipeline, "verdict": check.verdict})
            self.flush()
        except Exception as err:  # noqa: BLE001 - metrics never stop a run
            log.warning("pipeline %s: metrics not written: %s", self.pipeline, err)

    def _record(self, report: Any) -> None:
        base = {"pipeline": self.pipeline}
        kind: CheckpointKind = report.kind
        self._checkpoints.add(1, {**base, "kind": kind.value})
        for region, outcome in sorted(report.outcomes.items()):
            self._outcomes.add(1, {**base, "region": str(region), "outcome": outcome.value})
        if kind is CheckpointKind.ABORTED:
            return
        now = round(time.time(), 3)
        self._records.add(report.committed_records, base)
        self._checkpoint_id.set(report.epoch, base)
        self._checkpoint_records.set(report.committed_records, base)
        self._last_at.set(now, base)
        if kind is CheckpointKind.GLOBAL:
            self._last_global_at.set(now, base)
        for phase in ("sink", "state"):
            if phase in report.phases:
                self._commit.set(report.phases[phase], {**base, "phase": phase})
        self._record_dead_letters(report.epoch, base)
        completed: CompletedCheckpoint | None = report.completed
        if completed is not None:
            self._record_chain(completed, base)
            self._record_splits(completed, base)

    def _record_dead_letters(self, epoch: int, base: Mapping[str, str]) -> None:
        """The dead letters the sink committed with checkpoint ``epoch``, per stage.

        The table is kept open and brought up to date (a few ms); its rows are read, pruned on
        ``epoch``, only when its version moved: no read in an epoch without dead letters.
        """
        sink = self.sink
        if sink is None or sink.location(SinkTable.DEAD_LETTERS) is None:
            return
        version = sink.version(SinkTable.DEAD_LETTERS)
        if version is None or version == self._dead_version:
            return
        self._dead_version = version
        rows = sink.rows(SinkTable.DEAD_LETTERS, ["stage"], epoch=epoch)
        for stage, count in sorted(Counter(str(s) for s in rows.column("stage").to_pylist()).items()):
            self._dead.add(count, {**base, "stage": stage})

    def _record_chain(self, completed: CompletedCheckpoint, base: Mapping[str, str]) -> None:
        self._refs[completed.checkpoint_id] = completed.ref_checkpoint_ids
        for region_id, region in sorted(completed.regions.items()):
            labels = {**base, "region": str(region_id)}
            ref = region.ref_checkpoint_id
            self._region_ref.set(completed.checkpoint_id if ref is None else ref, labels)
            self._region_consecutive.set(region.ref_depth, labels)
        self._consecutive.set(completed.consecutive_regional, base)
        oldest = self._oldest_ref_of(completed.checkpoint_id)
        self._oldest_ref.set(oldest, base)
        # a later checkpoint refers to this one or to its chain, never below it: forget the rest
        self._refs = {cid: refs for cid, refs in self._refs.items() if cid >= oldest}

    def _record_splits(self, completed: CompletedCheckpoint, base: Mapping[str, str]) -> None:
        now = time.monotonic()
        positions: dict[str, int] = {}
        for region in completed.regions.values():
            for split in region.splits:
                self._known[split.split_id] = split
                labels = {**base, "split": split.split_id}
                positions[split.split_id] = split.position
                self._position.set(split.position, labels)
                self._finished.set(0, labels)
                in_backlog = split.backlog_end is not None and split.position < split.backlog_end
                self._backlog.set(1 if in_backlog else 0, labels)
                lag = split_lag(split)
                if lag is not None:
                    self._lag.set(lag, labels)
        finished = completed.enumerator.finished if completed.enumerator is not None else frozenset()
        for split_id in sorted(finished & self._known.keys()):
            known = self._known.pop(split_id)  # read to its end: reported once more, then no longer
            labels = {**base, "split": split_id}
            end = known.end if known.end is not None else known.position
            positions[split_id] = end
            self._position.set(end, labels)
            self._finished.set(1, labels)
            self._backlog.set(0, labels)
            self._lag.set(0, labels)
        if self._last is not None:
            then, before = self._last
            elapsed = max(now - then, 1e-6)
            for split_id, position in positions.items():
                if split_id in before:
                    rate = max(0, position - before[split_id]) / elapsed
                    self._rate.set(round(rate, 3), {**base, "split": split_id})
        self._last = (now, positions)

    # -- reading --

    def text(self) -> str:
        """The recorded data in Prometheus' text exposition format."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self._reader.get_metrics_data()))
        return str(generate_latest(registry).decode("utf-8"))

    def flush(self) -> None:
        """Write the text file (atomically on local disk) and, with an endpoint, export over OTLP."""
        body = self.text().encode("utf-8")
        fs, inner = storage.filesystem(self.path)
        local = storage.local_path(self.path)
        if local is not None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            tmp = f"{local}.tmp-{uuid.uuid4().hex}"
            with open(tmp, "wb") as out:
                out.write(body)
            os.replace(tmp, local)
        else:
            with fs.open_output_stream(inner) as out:
                out.write(body)
        if self._otlp is not None:
            self._otlp.force_flush(timeout_millis=10_000)

    def close(self) -> None:
        """Write the file once more when an epoch wrote it (what happened since: retries) or when this
        run retried a store call (a run the store stopped before its first epoch), then stop."""
        try:
            if self._observed or _retries_counted() > self._retries_at_start:
                self.flush()
        except Exception as err:  # noqa: BLE001 - metrics never stop a run
            log.warning("pipeline %s: metrics not written at close: %s", self.pipeline, err)
        try:
            self._provider.shutdown(timeout_millis=5_000)
        except Exception as err:  # noqa: BLE001
            log.warning("pipeline %s: metrics shutdown: %s", self.pipeline, err)


def _retries_counted() -> int:
    """The store retries this process counted so far (:mod:`splitkeeper.delta.retries`), all operations."""
    from splitkeeper.delta import retries

    return sum(retries.counts().values())


class _Collector:
    """A prometheus_client collector over one OpenTelemetry MetricsData snapshot."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def collect(self) -> Iterable[Any]:
        from opentelemetry.sdk.metrics.export import Gauge, Sum
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self.data is None:
            return
        for resource in self.data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = list(metric.data.data_points)
                    if not points:
                        continue
                    names = sorted({k for p in points for k in p.attributes})
                    family: Any
                    if isinstance(metric.data, Sum) and metric.data.is_monotonic:
                        family = CounterMetricFamily(
                            metric.name, metric.description or metric.name, labels=names
                        )
                    elif isinstance(metric.data, Sum | Gauge):
                        family = GaugeMetricFamily(
                            metric.name, metric.description or metric.name, labels=names
                        )
                    else:  # pragma: no cover - no histogram is recorded
                        continue
                    for point in points:
                        family.add_metric([str(point.attributes.get(n, "")) for n in names], point.value)
                    yield family
