"""In-run restart checks on the real runtime (issue 39 item 1): each restore inside a run is proven
before the run reads on, recorded in the validations table, counted in the metrics
(``splitkeeper_restart_checks_total{verdict}``), and shown by the run's result, status and the
report; a failed one stops the run with [STATE_ERROR] before anything is planned."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.restarts import RestartCheckError
from splitkeeper.core.types import (
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.validations import ValidationRecords
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.sources.files.source import FileSource
from tests.runtime.helpers import assert_sink_equals_source, pipeline_mapping, write_input


def _metric(text: str, verdict: str) -> float:
    for line in text.splitlines():
        if line.startswith("splitkeeper_restart_checks_total{") and f'verdict="{verdict}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no splitkeeper_restart_checks_total for {verdict}:\n{text}")


@pytest.mark.spark
def test_a_run_proves_its_restore_and_a_regions_fallback_and_says_so(spark, tmp_path: Path) -> None:
    write_input(tmp_path / "in", files=2, lines=30)
    mapping = pipeline_mapping(tmp_path, "proven", tmp_path / "in", parallelism=2, epoch_records=40)
    config = config_from_mapping(mapping)
    first = services.run(config)
    assert first.restart_checks == ()  # a fresh start restores nothing
    latest = first.epochs[-1].epoch

    write_input(tmp_path / "in", files=2, lines=30, first_file=2)  # new files: the next run reads them
    second = services.run(config, faults=[f"fail:1@{latest + 1}"])
    assert [e.kind for e in second.epochs][0] == "regional"  # region 1 declined: it falls back
    assert second.restart_checks[:2] == (
        f"global restore of checkpoint {latest} (readers 0-1), before epoch {latest + 1}: "
        "rules 6.1, 6.2, 6.3, 6.5, 6.6 passed",
        f"region fallback of checkpoint {latest + 1} (reader 1), before epoch {latest + 2}: "
        "rules 6.1, 6.2, 6.3, 6.5, 6.6 passed",
    )
    assert_sink_equals_source(spark, config.sink.path, tmp_path / "in")

    lines = services.status(config).restart_checks
    assert lines and all("in-run check" in line and line.endswith("PASSED") for line in lines)
    assert "in-run check of the global restore of checkpoint" in lines[-1]
    metrics = services.metrics_text(config)
    assert _metric(metrics, "passed") == len(second.restart_checks) and _metric(metrics, "failed") == 0
    page = services.report(config).read_text(encoding="utf-8")
    assert f"in-run checks: {len(second.restart_checks)} passed" in page


def _probe_state(tmp_path: Path) -> tuple[object, Path]:
    """A files pipeline whose state holds the audit probe's chain 105 -> 104 -> 102 -> 101 -> 100
    (max_consecutive_failures 2; each region's own fallbacks one deep), as the coordinator built it
    before ref chains were bounded whole; the sink records epoch 105."""
    write_input(tmp_path / "in", files=2, lines=5)
    mapping = pipeline_mapping(tmp_path, "probe", tmp_path / "in", parallelism=2, max_consecutive_failures=2)
    config = config_from_mapping(mapping)
    store = DeltaStateStore(config.state.path, config.name, FileSource(tmp_path / "in").fingerprint())
    splits = {r: (Split(f"gone-{r}.txt", str(tmp_path / "in"), 0),) for r in range(2)}
    for cid, refs in ((100, {}), (101, {1: 100}), (102, {1: 101}), (104, {0: 102}), (105, {1: 104})):
        regions = {
            r: RegionState(
                r,
                splits[r],
                ref_checkpoint_id=refs.get(r),
                outcome=RegionOutcome.DECLINE if r in refs else RegionOutcome.ACK,
                ref_depth=1 if r in refs else 0,
            )
            for r in range(2)
        }
        snapshot = EnumeratorSnapshot(
            cid, 2, assignments=splits, subscriptions=frozenset({str(tmp_path / "in")})
        )
        kind = CheckpointKind.REGIONAL if refs else CheckpointKind.GLOBAL
        store.commit_checkpoint(decision_for(CompletedCheckpoint(cid, kind, 2, regions, snapshot, len(refs))))
    DeltaSink(config.sink.path, config.name, staging_path=tmp_path / "staging").commit(
        105, [], expected=None, attempt_id="probe"
    )
    return config, tmp_path


def test_a_run_restoring_the_probes_chain_stops_before_reading_and_every_view_says_why(
    tmp_path: Path,
) -> None:
    """No Spark starts: the check fails at the open, before an epoch would read."""
    config, _root = _probe_state(tmp_path)
    with pytest.raises(RestartCheckError) as err:
        services.run(config)
    text = str(err.value)
    assert text.startswith(
        "[STATE_ERROR] pipeline 'probe': the global restore of checkpoint 105 is not proven: protocol rule "
        "6.6 (ref_chain_too_deep) fails for split(s) none named: checkpoint 104 has a ref chain of depth 3; "
        "max_consecutive_failures=2"
    )
    assert "checkpoint 105 has a ref chain of depth 4" in text
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    assert store.latest_plan_epoch() is None  # nothing of the next epoch was planned
    [row] = ValidationRecords(store.tables, config.name).recorded(in_run=True)
    assert (row.restore, row.checkpoint_id, row.verdict, row.suites["6.6"]) == (
        "global_restore",
        105,
        "failed",
        "failed",
    )
    assert "rule 6.6 ref_chain_too_deep: checkpoint 104 has a ref chain of depth 3" in row.detail
    [line] = services.status(config).restart_checks
    assert "in-run check of the global restore of checkpoint 105 (readers 0, 1; before epoch 106)" in line
    assert "FAILED: rule 6.6 ref_chain_too_deep" in line
    assert _metric(services.metrics_text(config), "failed") == 1
    page = services.report(config).read_text(encoding="utf-8")
    assert "in-run checks: 0 passed, 1 FAILED" in page and "ref_chain_too_deep" in page
