"""Pipeline metrics: recorded with OpenTelemetry, written as Prometheus text, optionally sent over OTLP.

A :class:`PipelineMetrics` is fed each epoch's :class:`~splitkeeper.core.driver.EpochReport`
(the runtime's ``after_epoch`` hook) and records, through OpenTelemetry instruments:

- per checkpoint: ``splitkeeper_checkpoints_total{kind}``, ``splitkeeper_region_outcomes_total
  {region, outcome}``, ``splitkeeper_records_committed_total``, and for the last checkpoint
  ``splitkeeper_checkpoint_id``, ``splitkeeper_checkpoint_records`` and
  ``splitkeeper_checkpoint_commit_seconds{phase}`` (the sink commit and the state commit);
- per split, from the checkpoint's positions: ``splitkeeper_split_position{split}``,
  ``splitkeeper_split_lag{split}`` (offsets left to the split's end, or to its backlog
  boundary while in backlog; absent when neither is known), ``splitkeeper_split_records_per_second
  {split}`` (offsets advanced between the last two checkpoints over the time between them),
  ``splitkeeper_split_in_backlog{split}``, ``splitkeeper_split_finished{split}`` (a split read
  to its end is reported once more, at its end, then no longer updated).

Every metric carries the label ``pipeline``. Readers of the recorded data:

1. always: the Prometheus text exposition format (``prometheus_client``), written after each
   epoch to ``<state>/metrics.prom`` (a temporary object, then renamed, on local disk; on an
   object store one put), which node_exporter's textfile collector can pick up and
   ``splitkeeper status --metrics`` prints;
2. when ``metrics.otlp_endpoint`` (or ``$OTEL_EXPORTER_OTLP_ENDPOINT``) is set: an OTLP/HTTP
   exporter that sends the same data after each epoch.

Nothing here decides anything: a metrics failure is logged and the run goes on.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from splitkeeper.core.backlog import split_lag
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, Split
from splitkeeper.delta import storage

__all__ = ["METRICS_FILE", "PipelineMetrics", "metrics_path", "read_metrics_text"]

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


class PipelineMetrics:
    """The OpenTelemetry instruments of one pipeline run (see the module doc); one per run."""

    def __init__(self, pipeline: str, state_path: str, otlp_endpoint: str | None = None) -> None:
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
            metric_readers=readers, resource=Resource.create({"service.name": "splitkeeper"})
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
        self._known: dict[str, Split] = {}  # the splits seen, as of their last checkpoint
        self._last: tuple[float, dict[str, int]] | None = None  # (time, positions) at the last checkpoint

    # -- recording --

    def observe(self, report: Any) -> None:
        """Record one epoch (an EpochReport), then write the text file and push OTLP. Never raises."""
        try:
            self._record(report)
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
        self._records.add(report.committed_records, base)
        self._checkpoint_id.set(report.epoch, base)
        self._checkpoint_records.set(report.committed_records, base)
        for phase in ("sink", "state"):
            if phase in report.phases:
                self._commit.set(report.phases[phase], {**base, "phase": phase})
        completed: CompletedCheckpoint | None = report.completed
        if completed is not None:
            self._record_splits(completed, base)

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
        try:
            self._provider.shutdown(timeout_millis=5_000)
        except Exception as err:  # noqa: BLE001
            log.warning("pipeline %s: metrics shutdown: %s", self.pipeline, err)


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
