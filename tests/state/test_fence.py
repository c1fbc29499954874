"""The fence (splitkeeper.delta.fence) on real Delta tables, with real concurrent writer processes,
and two real drivers (``LocalPipeline``: the real driver, store, sink and region task body) held at
the sink's ``after_files_moved`` point until both are past every pre-check, racing the sink commit.

No Spark."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import CommitProperties, Transaction

from splitkeeper.core.ports import SinkCrashPoint
from splitkeeper.delta.fence import fenced_commit, recorded_commit
from splitkeeper.errors import ConcurrentRunError, StateError
from splitkeeper.sinks.delta.sink import DeltaSink

from . import workers
from .samples import LocalPipeline, assert_sink_is_input


@pytest.fixture
def table(tmp_path) -> str:
    uri = str(tmp_path / "fenced")
    DeltaTable.create(uri, pa.schema([pa.field("writer", pa.string())]))
    return uri


def _rows(uri: str) -> list[str]:
    return sorted(DeltaTable(uri).to_pyarrow_table().column("writer").to_pylist())


def _append(tag: str):
    def write(target, properties):
        write_deltalake(target, pa.table({"writer": [tag]}), mode="append", commit_properties=properties)

    return write


def _commit(uri_or_table, version, expected, tag, attempt=None, write=None, sends=1):
    target = DeltaTable(uri_or_table) if isinstance(uri_or_table, str) else uri_or_table
    return fenced_commit(
        target,
        pipeline="orders",
        table_name="fenced",
        app_id="orders",
        version=version,
        expected=expected,
        write=write or _append(tag),
        metadata={"note": tag},
        attempt=attempt if attempt is not None else tag,
        what="epoch",
        sends=sends,
    )


def test_two_writer_processes_of_the_same_version_one_lands_and_the_loser_leaves_nothing_visible(table):
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    procs = [
        context.Process(target=workers.fenced_writer, args=(table, 1, None, tag, barrier, results))
        for tag in ("run-a", "run-b")
    ]
    for p in procs:
        p.start()
    outcomes = {tag: (kind, detail) for tag, kind, detail in (results.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    assert {kind for kind, _ in outcomes.values()} == {"committed", "conflict"}, outcomes
    winner = next(tag for tag, (kind, _) in outcomes.items() if kind == "committed")
    loser, (_kind, params) = next((t, o) for t, o in outcomes.items() if o[0] == "conflict")
    assert params["pipeline"] == "orders" and params["table"] == "fenced" and params["epoch_id"] == 1
    assert params["found"] == 1 and params["expected"] is None
    assert _rows(table) == [winner]  # the loser's row is in no commit
    assert DeltaTable(table).transaction_version("orders") == 1
    assert recorded_commit(DeltaTable(table), "orders", 1)["attempt_id"] == winner != loser


def test_a_replay_of_the_same_attempt_writes_nothing_and_another_attempt_of_it_is_a_conflict(table):
    first = _commit(table, 1, None, "run-a")
    assert not first.replayed and first.metadata["note"] == "run-a"
    again = _commit(table, 1, None, "run-a")  # a redo of the same decision
    assert again.replayed and again.table_version == first.table_version == 1
    assert again.metadata["note"] == "run-a" and again.metadata["app_id"] == "orders"
    with pytest.raises(ConcurrentRunError) as err:
        _commit(table, 1, None, "run-b")
    text = str(err.value)
    assert "cannot commit epoch 1 to table fenced: it records epoch 1 but this run expected None" in text
    assert "only one run may drive a pipeline: this run stops, and the state is intact" in text
    assert _rows(table) == ["run-a"]


def test_an_unexpected_recorded_version_is_refused_before_anything_is_written(table):
    _commit(table, 1, None, "run-a")
    _commit(table, 2, 1, "run-a2")
    before = DeltaTable(table).version()
    with pytest.raises(ConcurrentRunError) as err:
        _commit(table, 3, 1, "stale")  # this run last saw epoch 1; another committed 2 since
    assert err.value.params["found"] == 2 and err.value.params["expected"] == 1
    assert DeltaTable(table).version() == before
    assert _rows(table) == ["run-a", "run-a2"]


def test_a_writer_that_checked_an_older_snapshot_fails_at_its_commit(table):
    stale = DeltaTable(table)  # this writer decided on version 0: nothing recorded
    _commit(table, 1, None, "rival")  # another run commits epoch 1 after that
    assert stale.transaction_version("orders") is None  # the check passes on the old snapshot ...
    with pytest.raises(ConcurrentRunError) as err:
        _commit(stale, 1, None, "late")  # ... and the commit on that snapshot fails
    assert err.value.params["found"] == 1
    assert _rows(table) == ["rival"]


def test_a_concurrent_commit_of_the_same_attempt_is_a_replay_not_a_conflict(table):
    stale = DeltaTable(table)
    _commit(table, 1, None, "twin", attempt="decision-1")  # the other process of the same redo
    result = _commit(stale, 1, None, "twin-2", attempt="decision-1")
    assert result.replayed
    assert _rows(table) == ["twin"]


def _lost_answer(write=None):
    """A write whose answer is lost: it runs ``write`` (the commit lands, or not when None), then
    the connection is reset, as an object store's reply dropped on the way back would be."""

    def lost(target, properties):
        if write is not None:
            write(target, properties)
        raise OSError("Generic S3 error: error sending request: connection reset by peer")

    return lost


