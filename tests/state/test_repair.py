"""A restore checks what it restores: lost or damaged state rows are refused naming the table and
the file, never read as an older snapshot, and the advice each error gives is tried here.

Real state from the real driver, store and sink (:class:`LocalPipeline`, no Spark), damaged on
disk the way it happens to real folders: a log entry deleted or garbled, a parquet file truncated,
a row rewritten by another tool, the sink's newest commit lost.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable

from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.tables import StateTables
from splitkeeper.errors import StateError

from .samples import LocalPipeline, assert_sink_is_input, global_, tree

REPAIR = "splitkeeper recover --config <the pipeline config> --repair"


def _started(tmp_path: Path, epochs: int = 3) -> LocalPipeline:
    """A pipeline partway through its input: some checkpoints committed, more to read."""
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)
    pipeline.run(epochs)
    return pipeline


def _store(pipeline: LocalPipeline, *, read_only: bool = True) -> DeltaStateStore:
    return DeltaStateStore(pipeline.state, pipeline.name, None, read_only=read_only)


def _repair(pipeline: LocalPipeline) -> tuple[list[str], list[int]]:
    """What ``recover --repair`` does (the service adds the lease): (moved paths, rewritten ids)."""
    from splitkeeper.delta.repair import repair_files, repair_rows

    report = repair_files(StateTables(pipeline.state))  # before the store: it opens every table
    repair_rows(_store(pipeline, read_only=False), report)
    return report.moved, report.rewritten


def _newest_log(pipeline: LocalPipeline, table: str) -> str:
    return sorted(glob.glob(f"{pipeline.state}/{table}/_delta_log/*.json"))[-1]


def _refused(pipeline: LocalPipeline, *, store_reads: bool = True, new_sink: bool = False) -> StateError:
    """A dry open, the restart and (``store_reads``) the store's own read refuse the state with the same
    StateError, writing nothing."""
    sink_before, state_before = tree(pipeline.sink_path), tree(pipeline.state)
    if store_reads:
        with pytest.raises(StateError) as status:
            _store(pipeline).latest_checkpoint()
    with pytest.raises(StateError) as dry:
        pipeline.driver(read_only=True).open(read_only=True)
    with pytest.raises(StateError) as restart:
        pipeline.run()
    assert str(restart.value) == str(dry.value)
    if store_reads:
        assert str(restart.value) == str(status.value)
    if new_sink:  # opening a sink creates its empty table (version 0), as it always did; no records
        assert DeltaTable(pipeline.sink_path).version() == 0
    else:
        assert tree(pipeline.sink_path) == sink_before, "a refused restore changed the sink"
    lease = {k for k in tree(pipeline.state) if k.startswith("lease/")}
    assert {k: v for k, v in tree(pipeline.state).items() if k not in lease} == {
        k: v for k, v in state_before.items() if k not in lease
    }, "a refused restore changed the state"
    return restart.value


def test_a_deleted_enumerator_state_log_entry_is_refused_not_restored_as_the_older_checkpoint(tmp_path):
    pipeline = _started(tmp_path)
    committed = _store(pipeline).latest_checkpoint()
    assert committed is not None
    os.remove(_newest_log(pipeline, "enumerator_state"))  # the step: the latest entry is gone

    err = _refused(pipeline)  # before: the restart read checkpoint 2's positions and wrote duplicates
    message = str(err)
    assert message.startswith("[STATE_ERROR]")
    assert f"checkpoint {committed.checkpoint_id}" in message
    assert f"state table enumerator_state ({pipeline.state}/enumerator_state)" in message
    assert f"{pipeline.state}/enumerator_state/_delta_log" in message
    assert REPAIR in message

    moved, rewritten = _repair(pipeline)  # the advice
    assert moved == [] and rewritten == [committed.checkpoint_id]
    assert _store(pipeline).latest_checkpoint() == committed  # exactly what was committed
    assert _repair(pipeline) == ([], [])  # nothing left to repair
    pipeline.run()
    assert_sink_is_input(pipeline)


def test_a_truncated_enumerator_state_file_is_named_and_repair_moves_it_aside(tmp_path):
    pipeline = _started(tmp_path)
    committed = _store(pipeline).latest_checkpoint()
    assert committed is not None
    folder = f"{pipeline.state}/enumerator_state/checkpoint_id={committed.checkpoint_id}"
    (damaged,) = glob.glob(f"{folder}/*.parquet")
    os.truncate(damaged, 100)

    message = str(_refused(pipeline))  # before: pyarrow.lib.ArrowInvalid, no table or advice
    assert "[STATE_ERROR] table enumerator_state" in message
    assert f"data file {damaged} is damaged, truncated or missing" in message
    assert REPAIR in message

    moved, rewritten = _repair(pipeline)
    assert moved == [damaged] and rewritten == [committed.checkpoint_id]
    assert not os.path.exists(damaged)
    assert os.path.exists(damaged.replace("/state/enumerator_state/", "/state/_damaged/enumerator_state/"))
    assert _store(pipeline).latest_checkpoint() == committed
    pipeline.run()
    assert_sink_is_input(pipeline)


def test_garbage_in_the_newest_enumerator_state_log_entry_is_named_and_repaired(tmp_path):
    pipeline = _started(tmp_path)
    committed = _store(pipeline).latest_checkpoint()
    assert committed is not None
    entry = _newest_log(pipeline, "enumerator_state")
    Path(entry).write_bytes(Path(entry).read_bytes()[:57] + b"\x00garbage")

    message = str(_refused(pipeline))
    assert f"[STATE_ERROR] the Delta table at {pipeline.state}/enumerator_state cannot be read" in message
    assert f"log file {entry}" in message
    assert REPAIR in message

    moved, rewritten = _repair(pipeline)
    assert moved == [entry] and rewritten == [committed.checkpoint_id]
    assert _store(pipeline).latest_checkpoint() == committed
    pipeline.run()
    assert_sink_is_input(pipeline)


def test_a_damaged_older_enumerator_state_log_entry_is_named_and_repair_refuses_to_move_it(tmp_path):
    pipeline = _started(tmp_path)
    entry = sorted(glob.glob(f"{pipeline.state}/enumerator_state/_delta_log/*.json"))[1]
    Path(entry).write_text("not json\n")
    before = tree(pipeline.state)
    with pytest.raises(StateError) as err:
        _repair(pipeline)
    assert os.path.basename(entry) in str(err.value) and "restore them" in str(err.value)
    assert {k: v for k, v in tree(pipeline.state).items() if not k.startswith("lease/")} == {
        k: v for k, v in before.items() if not k.startswith("lease/")
    }


@pytest.mark.parametrize("position", [None, -1])
def test_an_enumerator_row_with_a_bad_position_is_repaired_as_its_error_advises(tmp_path, position):
    root = str(tmp_path / "state")
    store = DeltaStateStore(root, "orders", "files:/in")
    decision = decision_for(global_(1))
    store.write_decision(decision)
    store.commit_checkpoint(decision)
    attempt = store.kept()[1][0].attempt_id
    value = "NULL" if position is None else str(position)
    DeltaTable(f"{root}/enumerator_state").update(
        updates={"position": value}, predicate=f"split_id = 's0' AND attempt_id = '{attempt}'"
    )
    with pytest.raises(StateError) as err:
        DeltaStateStore(root, "orders", None, read_only=True).latest_checkpoint()
    assert f"state table enumerator_state: checkpoint 1 holds split 's0' at position {position!r}" in str(
        err.value
    )
    assert REPAIR in str(err.value)  # before: "recover from an older checkpoint's state", which failed
    from splitkeeper.delta.repair import repair_files, repair_rows

    report = repair_rows(DeltaStateStore(root, "orders", None), repair_files(StateTables(root)))
    assert report.rewritten == [1]
    assert DeltaStateStore(root, "orders", None, read_only=True).latest_checkpoint() == global_(1)


def test_a_checkpoint_row_with_a_bad_position_is_restored_from_a_backup_as_its_error_advises(tmp_path):
    root = tmp_path / "state"
    store = DeltaStateStore(str(root), "orders", "files:/in")
    store.commit_checkpoint(decision_for(global_(1)))
    store.commit_checkpoint(decision_for(global_(2)))
    shutil.copytree(root, tmp_path / "backup")  # a backup taken after checkpoint 2
    table = DeltaTable(f"{root}/checkpoints")
    rows = table.to_pyarrow_table().to_pylist()
    assert rows
    DeltaTable(f"{root}/checkpoints").delete("checkpoint_id = 2")
    row = next(r for r in rows if r["checkpoint_id"] == 2)
    row["regions"][1]["splits"][0]["position"] = -3
    from deltalake import write_deltalake

    from splitkeeper.delta.schemas import TABLES

    write_deltalake(f"{root}/checkpoints", TABLES["checkpoints"].rows([row]), mode="append")
    with pytest.raises(StateError) as err:
        DeltaStateStore(str(root), "orders", None, read_only=True).latest_checkpoint()
    assert "state table checkpoints: checkpoint 2" in str(err.value)
    assert "Restore the state directory from a backup taken after this checkpoint" in str(err.value)
    shutil.rmtree(root)
    shutil.copytree(tmp_path / "backup", root)  # the advice
    assert DeltaStateStore(str(root), "orders", None, read_only=True).latest_checkpoint() == global_(2)


def test_a_truncated_checkpoints_file_is_named_and_a_backup_of_it_is_what_the_error_advises(tmp_path):
    pipeline = _started(tmp_path)
    committed = _store(pipeline).latest_checkpoint()
    assert committed is not None
    (damaged,) = glob.glob(f"{pipeline.state}/checkpoints/checkpoint_id={committed.checkpoint_id}/*.parquet")
    backup = Path(damaged).read_bytes()
    os.truncate(damaged, 10)
    message = str(_refused(pipeline))
    assert f"[STATE_ERROR] table checkpoints at {pipeline.state}/checkpoints cannot be read" in message
    assert (
        f"data file {damaged}" in message
        and "Restore that file (or the state directory) from a backup" in message
    )
    Path(damaged).write_bytes(backup)  # the advice
    pipeline.run()
    assert_sink_is_input(pipeline)


@pytest.mark.parametrize("loss", ["newest commit", "whole sink"])
def test_a_sink_that_lost_commits_is_refused_and_its_backup_is_what_the_error_advises(tmp_path, loss):
    pipeline = _started(tmp_path)
    latest = _store(pipeline).latest_checkpoint()
    assert latest is not None
    shutil.copytree(pipeline.sink_path, tmp_path / "sink-backup")
    if loss == "newest commit":
        os.remove(sorted(glob.glob(f"{pipeline.sink_path}/_delta_log/*.json"))[-1])
        lost = f"the sink records epoch {latest.checkpoint_id - 1} as its last commit"
    else:
        shutil.rmtree(pipeline.sink_path)  # or the config pointed at a fresh sink
        lost = "the sink has no commit of this pipeline"

    # before: the restart read on from the checkpoint, and the lost records never came back
    message = str(_refused(pipeline, store_reads=False, new_sink=loss == "whole sink"))
    assert lost in message
    assert f"the state's latest checkpoint is {latest.checkpoint_id}" in message
    assert "Restore the sink table from a backup" in message
    shutil.rmtree(pipeline.sink_path)
    shutil.copytree(tmp_path / "sink-backup", pipeline.sink_path)  # the advice
    pipeline.run()
    assert_sink_is_input(pipeline)
