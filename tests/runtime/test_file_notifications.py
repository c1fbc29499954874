"""``source.discovery: notifications`` (issue 38 item 3): files found through a bucket's events.

- The S3 event notification format as versitygw writes it (and AWS): parsed with the standard
  library; the store's test event and other kinds are ignored; what is not the format is an
  EventError (the source skips, counts and logs it, and lists the prefix whole).
- The config: the mode needs ``source.notifications`` and an object store; its keys are checked as
  the Kafka source's, named ``source.notifications.*``.
- The positions: a checkpoint's ``discovery`` column round-trips; a row without it (state written
  before it) restores with none; the enumerator takes the source's positions at each snapshot and
  gives them back at a restore.
- A real versitygw publishing to the project's broker (``s3_events``): a first discovery lists the
  prefix and takes the topic's end offsets from before the listing; later ones read the events
  (no listing), a removed object is a removed file, a restore from the positions reads the events
  since them again, a message that is not an event is counted and makes that discovery a listing,
  and a topic that does not exist is named.
- End to end (slow): ``splitkeeper run --continuous`` from the bucket, files put while it runs,
  the run SIGKILLed mid-way and restarted (files put while it was down too): the sink holds every
  line of every file exactly once, by content; the checkpoints' event offsets advance and the
  restart goes on from them (no whole listing for want of positions).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.enumerator import RecordingEnumeratorContext, enumerator_for
from splitkeeper.core.ports import EpochDecision
from splitkeeper.core.source import StaticSplitSource, SupportsDiscoveryPositions
from splitkeeper.core.types import CheckpointKind, CompletedCheckpoint, EnumeratorSnapshot, Split
from splitkeeper.delta import serde
from splitkeeper.errors import ConfigError, SourceError
from splitkeeper.sources.files import fs as files_fs
from splitkeeper.sources.files.notify import EventError, EventFeed, parse_events
from splitkeeper.sources.files.source import FileSource

from .helpers import CLI, assert_sink_equals_source, pipeline_mapping, subprocess_env, write_config

#: An event as versitygw v1.8 publishes it (one record per message; the key as written).
VERSITYGW_EVENT = {
    "Records": [
        {
            "eventVersion": "2.2",
            "eventSource": "aws:s3",
            "eventName": "s3:ObjectCreated:Put",
            "s3": {
                "s3SchemaVersion": "1.0",
                "configurationId": "webhook-global",
                "bucket": {"name": "chaos", "arn": "arn:aws:s3:::/chaos/test/drops/a b+c.txt"},
                "object": {"key": "test/drops/a b+c.txt", "size": 6, "eTag": '"b1946ac9"', "sequencer": "1"},
            },
        }
    ]
}


# --------------------------------------------------------------------------- the format


def test_an_object_event_is_parsed_with_its_bucket_key_size_and_etag_and_both_spellings_of_the_key() -> None:
    (event,) = parse_events(json.dumps(VERSITYGW_EVENT).encode())
    assert (event.name, event.bucket, event.key, event.size, event.etag, event.sequencer) == (
        "s3:ObjectCreated:Put",
        "chaos",
        "test/drops/a b+c.txt",
        6,
        '"b1946ac9"',
        "1",
    )
    assert event.created and not event.removed
    assert event.keys == ("test/drops/a b+c.txt", "test/drops/a b c.txt")
    aws = json.loads(json.dumps(VERSITYGW_EVENT))
    aws["Records"][0]["eventName"] = "ObjectRemoved:Delete"  # AWS writes it without the s3: prefix
    aws["Records"][0]["s3"]["object"] = {"key": "test/drops/x%C3%A9.txt", "sequencer": "0A"}
    (gone,) = parse_events(json.dumps(aws))
    assert gone.removed and gone.size is None and gone.keys[-1] == "test/drops/xé.txt"


def test_the_test_event_and_other_kinds_are_no_objects_and_what_is_not_the_format_is_an_event_error() -> None:
    test_event = {"Service": "S3", "Event": "s3:TestEvent", "Time": "2026-12-05T08:48:55Z", "Bucket": "b"}
    assert parse_events(json.dumps(test_event).encode()) == []
    tagging = json.loads(json.dumps(VERSITYGW_EVENT))
    tagging["Records"][0]["eventName"] = "s3:ObjectTagging:Put"
    assert parse_events(json.dumps(tagging)) == []
    no_key = json.loads(json.dumps(VERSITYGW_EVENT))
    del no_key["Records"][0]["s3"]["object"]["key"]
    for bad, why in [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"Records": {}}', "no Records"),
        (b'{"Records": [{"s3": {}}]}', "no eventName"),
        (json.dumps(no_key).encode(), "s3.object.key"),
        (None, "empty message"),
    ]:
        with pytest.raises(EventError, match=why):
            parse_events(bad)


# --------------------------------------------------------------------------- the config


def _files_mapping(tmp_path: Path, **source: Any) -> dict[str, Any]:
    mapping = pipeline_mapping(tmp_path / "run", "notified", tmp_path)
    mapping["source"].update(source)
    return mapping


def test_the_mode_needs_its_topic_and_an_object_store_and_the_topic_needs_the_mode(tmp_path: Path) -> None:
    topic = {"bootstrap_servers": "127.0.0.1:9092", "topic": "bucket-events"}
    with pytest.raises(ConfigError, match=r"source\.notifications.*required when source\.discovery"):
        config_from_mapping(_files_mapping(tmp_path, path="s3://b/in", discovery="notifications"))
    with pytest.raises(ConfigError, match=r"source\.path.*object-store URI.*notifications"):
        config_from_mapping(
            _files_mapping(tmp_path, path=str(tmp_path), discovery="notifications", notifications=topic)
        )
    with pytest.raises(ConfigError, match=r"source\.discovery.*notifications when source\.notifications"):
        config_from_mapping(_files_mapping(tmp_path, path="s3://b/in", notifications=topic))
    with pytest.raises(ConfigError, match=r"source\.notifications\.bootstrap_servers"):
        config_from_mapping(
            _files_mapping(
                tmp_path,
                path="s3://b/in",
                discovery="notifications",
                notifications={"bootstrap_servers": "no-port", "topic": "t"},
            )
        )
    with pytest.raises(ConfigError, match=r"source\.notifications\.client\.group\.id"):
        config_from_mapping(
            _files_mapping(
                tmp_path,
                path="s3://b/in",
                discovery="notifications",
                notifications={**topic, "client": {"group.id": "mine"}},
            )
        )
    config = config_from_mapping(
        _files_mapping(
            tmp_path,
            path="s3://b/in",
            discovery="notifications",
            notifications={**topic, "client": {"sasl.password": "secret", "security.protocol": "SASL_SSL"}},
        )
    )
    notified = config.source.notifications
    assert notified.servers == "127.0.0.1:9092" and notified.topic == "bucket-events"
    assert notified.client_settings["sasl.password"] == "secret"
    assert "secret" not in repr(config.source) and "secret" not in json.dumps(
        config.source.model_dump(mode="json")
    )


# --------------------------------------------------------------------------- the positions


def _checkpoint(discovery: dict[str, int]) -> CompletedCheckpoint:
    snapshot = EnumeratorSnapshot(checkpoint_id=7, parallelism=1, assignments={0: ()}, discovery=discovery)
    return CompletedCheckpoint(7, CheckpointKind.GLOBAL, 1, {}, snapshot)


def test_the_positions_are_a_column_of_the_checkpoint_and_a_row_without_it_restores_with_none() -> None:
    row = serde.checkpoint_to_row(_checkpoint({"events:0": 12, "events:1": 3}))
    assert row["discovery"] == [{"key": "events:0", "position": 12}, {"key": "events:1", "position": 3}]
    back = serde.checkpoint_from_rows(row)
    assert back.enumerator is not None and back.enumerator.discovery == {"events:0": 12, "events:1": 3}
    assert serde.checkpoint_to_row(_checkpoint({}))["discovery"] is None
    old = {k: v for k, v in row.items() if k != "discovery"}  # state written before the column
    restored = serde.checkpoint_from_rows(old)
    assert restored.enumerator is not None and restored.enumerator.discovery == {}
    decision_row = serde.decision_to_row(
        EpochDecision(checkpoint=_checkpoint({"events:0": 5}), attempt_id="a")
    )
    assert serde.decision_from_row(decision_row).checkpoint.enumerator.discovery == {"events:0": 5}


class _Positioned(StaticSplitSource, SupportsDiscoveryPositions):
    def __init__(self) -> None:
        super().__init__("positioned", [Split("s", subscription="t", position=0, end=1)], ["t"])
        self.positions: dict[str, int] = {"t:0": 0}
        self.restored: list[Any] = []

    def discovery_positions(self) -> dict[str, int]:
        return dict(self.positions)

    def restore_discovery_positions(self, positions: Any) -> None:
        self.restored.append(None if positions is None else dict(positions))
        self.positions = dict(positions or {})


def test_the_enumerator_takes_the_sources_positions_at_each_snapshot_and_gives_them_back_at_a_restore() -> (
    None
):
    source = _Positioned()
    context = RecordingEnumeratorContext(1)
    fresh = enumerator_for(source, context)
    assert source.restored == [None]  # a start without a checkpoint says so
    fresh.start()
    context.register_reader(0, [])
    fresh.add_reader(0)
    source.positions = {"t:0": 41, "t:1": 2}
    snapshot = fresh.snapshot(1)
    assert snapshot.discovery == {"t:0": 41, "t:1": 2}
    source.positions = {"t:0": 99}  # read on after the checkpoint: forgotten by the restore
    enumerator_for(source, RecordingEnumeratorContext(1), restored=snapshot)
    assert source.restored[-1] == {"t:0": 41, "t:1": 2} and source.positions == {"t:0": 41, "t:1": 2}


# --------------------------------------------------------------------------- a real store and broker


def _fs() -> Any:
    from splitkeeper.delta.storage import filesystem

    return filesystem("s3://chaos")[0]


def _put(uri: str, data: bytes) -> None:
    with _fs().open_output_stream(uri[len("s3://") :]) as out:
        out.write(data)


def _ends(feed: EventFeed) -> int:
    return sum(high for _low, high in feed.partitions().values())


def _await_events(feed: EventFeed, at_least: int, timeout_s: float = 30) -> None:
    """versitygw publishes after it answers (a goroutine): wait until the topic holds them."""
    deadline = time.monotonic() + timeout_s
    while _ends(feed) < at_least:
        assert time.monotonic() < deadline, f"the store published {_ends(feed)} events, not {at_least}"
        time.sleep(0.1)
    time.sleep(0.5)  # and those of folder markers (pyarrow writes them), which may come first


def _discover(source: FileSource, *, recheck: bool) -> set[str]:
    source.check_splits([], {}, recheck_finished=recheck)
    return {s.split_id for s in source.discover_splits()}


def test_discovery_reads_the_events_since_its_positions_and_a_restore_reads_them_again(
    s3_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files_fs, "SETTLE_NS", -(10**12))
    drops = s3_events.store.location("drops")
    feed = EventFeed(s3_events.bootstrap_servers, s3_events.topic)
    _put(f"{drops}/a.txt", b"a1\na2\n")
    _await_events(feed, 2)  # the store's test event, a.txt (its folder marker, maybe, too)
    source = FileSource(drops, discovery="notifications", events=feed)
    source.restore_discovery_positions(None)  # a start without a checkpoint

    assert _discover(source, recheck=False) == {"a.txt"}  # no positions: one listing
    assert source.listings == 1
    first = source.discovery_positions()
    assert set(first) == {f"{s3_events.topic}:0", f"{s3_events.topic}:1"}

    before = _ends(feed)
    _put(f"{drops}/b.txt", b"b1\n")
    _put(f"{drops}/_tmp.txt", b"skipped\n")
    _put("s3://chaos/test/elsewhere/c.txt", b"another prefix\n")
    _await_events(feed, before + 3)
    assert _discover(source, recheck=False) == {"b.txt"}
    assert source.listings == 1  # the events named b.txt: nothing was listed
    second = source.discovery_positions()
    assert sum(second.values()) > sum(first.values())

    before = _ends(feed)
    _fs().delete_file(drops[len("s3://") :] + "/a.txt")
    _await_events(feed, before + 1)
    assert _discover(source, recheck=False) == set()
    assert source.removed_paths == (f"{drops}/a.txt",)

    # a restore from the first positions: the events since them say b.txt came and a.txt went
    restarted = FileSource(
        drops, discovery="notifications", events=EventFeed(feed.bootstrap_servers, feed.topic)
    )
    restarted.restore_discovery_positions(first)
    assert _discover(restarted, recheck=True) == {"b.txt"}  # the restore's own recheck: the events
    assert restarted.listings == 0
    assert restarted.discovery_positions() == source.discovery_positions()
    assert _discover(restarted, recheck=True) == set() and restarted.listings == 0  # the first epoch's
    assert _discover(restarted, recheck=True) == {"b.txt"} and restarted.listings == 1  # the periodic one

    from confluent_kafka import Producer

    before = _ends(feed)
    producer = Producer({"bootstrap.servers": feed.bootstrap_servers})
    producer.produce(feed.topic, b"this is not an event", partition=0)
    producer.flush(10)
    _put(f"{drops}/d.txt", b"d1\n")
    _await_events(feed, before + 2)
    assert _discover(restarted, recheck=False) == {"b.txt", "d.txt"}  # listed whole instead
    assert restarted.skipped_events == 1 and restarted.listings == 2
    restarted.close()
    source.close()


def test_a_skipped_message_and_the_listing_it_caused_are_in_the_runs_metrics_and_in_status(
    s3_events: Any, tmp_path: Path
) -> None:
    """Two one-epoch runs (``splitkeeper run``'s service, with its metrics) over an empty prefix, so
    no record is read and no JVM starts: the first lists the prefix (no positions yet) and
    checkpoints the topic's offsets; before the second, a message that is not an S3 event lands on
    the topic. The second run's discovery reads it from the checkpoint's offsets, skips it and lists
    whole: its metrics count both, and ``status`` shows them."""
    from splitkeeper.app import services
    from splitkeeper.app.metrics import discovery_counts
    from splitkeeper.config.settings import load_config

    from .helpers import run_cli

    feed = EventFeed(s3_events.bootstrap_servers, s3_events.topic)
    _await_events(feed, 1)  # the store's test event (an event of no object: not skipped)
    mapping = pipeline_mapping(tmp_path / "run", "counted", tmp_path)
    mapping["source"].update(
        path=s3_events.store.location("drops"),
        discovery="notifications",
        notifications={"bootstrap_servers": s3_events.bootstrap_servers, "topic": s3_events.topic},
        recheck_finished_every=1000,
    )
    path = write_config(tmp_path / "pipeline.yaml", mapping)
    config = load_config(path)
    services.run(config, epochs=1)
    first = services.status(config).discovery
    assert first["skipped_events"] == 0 and first["listings"] >= 1, first  # no positions: it lists
    (checkpoint,) = _checkpoints(path)
    assert checkpoint.enumerator is not None and checkpoint.enumerator.discovery  # the offsets

    from confluent_kafka import Producer

    before = _ends(feed)
    producer = Producer({"bootstrap.servers": feed.bootstrap_servers})
    producer.produce(feed.topic, b"this is not an event", partition=1)
    producer.flush(10)
    _await_events(feed, before + 1)
    services.run(config, epochs=1)

    counts = services.status(config).discovery
    assert counts == {"listings": 1, "skipped_events": 1}  # this run's: the skip made its one listing
    code, out, _err = run_cli(["status", "--config", str(path), "--metrics"])
    assert code == 0 and discovery_counts(out) == counts
    assert 'splitkeeper_discovery_skipped_events_total{pipeline="counted"} 1.0' in out, out
    code, out, _err = run_cli(["status", "--config", str(path)])
    assert "event discovery (last run): 1 full listings, 1 messages of the event topic skipped" in out, out


def test_a_move_told_by_the_events_is_found_again_until_it_is_applied(
    s3_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change whose ids a caller may hold (the enumerator's first discovery holds them until the
    driver applies the change) does not advance the positions: the next discovery reads the same
    events and finds the move again; once the known splits say so, the positions go on."""
    monkeypatch.setattr(files_fs, "SETTLE_NS", -(10**12))
    drops = s3_events.store.location("moves")
    feed = EventFeed(s3_events.bootstrap_servers, s3_events.topic)
    _put(f"{drops}/a.txt", b"a1\na2\n")
    _await_events(feed, 2)
    source = FileSource(drops, discovery="notifications", events=feed)
    source.restore_discovery_positions(None)
    source.check_splits([], {}, recheck_finished=False)
    (split,) = source.discover_splits()
    finished = {split.split_id: split.identity}
    before, positions = _ends(feed), source.discovery_positions()
    fs = _fs()
    fs.copy_file(drops[len("s3://") :] + "/a.txt", drops[len("s3://") :] + "/archive/a.txt")
    fs.delete_file(drops[len("s3://") :] + "/a.txt")
    _await_events(feed, before + 2)
    for _ in range(2):  # not applied: found again, the positions stay
        changes = source.check_splits([], finished, recheck_finished=False)
        assert [(c.split_id, c.kind.value, c.moved_to) for c in changes] == [
            ("a.txt", "moved", "archive/a.txt")
        ]
        source.discover_splits()
        assert source.discovery_positions() == positions and source.listings == 1
    applied = {"archive/a.txt": changes[0].identity}  # what the enumerator knows once it applied it
    assert source.check_splits([], applied, recheck_finished=False) == []
    source.discover_splits()
    assert sum(source.discovery_positions().values()) > sum(positions.values())
    source.close()


def test_an_event_topic_that_does_not_exist_is_named_with_the_fix(s3_events: Any) -> None:
    drops = s3_events.store.location("drops")
    feed = EventFeed(s3_events.bootstrap_servers, "no-such-topic-here", timeout_s=5)
    source = FileSource(drops, discovery="notifications", events=feed)
    with pytest.raises(
        SourceError, match=r"source\.notifications\.topic 'no-such-topic-here' does not exist"
    ):
        _discover(source, recheck=True)
    source.close()


# --------------------------------------------------------------------------- end to end


def _lines(tag: str, n: int) -> bytes:
    return b"".join(b"%s-%04d %s\n" % (tag.encode(), i, b"x" * (i % 17)) for i in range(n))


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(CLI), "run", "--config", str(config), "--continuous"],
            env=subprocess_env(**{k: os.environ[k] for k in os.environ if k.startswith("AWS_")}),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _checkpoints(config: Path) -> list[CompletedCheckpoint]:
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore

    loaded = load_config(config)
    store = DeltaStateStore(loaded.state.path, loaded.name, None, read_only=True)
    return [store.load_checkpoint(i) for i in store.ids()]