def test_a_commit_whose_answer_is_lost_but_landed_is_committed_once(table):
    _commit(table, 1, None, "run-a")
    result = _commit(table, 2, 1, "run-a2", write=_lost_answer(_append("run-a2")))
    assert not result.replayed and result.metadata["attempt_id"] == "run-a2"
    assert result.table_version == DeltaTable(table).version() == 2
    assert _rows(table) == ["run-a", "run-a2"]  # once: nothing was written again


def test_a_commit_whose_answer_is_lost_and_did_not_land_says_so_and_the_next_commit_lands(table):
    _commit(table, 1, None, "run-a")
    with pytest.raises(StateError) as err:
        _commit(table, 2, 1, "run-a2", write=_lost_answer())
    text = str(err.value)
    assert text.startswith(
        "[STATE_ERROR] pipeline 'orders': the commit of epoch 2 to table fenced failed in the store"
    )
    assert "connection reset by peer" in text and "does not record it: nothing is committed" in text
    assert DeltaTable(table).transaction_version("orders") == 1 and _rows(table) == ["run-a"]
    assert not _commit(table, 2, 1, "run-a2").replayed  # the next run commits the epoch
    assert _rows(table) == ["run-a", "run-a2"]


def test_a_commit_that_did_not_land_is_sent_again_with_its_transaction_and_lands_once(table, monkeypatch):
    """Step 6: with ``sends``, a row commit the store failed before it landed is sent again (a
    fence_resend retry) on the table as read again, and lands once."""
    from splitkeeper.delta import retries

    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    _commit(table, 1, None, "run-a")
    sent = []
    landing = _append("run-a2")

    def fails_once(target, properties):
        sent.append(properties.app_transactions[0].version)
        if len(sent) == 1:
            raise OSError("Generic S3 error: error sending request: connection reset by peer")
        landing(target, properties)

    before = retries.counts()
    result = _commit(table, 2, 1, "run-a2", write=fails_once, sends=3)
    assert sent == [2, 2] and not result.replayed and result.metadata["attempt_id"] == "run-a2"
    assert retries.counts()["fence_resend"] == before["fence_resend"] + 1
    assert _rows(table) == ["run-a", "run-a2"] and DeltaTable(table).transaction_version("orders") == 2


