"""``readers: long_lived``: one Spark job's tasks serve the regions of every epoch of a run
(:mod:`splitkeeper.spark.readers`), and a region that raises, stalls or loses its Python worker
falls back alone while the sink ends equal to the source, by content."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.types import RegionOutcome
from splitkeeper.spark.readers import ReaderPool
from splitkeeper.spark.regions import RegionStatus

from .helpers import assert_sink_equals_source, pipeline_mapping, run_pipeline, sink_rows, write_input

pytestmark = [pytest.mark.spark]


def _reader_jobs(spark: Any, pipeline: str) -> dict[int, list[str]]:
    """The pipeline's reader jobs: job number -> the statuses of the Spark jobs of its group."""
    tracker = spark.sparkContext.statusTracker()
    out: dict[int, list[str]] = {}
    for number in range(1, 20):
        ids = tracker.getJobIdsForGroup(f"splitkeeper-{pipeline}-readers-{number}")
        if ids:
            out[number] = [str(tracker.getJobInfo(i).status) for i in ids]
    return out


def _failed(summary: Any) -> dict[int, dict[int, RegionOutcome]]:
    """epoch -> the regions that did not acknowledge, with their outcome."""
    out = {}
    for report in summary.epochs:
        failed = {r: o for r, o in report.outcomes.items() if o is not RegionOutcome.ACK}
        if failed:
            out[report.epoch] = failed
    return out


def test_the_pools_slots_serve_epoch_after_epoch_in_the_same_workers_and_a_raising_region_fails_alone(
    spark: Any,
) -> None:
    """Four epochs of three regions on the pool's slots (two on ``local[2]``): one Spark job, the same
    Python workers every epoch (no job launch per epoch), region 1 of epoch 2 failed alone with its error
    and its slot served the next epoch; after close the job has ended on its own."""

    def pid_or_raise(payload: tuple[int, int]) -> int:  # nested: cloudpickle ships it by value
        epoch, region = payload
        if (epoch, region) == (2, 1):
            raise RuntimeError("region 1 is broken in epoch 2")
        return os.getpid()

    pool = ReaderPool(spark, "pool", pid_or_raise)
    try:
        seen: list[dict[int, Any]] = []
        for epoch in range(1, 5):
            runs = pool.run_epoch(epoch, {r: (epoch, r) for r in range(3)}, timeout_s=60)
            seen.append({r: (run.status, run.result, run.error) for r, run in runs.items()})
    finally:
        pool.close()
    assert seen[1][1][0] is RegionStatus.FAILED and "RuntimeError: region 1 is broken" in seen[1][1][2]
    pids = {
        result for epoch in seen for status, result, _e in epoch.values() if status is RegionStatus.FINISHED
    }
    # the slots' workers served all 11 others (one slot may serve them all while the other starts)
    assert sum(len(e) for e in seen) == 12 and 1 <= len(pids) <= pool.cap, seen
    assert _reader_jobs(spark, "pool") == {1: ["SUCCEEDED"]}  # one job, ended by close, not cancelled