def _await_sink(
    sink: Path, lines: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 240
) -> None:
    from .helpers import sink_rows

    deadline = time.monotonic() + timeout_s
    while True:
        have = len(sink_rows(sink)) if (sink / "_delta_log").exists() else 0
        if have >= lines:
            return
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, (
            f"{have} of {lines} lines after {timeout_s}s\n" + log.read_text()[-4000:]
        )
        time.sleep(1)


@pytest.mark.kafka
@pytest.mark.slow  # two runs, each with its own JVM, and a wait for the files put while they run
def test_files_put_while_runs_go_and_a_sigkilled_run_are_ingested_once_from_the_events(
    s3_events: Any, tmp_path: Path
) -> None:
    local = tmp_path / "expected"
    local.mkdir()
    drops = s3_events.store.location("drops")

    def put(name: str, n: int) -> int:
        data = _lines(name, n)
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_bytes(data)
        _put(f"{drops}/{name}", data)
        return n

    expected = put("before-0.txt", 120) + put("before-1.txt", 90)
    mapping = pipeline_mapping(
        tmp_path / "run", "notified", local, parallelism=2, epoch_records=80, region_timeout_s=90
    )
    mapping["source"].update(
        path=drops,
        discovery="notifications",
        notifications={"bootstrap_servers": s3_events.bootstrap_servers, "topic": s3_events.topic},
        recheck_finished_every=1000,  # the listings here are the first run's; the restart reads events
    )
    mapping["backlog"].update(backlog_interval_s=1.0, normal_interval_s=1.0)
    config = write_config(tmp_path / "pipeline.yaml", mapping)
    sink = tmp_path / "run" / "sink"
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"

    first = _start(config, first_log)
    try:
        _await_sink(sink, 1, first, first_log)  # it runs: its first listing is done
        expected += put("during-0.txt", 150) + put("sub/during-1.txt", 60)
        _await_sink(sink, expected - 100, first, first_log)
        expected += put("during-2.txt", 200)
        _await_sink(sink, expected - 150, first, first_log)  # during-2.txt found and being read
    finally:
        first.send_signal(signal.SIGKILL)  # mid-way: the rest of during-2.txt is not committed yet
        first.wait(30)
    positions = [c.enumerator.discovery for c in _checkpoints(config) if c.enumerator is not None]
    assert positions and all(positions), positions
    totals = [sum(p.values()) for p in positions]
    assert totals == sorted(totals) and totals[-1] > totals[0], totals  # the offsets advance

    expected += put("down-0.txt", 70)  # while no run is up: its event waits in the topic
    second = _start(config, second_log)
    try:
        _await_sink(sink, expected - 70, second, second_log)
        expected += put("after-0.txt", 50)
        _await_sink(sink, expected, second, second_log)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, second_log.read_text()[-4000:]

    assert_sink_equals_source(None, sink, local)
    restart = second_log.read_text()
    assert "no event offsets are checkpointed yet" not in restart, restart[-4000:]
    assert "no event offsets are checkpointed yet" in first_log.read_text()
    final = _checkpoints(config)[-1].enumerator
    assert final is not None and sum(final.discovery.values()) > totals[-1]