def test_a_resent_commit_whose_first_copy_landed_late_is_that_commit_not_a_second(table, monkeypatch):
    """Step 6's safety: the first put was only slow and lands while the commit is sent again; the two
    meet in delta-rs's conflict check and the fence finds its own attempt's commit: one row."""
    from splitkeeper.delta import retries

    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    _commit(table, 1, None, "run-a")
    sent = []
    landing = _append("run-a2")

    def first_lands_late(target, properties):
        sent.append(1)
        if len(sent) == 1:
            raise OSError("Generic S3 error: operation timed out")
        landing(DeltaTable(target.table_uri), properties)  # the first copy lands now...
        landing(target, properties)  # ...and the resend, on the snapshot before it, is refused

    result = _commit(table, 2, 1, "run-a2", write=first_lands_late, sends=3)
    assert len(sent) == 2 and result.metadata["attempt_id"] == "run-a2"
    assert _rows(table) == ["run-a", "run-a2"]  # once


def test_a_commit_the_store_keeps_failing_is_sent_sends_times_then_a_state_error(table, monkeypatch):
    from splitkeeper.delta import retries

    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    _commit(table, 1, None, "run-a")
    sent = []

    def always_fails(target, properties):
        sent.append(1)
        raise OSError("Generic S3 error: HTTP 503 SlowDown")

    with pytest.raises(StateError) as err:
        _commit(table, 2, 1, "run-a2", write=always_fails, sends=3)
    assert len(sent) == 3 and "does not record it: nothing is committed" in str(err.value)
    assert _rows(table) == ["run-a"]


def test_a_lost_answer_while_another_run_committed_the_version_is_a_conflict(table):
    rival = _append("rival")

    def other_run_lands(target, _properties):  # another attempt's commit of the same version lands
        props = CommitProperties(
            app_transactions=[Transaction("orders", 1)],
            custom_metadata={"app_id": "orders", "attempt_id": "b"},
        )
        rival(DeltaTable(target.table_uri), props)

    with pytest.raises(ConcurrentRunError) as err:
        _commit(table, 1, None, "a", write=_lost_answer(other_run_lands))
    assert err.value.params["found"] == 1
    assert _rows(table) == ["rival"]


def test_commits_of_another_app_id_do_not_conflict(table):
    stale = DeltaTable(table)
    other = CommitProperties(app_transactions=[Transaction("another-pipeline", 7)])
    write_deltalake(table, pa.table({"writer": ["other"]}), mode="append", commit_properties=other)
    result = _commit(stale, 1, None, "mine")
    assert not result.replayed
    assert _rows(table) == ["mine", "other"]
    assert DeltaTable(table).transaction_version("another-pipeline") == 7