def test_one_job_serves_every_epoch_and_a_raising_and_a_stalled_region_fall_back_alone(
    spark: Any, tmp_path: Path
) -> None:
    """Many epochs on one reader job: region 1 raises in epoch 2 (declined, its task serves the next
    epoch) and region 0 stalls in epoch 4 (timed out, its task attempt killed; Spark's next attempt
    of it says hello for the same slot): only those regions fall back, the job is never replaced,
    and the sink equals the source."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=50)
    mapping = pipeline_mapping(
        tmp_path, "long-lived", input_dir, parallelism=2, epoch_records=40, region_timeout_s=15
    )
    mapping["readers"] = "long_lived"
    config = config_from_mapping(mapping)

    summary = run_pipeline(config, spark, faults=["fail:1@2", "stall:60:0@4"])

    assert summary.finished
    assert len(summary.epochs) >= 6
    assert _failed(summary) == {2: {1: RegionOutcome.DECLINE}, 4: {0: RegionOutcome.TIMEOUT}}
    assert "InjectedFault" in summary.epochs[1].region_errors[1]
    assert list(_reader_jobs(spark, "long-lived")) == [1]  # one reader job for the whole run
    assert_sink_equals_source(spark, config.sink.path, input_dir)


@pytest.mark.slow
def test_a_killed_python_worker_fails_its_region_alone_and_a_new_job_serves_the_rest(
    spark: Any, tmp_path: Path
) -> None:
    """A reader's Python worker is SIGKILLed mid-run (the transform kills its own pid on the record
    ``KILL:<file>``): on ``local[2]`` (one attempt per task) Spark aborts the reader job, the region whose
    worker died declines alone (the other slot's region runs again on the replacement job's slots),
    the next epochs run on a new reader job, and the sink equals the source."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=50)
    marker = tmp_path / "armed"
    marker.touch()
    (input_dir / "kill.txt").write_text("".join(f"k{i}\n" for i in range(30)) + f"KILL:{marker}\nafter\n")
    mapping = pipeline_mapping(
        tmp_path, "long-killed", input_dir, parallelism=2, epoch_records=40, region_timeout_s=30
    )
    mapping["readers"] = "long_lived"
    mapping["transform"] = "tests.runtime.long_lived_functions:kill_once"
    mapping["decode"] = {"kind": "text"}
    config = config_from_mapping(mapping)

    summary = run_pipeline(config, spark)

    assert summary.finished and not marker.exists()  # the kill fired once
    failed = _failed(summary)
    assert len(failed) == 1, failed
    [(epoch, regions)] = failed.items()
    assert list(regions.values()) == [RegionOutcome.DECLINE], failed
    report = next(e for e in summary.epochs if e.epoch == epoch)
    assert "Python worker exited" in next(iter(report.region_errors.values())), report.region_errors
    assert len(_reader_jobs(spark, "long-killed")) == 2  # the first aborted, a second served the rest
    assert_sink_equals_source(spark, config.sink.path, input_dir)


@pytest.mark.slow
@pytest.mark.kafka
def test_a_continuous_kafka_run_on_long_lived_readers_commits_every_message_once_through_faults(
    spark: Any, kafka_broker: Any, tmp_path: Path
) -> None:
    """``run --continuous`` on Kafka with long-lived readers while messages arrive: region 0 raises in
    epoch 2 and region 1 stalls past its timeout in epoch 4 (both while the backlog lasts, so both
    regions have ranges to read: a region with none runs no task, and its fault does not fire);
    only they fall back, the run stops on a global checkpoint, every message is in the sink once
    with its value, and one reader job served the whole run."""
    from splitkeeper.app.services import leased_pipeline

    from .test_kafka_source import create_topic, produce, unique

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 4, name=unique("long-lived"))
    sent = {p: [f"{p}-b{i}" for i in range(400)] for p in range(4)}  # 6 epochs of backlog
    produce(bootstrap, topic, sent)
    name = unique("ll")
    config = config_from_mapping(
        {
            "name": name,
            "parallelism": 2,
            "readers": "long_lived",
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic]},
            "backlog": {
                "backlog_epoch_records": 300,
                "normal_epoch_records": 300,
                "backlog_interval_s": 0.2,
                "normal_interval_s": 0.2,
            },
            "checkpoint": {"region_timeout_s": 20},
            "state": {"path": str(tmp_path / "state")},
            "sink": {"path": str(tmp_path / "sink")},
        }
    )
    epochs: list[str] = []
    stop = threading.Event()

    def trickle() -> None:
        for i in range(60):
            batch = {p: [f"{p}-t{i}"] for p in range(4)}
            produce(bootstrap, topic, batch)
            for p, values in batch.items():
                sent[p] += values
            time.sleep(0.1)

    def progress(line: str) -> None:
        if line.startswith("epoch"):
            epochs.append(line)
        if len([e for e in epochs if "final" not in e]) >= 12 and not producer.is_alive():
            stop.set()

    producer = threading.Thread(target=trickle, daemon=True)
    with leased_pipeline(
        config, spark, faults=["fail:0@2", "stall:60:1@4"], progress=progress, metrics=False
    ) as pipeline:
        pipeline.open()
        producer.start()
        summary = pipeline.run_continuously(stop.is_set)
    producer.join(timeout=30)

    assert summary.stopped and summary.epochs[-1].kind.value == "global", epochs[-3:]
    assert _failed(summary) == {2: {0: RegionOutcome.DECLINE}, 4: {1: RegionOutcome.TIMEOUT}}, epochs
    assert list(_reader_jobs(spark, name)) == [1]
    rows = sink_rows(config.sink.path)
    got = Counter((r.split_id, r.offset, r.value) for r in rows)
    want = Counter(
        (f"{topic}-{p}", offset, value.encode())
        for p, values in sent.items()
        for offset, value in enumerate(values)
    )
    assert got == want


