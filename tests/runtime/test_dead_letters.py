"""The dead-letter table: staged dead.parquet files committed exactly once with the sink's epoch,
under the same fence and redo record, at every crash point (real SIGKILLs). No Spark.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from splitkeeper.core.ports import RegionRun
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA
from splitkeeper.errors import ConcurrentRunError, StagedOutputError
from splitkeeper.records.decode import BadRecords
from splitkeeper.sinks.delta.read import read_dead_letters, read_sink
from splitkeeper.sinks.delta.sink import DeltaSink
from splitkeeper.spark.dead_letters import DEAD_FILE, DeadLetterWriter
from splitkeeper.spark.faults import CRASH_ENV
from splitkeeper.spark.task import StagedWriter
from splitkeeper.staging import PART_FILE

REPO = Path(__file__).resolve().parents[2]


def _stage(root: str, epoch: int, region: int, split_id: str, offsets: range, bad: set[int]) -> str:
    """A region attempt as a region task leaves it: part.parquet with the good records of ``offsets``
    and, when some are ``bad``, dead.parquet with those (raw bytes, stage decode)."""
    folder = os.path.join(root, f"epoch={epoch}", f"region={region}", f"attempt={uuid.uuid4().hex}")
    with StagedWriter(os.path.join(folder, PART_FILE), epoch, region) as writer:
        writer.add(split_id, [(o, o + 1, f"{split_id}@{o}") for o in offsets if o not in bad])
        part = writer.commit().path
    dead = DeadLetterWriter(os.path.join(folder, DEAD_FILE), epoch, region)
    wrong = BadRecords()
    for i, o in enumerate(offsets):
        if o in bad:
            wrong.add(i, "decode", f"not valid UTF-8 at {o}", "UnicodeDecodeError")
    values = pa.array([b"\xff\xfe" + str(o).encode() for o in offsets], pa.binary())
    dead.add(
        split_id,
        pa.array(list(offsets), pa.int64()),
        pa.array([o + 1 for o in offsets], pa.int64()),
        None,
        values,
        wrong,
    )
    dead.commit()
    return part


def _ack(region: int, path: str | None) -> RegionRun:
    return RegionRun(region_id=region, outcome=RegionOutcome.ACK, output=path)


def _dead(path: str) -> list[tuple[str, int, bytes, int]]:
    rows = read_dead_letters(path, ["split_id", "offset", "value", "epoch"]).to_pylist()
    return sorted((r["split_id"], r["offset"], r["value"], r["epoch"]) for r in rows)


def _sink(path: str) -> list[tuple[str, int]]:
    return sorted((r["split_id"], r["offset"]) for r in read_sink(path, ["split_id", "offset"]).to_pylist())


def test_the_writer_writes_the_table_schema_atomically_and_nothing_without_bad_records(tmp_path):
    folder = tmp_path / "epoch=3" / "region=1" / "attempt=a1"
    writer = DeadLetterWriter(str(folder / DEAD_FILE), 3, 1)
    assert writer.commit() is None and not folder.exists()
    bad = BadRecords()
    bad.add(1, "decode", "not valid UTF-8", "UnicodeDecodeError")
    bad.add(3, "transform", ValueError("boom"))
    meta = (
        pa.array([b"k0", b"k1", None, b"k3"], pa.binary()),
        pa.array(["t"] * 4),
        pa.array([2] * 4, pa.int32()),
        pa.array([0, 1, 2, 3], pa.timestamp("ms", tz="UTC")),
    )
    values = pa.array([b"a", b"\xff", None, b""], pa.binary())
    offsets = pa.array([10, 11, 12, 13], pa.int64())
    n = writer.add("t-2", offsets, pa.compute.add(offsets, 1), meta[0], values, bad, meta)
    assert n == 2 and writer.records == 2
    path = writer.commit()
    assert path == str(folder / DEAD_FILE) and os.listdir(folder) == [DEAD_FILE]  # no temporary left
    table = pq.read_table(path)
    assert table.schema.equals(DEAD_LETTER_SCHEMA)
    rows = table.to_pylist()
    assert [(r["offset"], r["key"], r["value"], r["stage"], r["error_class"]) for r in rows] == [
        (11, b"k1", b"\xff", "decode", "UnicodeDecodeError"),
        (13, b"k3", b"", "transform", "ValueError"),
    ]
    assert {(r["epoch"], r["region"], r["attempt_id"], r["topic"], r["partition"]) for r in rows} == {
        (3, 1, "a1", "t", 2)
    }
    assert rows[1]["error_message"] == "boom" and rows[1]["failed_at"] is not None


def test_an_epoch_commits_its_dead_letters_once_with_the_sink_and_a_replay_adds_nothing(tmp_path):
    staging, dead_path = str(tmp_path / "staging"), str(tmp_path / "dead")
    sink = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=dead_path)
    parts = [
        _stage(staging, 1, 0, "f-0", range(0, 6), {1, 4}),
        _stage(staging, 1, 1, "f-1", range(0, 3), set()),  # a region without bad records has no file
    ]
    assert not os.path.exists(os.path.join(os.path.dirname(parts[1]), DEAD_FILE))
    receipt = sink.commit(1, [_ack(0, parts[0]), _ack(1, parts[1])], expected=None, attempt_id="d1")
    assert receipt.records == 7 and not receipt.replayed
    recorded = sink.committed_metadata(1)
    assert recorded is not None and recorded.metadata["dead_letter_records"] == 2
    [entry] = recorded.metadata["dead_letters"]
    assert entry["rows"] == 2 and entry["path"].endswith(".parquet")
    assert sink.dead_letter_epoch() == 1
    assert _dead(dead_path) == [("f-0", 1, b"\xff\xfe1", 1), ("f-0", 4, b"\xff\xfe4", 1)]
    assert _sink(sink.path) == [("f-0", o) for o in (0, 2, 3, 5)] + [("f-1", o) for o in range(3)]
    # sink and dead letters together: every offset once
    both = sorted(_sink(sink.path) + [(s, o) for s, o, _v, _e in _dead(dead_path)])
    assert both == [("f-0", o) for o in range(6)] + [("f-1", o) for o in range(3)]

    replay = sink.commit(1, [_ack(0, parts[0])], expected=None, attempt_id="d1")
    assert replay.replayed
    assert len(_dead(dead_path)) == 2 and DeltaTable(dead_path).version() == 1
    # an epoch without dead letters: no dead-letter commit
    sink.commit(2, [_ack(0, _stage(staging, 2, 0, "f-0", range(6, 8), set()))], expected=1, attempt_id="d2")
    assert sink.dead_letter_epoch() == 1 and DeltaTable(dead_path).version() == 1
    sink.commit(3, [_ack(0, _stage(staging, 3, 0, "f-0", range(8, 10), {9}))], expected=2, attempt_id="d3")
    assert sink.dead_letter_epoch() == 3 and [o for _s, o, _v, e in _dead(dead_path) if e == 3] == [9]


def test_a_fence_loser_commits_no_dead_letter(tmp_path):
    staging, dead_path = str(tmp_path / "staging"), str(tmp_path / "dead")
    sink = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=dead_path)
    sink.commit(1, [_ack(0, _stage(staging, 1, 0, "f-0", range(0, 3), {0}))], expected=None, attempt_id="w")
    other = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=dead_path)
    late = _stage(staging, 2, 0, "f-0", range(3, 6), {3, 4})
    sink.commit(2, [_ack(0, _stage(staging, 2, 0, "f-0", range(3, 6), {5}))], expected=1, attempt_id="w2")
    with pytest.raises(ConcurrentRunError):
        other.commit(2, [_ack(0, late)], expected=1, attempt_id="loser")
    assert [(o, e) for _s, o, _v, e in _dead(dead_path)] == [(0, 1), (5, 2)]


def test_dead_letters_without_a_dead_letter_table_are_refused_before_anything_moves(tmp_path):
    staging = str(tmp_path / "staging")
    sink = DeltaSink(tmp_path / "sink", "orders", staging_path=staging)
    part = _stage(staging, 1, 0, "f-0", range(0, 3), {1})
    with pytest.raises(StagedOutputError, match="errors.dead_letter.path"):
        sink.commit(1, [_ack(0, part)], expected=None, attempt_id="x")
    assert sink.committed_epoch() is None and os.path.exists(part)


def test_a_damaged_dead_letter_file_stops_the_commit(tmp_path):
    staging = str(tmp_path / "staging")
    sink = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=tmp_path / "dead")
    part = _stage(staging, 1, 0, "f-0", range(0, 3), {1})
    Path(os.path.dirname(part), DEAD_FILE).write_bytes(b"PAR1 not really")
    with pytest.raises(StagedOutputError, match="dead-letter file"):
        sink.commit(1, [_ack(0, part)], expected=None, attempt_id="x")
    assert sink.committed_epoch() is None and os.path.exists(part)


_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests!r})
    from splitkeeper.sinks.delta.sink import DeltaSink
    from splitkeeper.spark.faults import crash_if_requested
    from tests.runtime.test_dead_letters import _ack, _stage
    staging, sink_path, dead_path = sys.argv[1:4]
    sink = DeltaSink(sink_path, "orders", staging_path=staging, dead_letter_path=dead_path,
                     crash_point=crash_if_requested)
    expected = None
    for epoch in (1, 2):
        part = _stage(staging, epoch, 0, "f-0", range((epoch - 1) * 5, epoch * 5), {{(epoch - 1) * 5 + 2}})
        sink.commit(epoch, [_ack(0, part)], expected=expected, attempt_id=f"a{{epoch}}")
        expected = epoch
    print("done", flush=True)
    """
)