def test_two_real_drivers_past_every_pre_check_race_the_sink_commit_and_exactly_one_lands(tmp_path):
    """Driver A pauses in its sink commit (its plan and decision of epoch 1 written, its files moved);
    driver B opens meanwhile (as a run taking over a paused holder does), plans epoch 2 and reaches its
    own sink commit. Both expect nothing committed, so both pass every pre-check; then both commit."""
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)  # 60 records, 20 per epoch
    at_commit = threading.Barrier(2, timeout=60)

    def pause(point: SinkCrashPoint, epoch: int) -> None:
        if point is SinkCrashPoint.AFTER_FILES_MOVED:
            at_commit.wait()  # both drivers passed their fence check and the fence's own check

    outcomes: dict[str, object] = {}

    def run_epoch(name: str) -> None:
        try:
            driver = pipeline.driver(sink_point=pause)
            driver.open()
            outcomes[name] = driver.run_epoch()
        except BaseException as err:  # noqa: BLE001 - every outcome is asserted below
            outcomes[name] = err

    first = threading.Thread(target=run_epoch, args=("A",))
    first.start()
    deadline = time.monotonic() + 60
    while at_commit.n_waiting < 1 and first.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # A reaches its sink commit
    second = threading.Thread(target=run_epoch, args=("B",))
    second.start()
    for t in (first, second):
        t.join(timeout=120)
    assert not at_commit.broken and len(outcomes) == 2, outcomes
    losers = [name for name, o in outcomes.items() if isinstance(o, BaseException)]
    assert len(losers) == 1, outcomes  # exactly one commits
    loser, winner = losers[0], ({"A", "B"} - set(losers)).pop()
    err = outcomes[loser]
    assert type(err) is ConcurrentRunError and err.code == "CONCURRENT_RUN", repr(err)  # nothing else
    assert f"[CONCURRENT_RUN] pipeline {pipeline.name!r}" in str(err)
    won = outcomes[winner]
    assert won.committed_records > 0 and won.epoch == {"A": 1, "B": 2}[winner]
    sink = DeltaSink(pipeline.sink_path, pipeline.name, read_only=True)
    assert sink.committed_epoch() == won.epoch
    decisions = DeltaTable(f"{pipeline.state}/decisions").to_pyarrow_table(columns=["epoch_id", "attempt_id"])
    # the loser's decision row is gone: only the winner's, the one the sink commit names
    assert decisions.to_pylist() == [{"epoch_id": won.epoch, "attempt_id": sink.committed_attempt(won.epoch)}]
    rows = DeltaTable(pipeline.sink_path).to_pyarrow_table().num_rows
    assert rows == won.committed_records  # the loser's moved files are in no commit
    tracked = {os.path.basename(u) for u in DeltaTable(pipeline.sink_path).file_uris()}
    left = sorted(p for p in Path(pipeline.sink_path).glob("*.parquet") if p.name not in tracked)
    lost_epoch = {"A": 1, "B": 2}[loser]
    assert left and all(p.name.startswith(f"sk-e{lost_epoch:010d}-") for p in left)
    for p in left:  # a day later, maintain's leftover removal takes exactly the loser's files
        os.utime(p, (time.time() - 48 * 3600,) * 2)
    removed = DeltaSink(pipeline.sink_path, pipeline.name).remove_untracked(24, 0)
    assert sorted(name for name, _size in removed) == [p.name for p in left]
    assert not any(p.exists() for p in left)
    pipeline.run()  # a new driver finishes from the winner's checkpoint
    assert_sink_is_input(pipeline)


def test_a_state_append_whose_answer_is_reset_after_the_put_landed_is_in_the_table_once(faulty_s3):
    """Through the proxy to versitygw: the put of the append's ``_delta_log/2.json`` reaches the store
    and its answer is reset. object_store sends it again and meets its own commit; the append's app
    transaction makes delta-rs refuse the rebased copy, and the table holds the row once."""
    from splitkeeper.delta.storage import storage_options, table_uri
    from splitkeeper_tools.fault_proxy import Fault, is_conditional

    root = faulty_s3.location("state")
    seen: list[str] = []

    def reset_the_append(request):
        if (
            request.method == "PUT"
            and is_conditional(request)
            and request.path.endswith("/00000000000000000002.json")
        ):
            seen.append(request.path)
            return Fault(reset=True, after=True) if len(seen) == 1 else None
        return None

    faulty_s3.proxy.fault = reset_the_append
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    child = context.Process(target=workers.state_appender, args=(root, ["first", "second"], results))
    child.start()
    kind, detail = results.get(timeout=180)
    child.join(timeout=60)
    assert kind == "appended", detail
    assert faulty_s3.proxy.conditional_resets()["after_forwarding"] == 1 and len(seen) >= 1
    uri = table_uri(root + "/control")
    options = {**storage_options(uri), "AWS_ENDPOINT_URL": faulty_s3.endpoint}  # the store itself
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table().column("requested_by").to_pylist()) == ["first", "second"]
    assert table.version() == 2 and table.transaction_version(detail) == 2


