"""Backlog tracking (protocol section 4): boundaries, deduplicated reports, persisted done set."""

from __future__ import annotations

import pytest

from splitkeeper.core.assignment import strategy_by_name
from splitkeeper.core.backlog import BacklogConfig, BacklogTracker
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, restart_reader
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError


def log_split(n: int, boundary: int | None) -> Split:
    return Split(f"log-{n}", "log", position=0, backlog_end=boundary)


def test_processing_backlog_until_every_tracked_split_reported_once():
    tracker = BacklogTracker()
    tracker.track_all([log_split(0, 100), log_split(1, 50)])
    assert tracker.processing_backlog is True
    assert tracker.report_finished("log-0") is True
    assert tracker.report_finished("log-0") is False  # deduplicated
    assert tracker.processing_backlog is True and tracker.splits_in_backlog() == ["log-1"]
    assert tracker.report_finished("log-1") is True
    assert tracker.processing_backlog is False


def test_bounded_and_snapshot_only_splits_are_not_tracked():
    tracker = BacklogTracker()
    assert tracker.track(Split("file-0", "f", end=10, backlog_end=10)) is False  # bounded
    assert tracker.track(log_split(0, None)) is False  # no boundary: snapshot-only
    assert tracker.processing_backlog is False
    assert tracker.report_finished("file-0") is False


def test_done_set_survives_snapshot_and_restore_so_a_restart_does_not_report_again():
    tracker = BacklogTracker()
    tracker.track_all([log_split(0, 100), log_split(1, 50)])
    tracker.report_finished("log-0")
    snap = tracker.snapshot()
    assert snap.boundaries == {"log-0": 100, "log-1": 50} and snap.finished == frozenset({"log-0"})

    restored = BacklogTracker()
    restored.restore(snap)
    assert restored.report_finished("log-0") is False
    assert restored.processing_backlog is True
    assert restored.reached("log-1", 49) is False and restored.reached("log-1", 50) is True


def test_reset_records_new_boundaries_and_puts_splits_back_in_backlog():
    tracker = BacklogTracker()
    tracker.track(log_split(0, 100))
    tracker.report_finished("log-0")
    tracker.track(log_split(0, 999))  # rediscovery does not move a recorded boundary
    assert tracker.boundary("log-0") == 100 and tracker.processing_backlog is False
    tracker.reset({"log-0": 500})
    assert tracker.boundary("log-0") == 500 and tracker.processing_backlog is True
    with pytest.raises(InvalidParameterError, match=r"end_offsets\['log-0'\]=-1"):
        tracker.reset({"log-0": -1})


def test_config_chooses_throughput_settings_during_backlog_and_latency_afterwards():
    config = BacklogConfig(
        backlog_epoch_records=50_000, normal_epoch_records=500, backlog_interval_s=30, normal_interval_s=2
    )
    assert (config.epoch_records(True), config.interval_s(True)) == (50_000, 30)
    assert (config.epoch_records(False), config.interval_s(False)) == (500, 2)
    with pytest.raises(
        InvalidParameterError, match=r"normal_epoch_records=0 is not allowed: an integer >= 1"
    ):
        BacklogConfig(normal_epoch_records=0)
    with pytest.raises(
        InvalidParameterError, match=r"backlog_interval_s=-1 is not allowed: a number of seconds > 0"
    ):
        BacklogConfig(backlog_interval_s=-1)


def test_enumerator_tracks_discovered_boundaries_and_persists_reports_across_restore():
    ctx = RecordingEnumeratorContext(1)
    enum = SplitEnumerator(ctx, strategy_by_name("round-robin"), reassign_on_recovery=True)
    enum.start()
    restart_reader(enum, ctx, 0)
    enum.add_splits([log_split(0, 100), log_split(1, 40), Split("file-0", "log", end=5)])
    assert enum.processing_backlog is True
    assert enum.report_backlog_finished("log-1") is True
    snap = enum.snapshot(1)

    ctx2 = RecordingEnumeratorContext(1)
    enum2 = SplitEnumerator(ctx2, strategy_by_name("round-robin"), reassign_on_recovery=True)
    enum2.restore(snap)
    enum2.start()
    restart_reader(enum2, ctx2, 0, snap.assignments[0])
    assert enum2.report_backlog_finished("log-1") is False  # reported before the restart
    assert enum2.processing_backlog is True
    assert enum2.report_backlog_finished("log-0") is True
    assert enum2.processing_backlog is False


def test_enumerator_reset_backlog_marks_the_splits_and_rejects_unknown_ids():
    ctx = RecordingEnumeratorContext(1)
    enum = SplitEnumerator(ctx, strategy_by_name("round-robin"), reassign_on_recovery=True)
    enum.start()
    restart_reader(enum, ctx, 0)
    enum.add_splits([log_split(0, None), Split("file-0", "log", end=5)])
    assert enum.processing_backlog is False
    enum.reset_backlog({"log-0": 700, "file-0": 5})
    assert enum.split("log-0").backlog_end == 700  # type: ignore[union-attr]
    assert enum.split("file-0").backlog_end is None  # type: ignore[union-attr]  # bounded: not tracked
    assert enum.processing_backlog is True
    with pytest.raises(InvalidParameterError, match=r"end_offsets=\['nope'\]"):
        enum.reset_backlog({"nope": 1})


def test_dropped_split_stops_holding_the_pipeline_in_backlog():
    ctx = RecordingEnumeratorContext(1)
    enum = SplitEnumerator(
        ctx, strategy_by_name("round-robin"), reassign_on_recovery=True, subscriptions={"log", "old"}
    )
    enum.start()
    restart_reader(enum, ctx, 0)
    enum.add_splits([Split("old-0", "old", backlog_end=10)])
    assert enum.processing_backlog is True
    enum.set_subscriptions({"log"})
    assert enum.processing_backlog is False
