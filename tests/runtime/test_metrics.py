"""Metrics of real runs (splitkeeper.app.metrics): OpenTelemetry instruments, the Prometheus
text file in the state folder, ``status --metrics``, and an OTLP/HTTP export to a real
OpenTelemetry Collector (``scripts/otelcol``, built by ``scripts/setup.sh``) whose Prometheus
exporter the test scrapes, as a Prometheus server would.

Two runs of ``splitkeeper run`` in-process on the session's Spark: the first over 3 small
files and a file with undecodable lines (dead letters), with a region failure in epoch 2 (a
regional checkpoint); the second over files added since. The counters of the second run
continue the first's and equal the state's timeline. The text is parsed with
prometheus_client's own parser. The alert rules of ``docs/alerts.yml`` use only names a run
exports.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from splitkeeper.app.metrics import PipelineMetrics, Seed, metrics_path
from splitkeeper.app.sink import sink_reader
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.driver import EpochReport
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, RegionOutcome, RegionState
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.sinks.delta.read import read_dead_letters
from splitkeeper_tools.otelcol import LocalCollector

from .helpers import REPO, pipeline_mapping, run_cli, sink_rows, write_config, write_input

pytestmark = [pytest.mark.spark]

Samples = dict[str, list[tuple[dict[str, str], float]]]
#: Labels the collector's Prometheus exporter adds (the OTLP resource and scope): not the pipeline's.
COLLECTOR_LABELS = frozenset(
    {"instance", "job", "otel_scope_name", "otel_scope_schema_url", "otel_scope_version"}
)


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[LocalCollector]:
    with LocalCollector(tmp_path / "otelcol") as running:
        yield running


def _samples(text: str, drop: frozenset[str] = frozenset()) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in drop}
            out.setdefault(sample.name, []).append((labels, sample.value))
    return out


def _by(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {labels[label]: value for labels, value in samples[name]}


def _write_bad_file(path: Path, lines: int, bad_every: int) -> int:
    """Text lines where every ``bad_every``-th is not valid UTF-8 (a decode dead letter); the bad count."""
    data, bad = b"", 0
    for i in range(lines):
        if i % bad_every == bad_every - 1:
            data += b"\xff\xfe bad %d\n" % i
            bad += 1
        else:
            data += b"line %d caf\xc3\xa9\n" % i
    path.write_bytes(data)
    return bad


def _pipeline_series(samples: Samples) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {  # the collector adds target_info (the OTLP resource): not a pipeline series
        (name, tuple(sorted(labels.items())))
        for name, series in samples.items()
        if name != "target_info"
        for labels, _ in series
    }


def _values(samples: Samples, name: str) -> set[tuple[tuple[tuple[str, str], ...], float]]:
    return {(tuple(sorted(labels.items())), value) for labels, value in samples[name]}


def test_runs_write_cumulative_metrics_status_prints_them_and_a_real_collector_serves_them(
    spark: Any, tmp_path: Path, collector: LocalCollector, caplog: pytest.LogCaptureFixture
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=40)
    bad = _write_bad_file(input_dir / "bad-0.txt", lines=20, bad_every=5)
    mapping = pipeline_mapping(tmp_path, "metrics", input_dir, epoch_records=60)
    mapping["metrics"] = {"otlp_endpoint": collector.otlp_endpoint}
    mapping["decode"] = {"kind": "text"}
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": str(tmp_path / "dead")},
        "max_bad_ratio": 0.5,
    }
    path = write_config(tmp_path / "p.yaml", mapping)
    config = config_from_mapping(mapping)
    assert config.errors.dead_letter.path is not None

    code, _out, err = run_cli(["run", "--config", str(path), "--fault", "fail:1@2"])
    assert code == 0, err

    text = Path(metrics_path(config.state.path)).read_text(encoding="utf-8")
    samples = _samples(text)
    kinds = _by(samples, "splitkeeper_checkpoints_total", "kind")
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    timeline = store.history.timeline()
    first_run = Counter(t.kind.value for t in timeline)
    assert kinds == {"global": first_run["global"], "regional": first_run["regional"], "aborted": 0}
    assert first_run["regional"] >= 1 and first_run["global"] >= 1
    declines = [
        (labels["region"], value)
        for labels, value in samples["splitkeeper_region_outcomes_total"]
        if labels["outcome"] == "decline"
    ]
    assert declines == [("1", 1.0)]  # the injected failure, and nothing else
    assert all(labels["pipeline"] == "metrics" for series in samples.values() for labels, _ in series)
    [(_, committed)] = samples["splitkeeper_records_committed_total"]
    assert committed == len(sink_rows(config.sink.path)) == 120 + 20 - bad
    dead = Counter(
        read_dead_letters(config.errors.dead_letter.path, columns=["stage"]).column("stage").to_pylist()
    )
    assert sum(dead.values()) == bad
    assert _by(samples, "splitkeeper_dead_letters_total", "stage") == dead
    latest = store.latest_checkpoint()
    assert latest is not None
    [(_, checkpoint_id)] = samples["splitkeeper_checkpoint_id"]
    assert checkpoint_id == latest.checkpoint_id
    sizes = {f.name: f.stat().st_size for f in input_dir.iterdir()}  # every file read to its end
    assert _by(samples, "splitkeeper_split_position", "split") == sizes
    assert _by(samples, "splitkeeper_split_finished", "split") == {sid: 1 for sid in sizes}
    assert _by(samples, "splitkeeper_split_lag", "split") == {sid: 0 for sid in sizes}
    assert set(_by(samples, "splitkeeper_checkpoint_commit_seconds", "phase")) == {"sink", "state"}
    assert "splitkeeper_split_records_per_second" in samples
    # the chain gauges: region 1 declined epoch 2 only, so the last checkpoint is acknowledged by all
    refs = _by(samples, "splitkeeper_region_ref_checkpoint_id", "region")
    assert refs == {str(r): latest.checkpoint_id for r in latest.regions}
    assert set(_by(samples, "splitkeeper_region_consecutive_regional_checkpoints", "region").values()) == {0}
    [(_, limit)] = samples["splitkeeper_consecutive_regional_checkpoints_limit"]
    assert limit == config.checkpoint.max_consecutive_failures == 3
    [(_, oldest)] = samples["splitkeeper_oldest_ref_checkpoint_id"]
    assert oldest == min(store.ref_chain(latest.checkpoint_id))
    done = {t.kind.value: t.at.timestamp() for t in timeline}  # the last of each kind
    [(_, last_at)] = samples["splitkeeper_last_checkpoint_timestamp_seconds"]
    [(_, last_global_at)] = samples["splitkeeper_last_global_checkpoint_timestamp_seconds"]
    assert abs(last_at - max(done.values())) < 5 and abs(last_global_at - done["global"]) < 5

    code, out, err = run_cli(["status", "--config", str(path), "--metrics"])
    assert code == 0, err
    assert out == text

    # the collector received the same figures over OTLP and serves them as Prometheus text
    served = _samples(collector.scrape(), drop=COLLECTOR_LABELS)
    assert _pipeline_series(served) == _pipeline_series(samples)
    for name in (
        "splitkeeper_checkpoints_total",
        "splitkeeper_records_committed_total",
        "splitkeeper_split_lag",
    ):
        assert _values(served, name) == _values(samples, name), name

    # a second run over new files: the counters continue from the state, through the collector too
    write_input(input_dir, files=1, lines=30, first_file=3)
    bad += _write_bad_file(input_dir / "bad-1.txt", lines=10, bad_every=4)
    code, _out, err = run_cli(["run", "--config", str(path)])
    assert code == 0, err
    text = Path(metrics_path(config.state.path)).read_text(encoding="utf-8")
    samples = _samples(text)
    both = Counter(t.kind.value for t in store.history.timeline())
    assert both["global"] > first_run["global"]
    kinds = _by(samples, "splitkeeper_checkpoints_total", "kind")
    assert kinds == {"global": both["global"], "regional": both["regional"], "aborted": 0}
    [(_, committed)] = samples["splitkeeper_records_committed_total"]
    assert committed == len(sink_rows(config.sink.path)) == 120 + 30 + 20 + 10 - bad
    dead = Counter(
        read_dead_letters(config.errors.dead_letter.path, columns=["stage"]).column("stage").to_pylist()
    )
    assert sum(dead.values()) == bad
    assert _by(samples, "splitkeeper_dead_letters_total", "stage") == dead
    served = _samples(collector.scrape(), drop=COLLECTOR_LABELS)
    for name in ("splitkeeper_checkpoints_total", "splitkeeper_records_committed_total"):
        assert _values(served, name) == _values(samples, name), name
    [(_, served_committed)] = served["splitkeeper_records_committed_total"]
    assert served_committed == committed

    # a lost metrics.prom: what the state holds still starts right; records_committed restarts, with a warning
    Path(metrics_path(config.state.path)).unlink()
    with caplog.at_level(logging.WARNING, logger="splitkeeper.app.metrics"):
        fresh = PipelineMetrics(config.name, config.state.path, sink=sink_reader(config))
    try:
        again = _samples(fresh.text())
    finally:
        fresh.close()
    for name in (
        "splitkeeper_checkpoints_total",
        "splitkeeper_region_outcomes_total",
        "splitkeeper_dead_letters_total",
        "splitkeeper_checkpoint_id",
        "splitkeeper_oldest_ref_checkpoint_id",
    ):
        assert _values(again, name) == _values(samples, name), name
    assert again["splitkeeper_records_committed_total"] == [({"pipeline": "metrics"}, 0.0)]
    assert "metrics.prom is missing: splitkeeper_records_committed_total restarts at 0" in caplog.text
    [(_, seeded_at)] = again["splitkeeper_last_global_checkpoint_timestamp_seconds"]
    [(_, observed_at)] = samples["splitkeeper_last_global_checkpoint_timestamp_seconds"]
    assert abs(seeded_at - observed_at) < 5

    # every metric the alert rules use is one a run exports (the rules cannot rot)
    rules = yaml.safe_load((REPO / "docs" / "alerts.yml").read_text(encoding="utf-8"))
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    used = {word for expr in exprs for word in _metric_names(expr)}
    assert used and used <= set(samples), sorted(used - set(samples))


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bsplitkeeper_[a-z_]+\b", expr))


def test_the_guide_quotes_the_alert_rules_of_docs_alerts_yml() -> None:
    rules = yaml.safe_load((REPO / "docs" / "alerts.yml").read_text(encoding="utf-8"))
    by_name = {rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]}
    readme = (REPO / "docs" / "guide.md").read_text(encoding="utf-8")
    section = readme[readme.index("Ready alert rules") :]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.S)
    assert block is not None
    quoted = yaml.safe_load(block.group(1))
    assert {q["alert"] for q in quoted} == {
        "SplitkeeperNoGlobalCheckpoint",
        "SplitkeeperConsecutiveRegionalAtLimit",
    }
    for rule in quoted:
        assert {k: by_name[rule["alert"]][k] for k in rule} == rule, rule["alert"]


def test_a_regional_checkpoint_sets_the_region_chain_gauges(tmp_path: Path) -> None:
    # checkpoint 7 is regional: region 1 declined 7 (and 6), so it contributes 6's state, which refs 5
    seed = Seed(
        checkpoints=Counter({"global": 5, "regional": 1}),
        latest_id=6,
        refs={5: frozenset(), 6: frozenset({5})},
    )
    metrics = PipelineMetrics("chain", str(tmp_path / "state"), max_consecutive_failures=3, seed=seed)
    declined = RegionState(1, ref_checkpoint_id=6, outcome=RegionOutcome.DECLINE, ref_depth=2)
    completed = CompletedCheckpoint(
        7,
        CheckpointKind.REGIONAL,
        3,
        regions={0: RegionState(0), 1: declined, 2: RegionState(2)},
        consecutive_regional=2,
    )
    outcomes = {0: RegionOutcome.ACK, 1: RegionOutcome.DECLINE, 2: RegionOutcome.ACK}
    report = EpochReport(7, CheckpointKind.REGIONAL, outcomes, 10, 10, False, "", 0.1, completed=completed)
    try:
        metrics.observe(report)
    finally:
        metrics.close()
    samples = _samples(Path(metrics_path(str(tmp_path / "state"))).read_text(encoding="utf-8"))
    assert _by(samples, "splitkeeper_region_ref_checkpoint_id", "region") == {"0": 7, "1": 6, "2": 7}
    assert _by(samples, "splitkeeper_region_consecutive_regional_checkpoints", "region") == {
        "0": 0,
        "1": 2,
        "2": 0,
    }
    assert samples["splitkeeper_consecutive_regional_checkpoints"] == [({"pipeline": "chain"}, 2.0)]
    assert samples["splitkeeper_oldest_ref_checkpoint_id"] == [({"pipeline": "chain"}, 5.0)]
    assert _by(samples, "splitkeeper_checkpoints_total", "kind") == {"global": 5, "regional": 2, "aborted": 0}
    assert "splitkeeper_last_global_checkpoint_timestamp_seconds" not in samples  # no global one known
    assert samples["splitkeeper_last_checkpoint_timestamp_seconds"][0][1] > 1.7e9


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


def test_a_retry_of_a_store_call_counts_into_splitkeeper_store_retries_total(tmp_path: Path) -> None:
    """A Delta commit whose answer is lost (it landed, then the store call raised): the fence re-reads
    the table (a retry, fence step 5), and the metrics report it; no Spark."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from splitkeeper.delta import retries
    from splitkeeper.delta.fence import fenced_commit

    uri = str(tmp_path / "t")
    DeltaTable.create(uri, pa.schema([pa.field("w", pa.string())]))

    def landed_answer_lost(table: Any, properties: Any) -> None:
        write_deltalake(table, pa.table({"w": ["a"]}), mode="append", commit_properties=properties)
        raise OSError("Generic S3 error: error sending request: connection reset by peer")

    before = retries.counts()
    result = fenced_commit(
        DeltaTable(uri), pipeline="p", table_name="t", app_id="p", version=1, expected=None,
        write=landed_answer_lost, attempt="a",
    )  # fmt: skip
    assert result.metadata["attempt_id"] == "a"  # the commit stands, once
    after = retries.counts()
    assert after == {**before, "fence_reread": before["fence_reread"] + 1}
    idle = PipelineMetrics("p", str(tmp_path / "idle"), seed=Seed())
    idle.close()
    assert not Path(metrics_path(str(tmp_path / "idle"))).exists()  # no epoch, no retry: no file
    metrics = PipelineMetrics("p", str(tmp_path / "state"), seed=Seed())
    try:
        samples = _samples(metrics.text())
        retries.count("store_probe")  # a run the store stops before its first epoch retried meanwhile
    finally:
        metrics.close()
    assert _by(samples, "splitkeeper_store_retries_total", "operation") == after
    # no epoch, but a retry of this run: close writes the file, so the retry is seen
    written = _samples(Path(metrics_path(str(tmp_path / "state"))).read_text(encoding="utf-8"))
    assert _by(written, "splitkeeper_store_retries_total", "operation") == {
        **after, "store_probe": after["store_probe"] + 1
    }  # fmt: skip