@pytest.fixture
def faulty_s3(tmp_path, monkeypatch, versitygw):
    """versitygw behind the fault proxy (the chaos run's store), no faults yet; the AWS_* environment
    points at the proxy. The ``versitygw`` fixture builds the store when it is not built yet (a
    failed build fails the test), so these tests never skip."""
    from splitkeeper_tools.chaos.store import ChaosStore

    store = ChaosStore(tmp_path, seed=1, fault_rate=0.01, prefix="fence")
    store.start()
    try:
        assert store.proxy is not None
        store.proxy.fault = None
        for key, value in store.driver_env().items():
            monkeypatch.setenv(key, value)
        yield store
    finally:
        store.stop()


def _commit_in_a_child(uri: str, version: int, expected: int | None, tag: str) -> tuple[str, object]:
    """``tag``'s fenced commit in a spawned process (``workers.fenced_writer``): the proxy is a thread
    of this one, and delta-rs's ``history()`` keeps the GIL while it waits for the store."""
    context = multiprocessing.get_context("spawn")
    results, alone = context.Queue(), context.Barrier(1)  # kept until the child is done with them
    child = context.Process(target=workers.fenced_writer, args=(uri, version, expected, tag, alone, results))
    child.start()
    _tag, kind, detail = results.get(timeout=180)
    child.join(timeout=60)
    return kind, detail


@pytest.mark.parametrize("after", [False, True], ids=["reset-before-the-put", "reset-after-the-put-landed"])
def test_a_delta_commit_whose_connection_is_reset_on_a_real_store_ends_exact(faulty_s3, after):
    """Through the proxy to versitygw: the conditional put of ``_delta_log/2.json`` meets a reset
    before it reaches the store (not landed) or after the store took it (landed, answer lost).
    Either way epoch 2 ends committed exactly once: at once, or by the next attempt after a
    ``[STATE_ERROR]`` that committed nothing."""
    from splitkeeper.delta.storage import storage_options, table_uri
    from splitkeeper_tools.fault_proxy import Fault, is_conditional

    location = faulty_s3.location("fenced")
    uri, options = table_uri(location), storage_options(location)
    DeltaTable.create(uri, pa.schema([pa.field("writer", pa.string())]), storage_options=options)
    _commit(DeltaTable(uri, storage_options=options), 1, None, "run-a")
    seen: list[str] = []

    def reset_the_commit(request):
        if request.method == "PUT" and is_conditional(request) and "/_delta_log/" in request.path:
            seen.append(request.path)
            return Fault(reset=True, after=after) if len(seen) == 1 else None
        return None

    faulty_s3.proxy.fault = reset_the_commit
    kind, detail = _commit_in_a_child(uri, 2, 1, "run-a2")
    if kind == "error":  # not landed (nothing retried it): [STATE_ERROR], nothing committed
        assert not after and "[STATE_ERROR]" in detail and "nothing is committed" in detail, detail
        assert DeltaTable(uri, storage_options=options).transaction_version("orders") == 1
        kind, detail = _commit_in_a_child(uri, 2, 1, "run-a2")  # the next attempt lands
    assert kind == "committed", detail
    assert seen[0].endswith("/_delta_log/00000000000000000002.json")
    key = "after_forwarding" if after else "before_forwarding"
    assert faulty_s3.proxy.conditional_resets() == {
        "before_forwarding": 0, "after_forwarding": 0, key: 1
    }  # fmt: skip
    # read on the store itself (delta-rs's history() keeps the GIL: the proxy, a thread here, would stall)
    table = DeltaTable(uri, storage_options={**options, "AWS_ENDPOINT_URL": faulty_s3.endpoint})
    assert table.transaction_version("orders") == 2 and table.version() == 2  # one commit of epoch 2
    assert recorded_commit(table, "orders", 2)["attempt_id"] == "run-a2"
    assert sorted(table.to_pyarrow_table().column("writer").to_pylist()) == ["run-a", "run-a2"]
