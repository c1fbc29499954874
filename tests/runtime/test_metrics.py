"""Metrics of a real run (splitkeeper.app.metrics): OpenTelemetry instruments, the Prometheus
text file in the state folder, ``status --metrics``, and an OTLP/HTTP export to a collector.

The run is ``splitkeeper run`` in-process on the session's Spark, over 3 small files with a
region failure in epoch 2 (a regional checkpoint). The text is parsed with prometheus_client's
own parser; the OTLP collector is a real HTTP server on loopback that decodes the protobuf
request with opentelemetry-proto.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from splitkeeper.app.metrics import metrics_path
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore

from .helpers import pipeline_mapping, run_cli, sink_rows, write_config, write_input

pytestmark = [pytest.mark.spark]


class _Collector(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        type(self).received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[tuple[str, list[bytes]]]:
    received: list[bytes] = []
    handler = type("Handler", (_Collector,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_a_run_writes_prometheus_metrics_status_prints_them_and_otlp_receives_them(
    spark: Any, tmp_path: Path, collector: tuple[str, list[bytes]]
) -> None:
    endpoint, received = collector
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=40)
    mapping = pipeline_mapping(tmp_path, "metrics", input_dir, epoch_records=60)
    mapping["metrics"] = {"otlp_endpoint": endpoint}
    path = write_config(tmp_path / "p.yaml", mapping)
    config = config_from_mapping(mapping)

    code, _out, err = run_cli(["run", "--config", str(path), "--fault", "fail:1@2"])
    assert code == 0, err

    text = Path(metrics_path(config.state_path)).read_text(encoding="utf-8")
    samples = _samples(text)
    kinds = {labels["kind"]: value for labels, value in samples["splitkeeper_checkpoints_total"]}
    store = DeltaStateStore(config.state_path, config.name, None, read_only=True)
    timeline = store.history.timeline()
    assert kinds["regional"] == sum(t.kind.value == "regional" for t in timeline) >= 1
    assert kinds["global"] == sum(t.kind.value == "global" for t in timeline) >= 1
    declines = [
        (labels["region"], value)
        for labels, value in samples["splitkeeper_region_outcomes_total"]
        if labels["outcome"] == "decline"
    ]
    assert declines == [("1", 1.0)]  # the injected failure, and nothing else
    assert all(labels["pipeline"] == "metrics" for series in samples.values() for labels, _ in series)
    [(_, committed)] = samples["splitkeeper_records_committed_total"]
    assert committed == len(sink_rows(config.sink_path)) == 120
    latest = store.latest_checkpoint()
    assert latest is not None
    [(_, checkpoint_id)] = samples["splitkeeper_checkpoint_id"]
    assert checkpoint_id == latest.checkpoint_id
    sizes = {f.name: f.stat().st_size for f in input_dir.iterdir()}  # every file read to its end
    assert {labels["split"]: value for labels, value in samples["splitkeeper_split_position"]} == sizes
    assert {labels["split"]: value for labels, value in samples["splitkeeper_split_finished"]} == {
        sid: 1 for sid in sizes
    }
    assert {labels["split"]: value for labels, value in samples["splitkeeper_split_lag"]} == {
        sid: 0 for sid in sizes
    }
    assert {labels["phase"] for labels, _ in samples["splitkeeper_checkpoint_commit_seconds"]} == {
        "sink",
        "state",
    }
    assert "splitkeeper_split_records_per_second" in samples

    code, out, err = run_cli(["status", "--config", str(path), "--metrics"])
    assert code == 0, err
    assert out == text

    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    assert received, "the OTLP collector received nothing"
    request = ExportMetricsServiceRequest()
    request.ParseFromString(received[-1])
    names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"splitkeeper_checkpoints", "splitkeeper_records_committed", "splitkeeper_split_lag"} <= names


def test_status_metrics_before_any_run_says_what_to_do(tmp_path: Path) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=1, lines=5)
    path = write_config(tmp_path / "p.yaml", pipeline_mapping(tmp_path, "nometrics", input_dir))

    code, out, err = run_cli(["status", "--config", str(path), "--metrics"])

    assert code == 2 and out == ""
    assert "has no metrics yet" in err and "metrics.prom" in err and "splitkeeper run" in err


def test_a_bad_otlp_endpoint_is_refused_naming_the_key(tmp_path: Path) -> None:
    from splitkeeper.errors import ConfigError

    mapping = pipeline_mapping(tmp_path, "badotlp", tmp_path / "in")
    mapping["metrics"] = {"otlp_endpoint": "localhost:4318"}
    with pytest.raises(ConfigError) as err:
        config_from_mapping(mapping)
    assert "metrics.otlp_endpoint" in str(err.value) and "http(s)://" in str(err.value)