def _continuous_kafka(bootstrap: str, topic: str, name: str, tmp_path: Path) -> Any:
    return config_from_mapping(
        {
            "name": name,
            "parallelism": 2,
            "readers": "long_lived",
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic]},
            "backlog": {"backlog_interval_s": 0.2, "normal_interval_s": 0.2},
            "checkpoint": {"region_timeout_s": 30},
            "state": {"path": str(tmp_path / "state")},
            "sink": {"path": str(tmp_path / "sink")},
        }
    )


def _wait_for(condition: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(0.05)


@contextlib.contextmanager
def _warmed_continuous_run(spark: Any, bootstrap: str, tmp_path: Path, label: str) -> Iterator[Any]:
    """A ``run --continuous`` with long-lived readers on a new empty 4-partition topic, in a thread,
    once both its reader slots warmed up: ``run.topic``, ``run.name``, ``run.config``,
    ``run.pipeline``, ``run.epochs`` (progress lines), ``run.summaries``. Stopped and joined on exit."""
    from splitkeeper.app.services import leased_pipeline

    from .test_kafka_source import create_topic, unique

    run = types.SimpleNamespace(topic=create_topic(bootstrap, 4, name=unique(label)), name=unique(label[:5]))
    run.config = _continuous_kafka(bootstrap, run.topic, run.name, tmp_path)
    run.epochs, run.summaries = [], []
    stop = threading.Event()
    with leased_pipeline(run.config, spark, progress=run.epochs.append, metrics=False) as pipeline:
        run.pipeline = pipeline
        pipeline.open()
        running = threading.Thread(
            target=lambda: run.summaries.append(pipeline.run_continuously(stop.is_set)), daemon=True
        )
        running.start()
        try:
            _wait_for(
                lambda: pipeline.runner.pool is not None and len(pipeline.runner.pool.warmed) == 2,
                "both reader slots warmed up",
            )
            yield run
        finally:
            stop.set()
            running.join(timeout=60)
    assert not running.is_alive()


def _assert_sink_holds(config: Any, topic: str, sent: dict[int, list[str]]) -> None:
    """The sink holds every value of ``sent`` (partition -> values in produce order) once, at its
    offset, and nothing else."""
    got = Counter((r.split_id, r.offset, r.value) for r in sink_rows(config.sink.path))
    assert got == Counter(
        (f"{topic}-{p}", offset, value.encode())
        for p, values in sent.items()
        for offset, value in enumerate(values)
    )


@pytest.mark.kafka
def test_a_continuous_run_starts_and_warms_its_reader_slots_before_the_first_record_and_stops_clean(
    spark: Any, kafka_broker: Any, tmp_path: Path
) -> None:
    """``run --continuous`` with long-lived readers on an empty topic: the reader job runs and each
    slot has warmed up (its Kafka consumer connected for its regions' partitions) before anything
    is produced, while every epoch reads nothing; then the records produced are committed once each
    with their values, and a stop ends the run on a global checkpoint with the reader job ended on
    its own (not cancelled)."""
    from .test_kafka_source import produce

    bootstrap = kafka_broker.bootstrap_servers
    with _warmed_continuous_run(spark, bootstrap, tmp_path, "warm") as run:
        warmed = dict(run.pipeline.runner.pool.warmed)
        jobs_before = _reader_jobs(spark, run.name)
        read_before = [line for line in run.epochs if line.startswith("epoch") and " 0 records" not in line]
        sent = {p: [f"{p}-v{i}" for i in range(50)] for p in range(4)}
        produce(bootstrap, run.topic, sent)
        _wait_for(lambda: len(sink_rows(run.config.sink.path)) >= 200, "the 200 records committed")
    assert all(isinstance(seconds, float) for seconds in warmed.values()), warmed  # no warm-up error
    assert jobs_before == {1: ["RUNNING"]}, jobs_before  # the reader job ran before any record existed
    assert read_before == [], read_before
    summary = run.summaries[0]
    assert summary.stopped and summary.epochs[-1].kind.value == "global", run.epochs[-3:]
    assert _failed(summary) == {}, run.epochs
    assert _reader_jobs(spark, run.name) == {1: ["SUCCEEDED"]}  # one job for the run, ended by the stop
    _assert_sink_holds(run.config, run.topic, sent)


@pytest.mark.kafka
def test_an_idle_continuous_run_whose_warmed_slot_dies_replaces_it_and_stops_clean(
    spark: Any, kafka_broker: Any, tmp_path: Path
) -> None:
    """A warmed-up reader slot's Python worker killed (SIGKILL) while the run is idle: the reader job
    fails (``local[N]`` gives a task one attempt), the next epoch with records starts a replacement
    job, every record is committed once, and the stop ends on a global checkpoint."""
    import signal

    from .test_kafka_source import produce

    bootstrap = kafka_broker.bootstrap_servers
    with _warmed_continuous_run(spark, bootstrap, tmp_path, "warm-kill") as run:
        victim = next(iter(run.pipeline.runner.pool._workers.values()))
        os.kill(victim.pid, signal.SIGKILL)
        _wait_for(
            lambda: 1 in _reader_jobs(spark, run.name) and _reader_jobs(spark, run.name)[1] != ["RUNNING"],
            "the reader job failed",
        )
        sent = {p: [f"{p}-v{i}" for i in range(30)] for p in range(4)}
        produce(bootstrap, run.topic, sent)
        _wait_for(lambda: len(sink_rows(run.config.sink.path)) >= 120, "the 120 records committed")
    summary = run.summaries[0]
    assert summary.stopped and summary.epochs[-1].kind.value == "global", run.epochs[-3:]
    jobs = _reader_jobs(spark, run.name)
    assert jobs[1] == ["FAILED"] and jobs[2] == ["SUCCEEDED"] and len(jobs) == 2, jobs
    _assert_sink_holds(run.config, run.topic, sent)


@pytest.mark.kafka
def test_a_kafka_readers_warm_up_keeps_a_connected_consumer_for_the_slots_first_read(
    kafka_broker: Any, tmp_path: Path
) -> None:
    """:func:`~splitkeeper.spark.task.warm_task` in a slot's ``kept_clients`` block: the Kafka reader
    connects one consumer and hands it back, the slot's next read borrows it and reads its range
    exactly, and nothing of the staging warm-up is left; a warm-up for a missing topic raises the
    read's error naming the split and keeps nothing."""
    from splitkeeper import clients
    from splitkeeper.core.types import Split
    from splitkeeper.errors import SourceError
    from splitkeeper.sources.kafka.source import KafkaRegionReader
    from splitkeeper.spark.task import WarmTask, warm_task

    from .test_kafka_source import create_topic, produce, unique

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2, name=unique("warm-reader"))
    produce(bootstrap, topic, {0: ["a", "b"], 1: ["c"]})
    splits = [Split(f"{topic}-{p}", topic, 0) for p in range(2)]
    reader = KafkaRegionReader(bootstrap, connect_timeout_s=10)
    with clients.kept_clients():
        assert isinstance(warm_task(WarmTask(reader, splits)), float)
        kept = clients._kept()
        assert kept is not None and len(kept) == 1
        [(consumer, _errors)] = [client for client, _close in kept.values()]
        columns = list(reader.read_ranges_columns([(splits[0], 0, 2), (splits[1], 0, 1)]))
        assert [c.values.to_pylist() for c in columns] == [[b"a", b"b"], [b"c"]]
        [(again, _errors)] = [client for client, _close in clients._kept().values()]  # type: ignore[union-attr]
        assert again is consumer  # the read borrowed the warm consumer and gave it back
        gone = Split(f"{topic}-missing-0", f"{topic}-missing", 0)
        with pytest.raises(SourceError, match="does not exist"):
            warm_task(WarmTask(reader, [gone]))
        assert clients._kept() == {}  # the failed warm-up closed the consumer it borrowed