@pytest.mark.parametrize("crash", ["before_dead_letter_commit@2", "after_sink_commit@2", None])
def test_sigkill_between_the_sink_commit_and_the_dead_letter_commit_is_repaired_on_open(tmp_path, crash):
    staging, sink_path, dead_path = (str(tmp_path / n) for n in ("staging", "sink", "dead"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(CRASH_ENV, None)
    if crash is not None:
        env[CRASH_ENV] = crash
    child = subprocess.run(
        [sys.executable, "-c", _CHILD.format(tests=str(REPO)), staging, sink_path, dead_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if crash is None:
        assert child.returncode == 0, child.stderr
    elif crash.startswith("before_dead_letter_commit"):
        assert child.returncode == -9, child.stderr
        assert "crash injected at before_dead_letter_commit of epoch 2" in child.stderr
        reader = DeltaSink(sink_path, "orders", read_only=True, dead_letter_path=dead_path)
        assert reader.committed_epoch() == 2 and reader.dead_letter_epoch() == 1  # the redo is pending
        assert [o for _s, o, _v, _e in _dead(dead_path)] == [2]  # epoch 2's file moved, untracked
        assert len(os.listdir(dead_path)) == 3  # _delta_log + 2 data files
    else:  # after_sink_commit is the driver's point: this child has no driver, it never dies there
        assert child.returncode == 0, child.stderr
    for _ in range(2):  # the open repairs; a second open finds nothing to do
        sink = DeltaSink(sink_path, "orders", staging_path=staging, dead_letter_path=dead_path)
        assert sink.dead_letter_epoch() == 2
    assert _dead(dead_path) == [("f-0", 2, b"\xff\xfe2", 1), ("f-0", 7, b"\xff\xfe7", 2)]
    both = sorted(_sink(sink_path) + [(s, o) for s, o, _v, _e in _dead(dead_path)])
    assert both == [("f-0", o) for o in range(10)]  # sink ∪ dead letters exact, each offset once


def test_a_dead_letter_commit_the_store_fails_is_a_state_error_and_the_next_open_commits_it(
    tmp_path, monkeypatch
):
    """Found by the chaos run on a faulty store: a connection reset on the dead-letter table's commit,
    after the sink commit landed, killed the driver with a raw OSError traceback. It is now a
    [STATE_ERROR] naming the table and saying the next run finishes it; the next open does (rule d)."""
    from splitkeeper.errors import StateError

    staging, dead_path = str(tmp_path / "staging"), str(tmp_path / "dead")
    sink = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=dead_path)
    sink.commit(1, [_ack(0, _stage(staging, 1, 0, "f-0", range(0, 3), {0}))], expected=None, attempt_id="a")
    [side] = sink._sides

    def reset(*_args, **_kwargs):
        raise OSError("Generic S3 error: error sending request: connection reset by peer")

    monkeypatch.setattr(side, "commit", reset)
    with pytest.raises(StateError) as err:
        sink.commit(2, [_ack(0, _stage(staging, 2, 0, "f-0", range(3, 6), {4}))], expected=1, attempt_id="b")
    text = str(err.value)
    assert text.startswith("[STATE_ERROR]") and "epoch 2's sink commit landed" in text
    assert "dead-letter" in text and "connection reset by peer" in text and "run again" in text
    assert sink.committed_epoch() == 2 and sink.dead_letter_epoch() == 1  # the side commit is pending
    monkeypatch.undo()
    again = DeltaSink(tmp_path / "sink", "orders", staging_path=staging, dead_letter_path=dead_path)
    assert again.dead_letter_epoch() == 2
    assert _dead(dead_path) == [("f-0", 0, b"\xff\xfe0", 1), ("f-0", 4, b"\xff\xfe4", 2)]
    both = sorted(_sink(again.path) + [(s, o) for s, o, _v, _e in _dead(dead_path)])
    assert both == [("f-0", o) for o in range(6)]
