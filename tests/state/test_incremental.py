"""Incremental enumerator state (DeltaStateStore rule 6): deltas against a full snapshot.

Pure tests of the reconstruction (snapshot + delta == full), then the store: restore,
history, retention and compaction, orphan attempts and redo, regional checkpoints, state
written before the rule (every checkpoint full), and the config key.
"""

from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.core.ports import CrashPoint
from splitkeeper.core.types import BacklogSnapshot, CompletedCheckpoint, EnumeratorSnapshot, Split
from splitkeeper.delta import serde
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.history import merge_delta
from splitkeeper.delta.schemas import spec
from splitkeeper.errors import CheckpointError, ConfigError, InvalidParameterError, StateError

from .samples import Crash, CrashAt, LocalPipeline, global_, regional


def _snapshot(checkpoint_id: int, rng: random.Random, n: int = 60, readers: int = 3) -> EnumeratorSnapshot:
    """A snapshot whose entries move between statuses as ``checkpoint_id`` grows (seeded)."""
    finished = {f"s{i:03d}" for i in range(n) if rng.random() < 0.3}
    live = [i for i in range(n) if f"s{i:03d}" not in finished and rng.random() < 0.9]
    assignments: dict[int, list[Split]] = {r: [] for r in range(readers)}
    pool: list[Split] = []
    quarantined: list[Split] = []
    for i in live:
        split = Split(f"s{i:03d}", "t", rng.randrange(0, 50), end=rng.choice([None, 50]))
        where = rng.random()
        if where < 0.7:
            assignments[rng.randrange(readers)].append(split)
        elif where < 0.95:
            pool.append(split)
        else:
            quarantined.append(split)
    boundaries = {f"s{i:03d}": rng.randrange(10, 60) for i in range(n) if rng.random() < 0.2}
    return EnumeratorSnapshot(
        checkpoint_id=checkpoint_id,
        parallelism=readers,
        pool=tuple(pool),
        assignments={r: tuple(s) for r, s in assignments.items()},
        finished=frozenset(finished),
        subscriptions=frozenset({"t"}),
        backlog=BacklogSnapshot(
            boundaries=boundaries, finished=frozenset(s for s in boundaries if rng.random() < 0.5)
        ),
        quarantined=tuple(quarantined),
    )


def _header(snapshot: EnumeratorSnapshot) -> dict:
    return serde.enumerator_header(snapshot)


# -- pure ------------------------------------------------------------------------------


def _table(rows, checkpoint_id: int) -> pa.Table:
    return spec("enumerator_state").rows(
        [{**r, "checkpoint_id": checkpoint_id, "attempt_id": "a"} for r in rows]
    )


def _rebuilt(base: EnumeratorSnapshot, delta: list[dict], target: EnumeratorSnapshot) -> EnumeratorSnapshot:
    merged = merge_delta(_table(serde.enumerator_to_rows(base), 1), _table(delta, 2)).to_pylist()
    return serde.enumerator_from_rows(_header(target), merged)


@pytest.mark.parametrize("seed", range(40))
def test_base_plus_delta_decodes_to_the_full_snapshot(seed):
    rng = random.Random(seed)
    base = _snapshot(1, rng)
    target = _snapshot(2, rng)
    delta = serde.enumerator_delta(base, target)
    assert delta is not None
    assert _rebuilt(base, delta, target) == target
    # re-encoded, the merged rows are exactly the rows a full snapshot writes
    assert serde.enumerator_to_rows(_rebuilt(base, delta, target)) == serde.enumerator_to_rows(target)
    assert serde.enumerator_delta(target, target) == []


def test_a_delta_holds_only_what_changed_and_tombstones_what_is_gone():
    base = EnumeratorSnapshot(
        1,
        2,
        pool=(Split("p", "t", 0),),
        assignments={0: (Split("a", "t", 1),), 1: (Split("b", "t", 2),)},
        finished=frozenset({f"f{i:04d}" for i in range(1000)}),
        backlog=BacklogSnapshot(boundaries={"a": 9, "p": 4}),
    )
    target = dataclasses.replace(
        base,
        checkpoint_id=2,
        pool=(),
        assignments={0: (Split("a", "t", 5),), 1: (Split("b", "t", 2),)},
        # new finished ids sort before the old ones: their seq in a full snapshot shifts, no change
        finished=base.finished | {"e0", "e1"},
        backlog=BacklogSnapshot(boundaries={"a": 9}),
    )
    delta = serde.enumerator_delta(base, target)
    assert delta is not None
    assert sorted((r["status"], r["split_id"]) for r in delta) == [
        ("assigned", "a"),
        ("backlog_removed", "p"),
        ("finished", "e0"),
        ("finished", "e1"),
        ("removed", "p"),
    ]
    assert _rebuilt(base, delta, target) == target


def test_a_finished_identity_renewed_dropped_or_new_is_in_the_delta_and_the_rest_is_not():
    """Finished splits' identities are compared as sets of items: a renewed identity (the file
    changed after it finished, rule 1.9), one dropped and a new finished split are the delta's
    finished rows; the 1,000 unchanged ones are not."""
    identities = {f"f{i:04d}": f"f1:{i}:0:0:d{i}" for i in range(1000)}
    base = EnumeratorSnapshot(
        1, 2, finished=frozenset(identities), finished_identities=identities, assignments={0: (), 1: ()}
    )
    renewed = {**identities, "f0007": "f1:7:9:9:changed", "f1000": "f1:1000:0:0:new"}
    del renewed["f0009"]
    target = dataclasses.replace(
        base, checkpoint_id=2, finished=base.finished | {"f1000"}, finished_identities=renewed
    )
    delta = serde.enumerator_delta(base, target)
    assert delta is not None
    assert sorted((r["status"], r["split_id"], r["identity"]) for r in delta) == [
        ("finished", "f0007", "f1:7:9:9:changed"),
        ("finished", "f0009", None),
        ("finished", "f1000", "f1:1000:0:0:new"),
    ]
    assert _rebuilt(base, delta, target) == target


def test_a_split_in_two_places_cannot_be_a_delta_and_a_raw_delta_does_not_decode():
    base = _snapshot(1, random.Random(3))
    split = next(s for splits in base.assignments.values() for s in splits)
    twice = dataclasses.replace(base, pool=(*base.pool, split))
    assert serde.enumerator_delta(base, twice) is None
    finished_too = dataclasses.replace(base, finished=base.finished | {split.split_id})
    assert serde.enumerator_delta(base, finished_too) is None
    gone = dataclasses.replace(base, finished=frozenset())
    delta = serde.enumerator_delta(base, gone)
    assert delta and {r["status"] for r in delta} == {"removed"}
    with pytest.raises(StateError, match="allowed are"):
        serde.enumerator_from_rows(_header(gone), delta)


# -- the store ------------------------------------------------------------------------


def _checkpoint(checkpoint_id: int, rng: random.Random, parallelism: int = 3) -> CompletedCheckpoint:
    base = global_(checkpoint_id)
    snapshot = _snapshot(checkpoint_id, rng, readers=parallelism)
    return dataclasses.replace(base, enumerator=snapshot)


def _open(root, **kwargs) -> DeltaStateStore:
    return DeltaStateStore(root, "orders", "files:/in", **kwargs)


def _bases(root) -> dict[int, int | None]:
    data = DeltaTable(f"{root}/checkpoints").to_pyarrow_table(columns=["checkpoint_id", "enumerator_base"])
    return {int(c): b for c, b in zip(*(data.column(i).to_pylist() for i in (0, 1)), strict=True)}


def test_every_kth_checkpoint_is_full_and_restore_and_history_see_every_snapshot(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=4)
    rng = random.Random(7)
    committed = {}
    for cid in range(1, 11):
        committed[cid] = _checkpoint(cid, rng)
        store.commit_checkpoint(decision_for(committed[cid]))
    assert _bases(root) == {1: None, 2: 1, 3: 1, 4: 1, 5: None, 6: 5, 7: 5, 8: 5, 9: None, 10: 9}
    fresh = _open(root)
    for cid, expected in committed.items():
        assert fresh.load_checkpoint(cid) == expected
    assert fresh.latest_checkpoint() == committed[10]
    rows = fresh.history.enumerator_rows().to_pylist()
    for cid, expected in committed.items():
        mine = [r for r in rows if r["checkpoint_id"] == cid]
        assert {r["attempt_id"] for r in mine} == {fresh.kept()[1][cid - 1].attempt_id}
        stripped = [{k: v for k, v in r.items() if k not in ("checkpoint_id", "attempt_id")} for r in mine]
        assert stripped == serde.enumerator_to_rows(expected.enumerator)
    # one checkpoint alone (what the restart checks read) is whole too
    alone = fresh.history.enumerator_rows([7]).to_pylist()
    assert len(alone) == len(serde.enumerator_to_rows(committed[7].enumerator))


def _growing(checkpoint_id: int, files: int = 200) -> CompletedCheckpoint:
    """Checkpoint ``checkpoint_id`` of a files source: ``files`` finished per checkpoint so far, each
    with its identity, and two live splits."""
    done = {f"in/{i:05d}.txt": f"f1:{i}:0:0:d{i}" for i in range(files * checkpoint_id)}
    live = (Split(f"in/new-{checkpoint_id}.txt", "in", 3, end=9), Split("in/slow.txt", "in", checkpoint_id))
    snapshot = EnumeratorSnapshot(
        checkpoint_id,
        2,
        assignments={0: live[:1], 1: live[1:]},
        finished=frozenset(done),
        finished_identities=done,
        subscriptions=frozenset({"in"}),
    )
    return dataclasses.replace(global_(checkpoint_id), enumerator=snapshot)


def test_a_decision_holds_the_rows_its_checkpoint_writes_and_decodes_whole_with_identities(
    tmp_path, monkeypatch
):
    """The decision (the redo record, written before the sink commit) holds the enumerator rows its
    checkpoint commit writes: against the same base, a delta of what changed, not every finished
    split (at 100,000 files a full copy cost every epoch about 100 ms); read back by a fresh store it
    is the whole decision, finished identities included (a decision once dropped them, so a repair
    lost them). Its base gone, reading it is a StateError naming the base."""
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=3)
    decisions = {}
    made: list[str] = []
    for name in ("enumerator_delta", "enumerator_to_rows"):
        real = getattr(serde, name)
        monkeypatch.setattr(
            serde, name, lambda *a, _real=real, _name=name, **k: made.append(_name) or _real(*a, **k)
        )
    for cid in range(1, 6):
        decisions[cid] = decision_for(_growing(cid))
        store.write_decision(decisions[cid])
        made.clear()
        store.commit_checkpoint(decisions[cid])
        assert made == [], f"checkpoint {cid}: the commit made its rows again ({made})"  # the decision's
    assert _bases(root) == {1: None, 2: 1, 3: 1, 4: None, 5: 4}
    rows = DeltaTable(f"{root}/decisions").to_pyarrow_table().to_pylist()
    by_epoch = {r["epoch_id"]: r for r in rows}
    counts = DeltaTable(f"{root}/checkpoints").to_pyarrow_table(
        columns=["checkpoint_id", "enumerator_row_count"]
    )
    written = dict(zip(*(counts.column(i).to_pylist() for i in (0, 1)), strict=True))
    for cid, row in by_epoch.items():
        assert row["enumerator_base"] == _bases(root)[cid]
        assert len(row["enumerator_entries"]) == written[cid] and row["enumerator_rows"] == []
    assert len(by_epoch[2]["enumerator_entries"]) == 200 + 2 + 1  # 200 new finished, the live, 1 removed
    assert len(by_epoch[4]["enumerator_entries"]) == 800 + 2  # a full snapshot
    fresh = _open(root)
    for cid, decision in decisions.items():
        assert fresh.decision(cid, decision.attempt_id) == decision
    DeltaTable(f"{root}/checkpoints").delete("checkpoint_id = 4")
    with pytest.raises(StateError, match="a delta against checkpoint 4, which is not in"):
        _open(root, read_only=True).decision(5, decisions[5].attempt_id)


def test_a_delta_whose_base_is_gone_is_one_state_error_for_restore_and_history(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=4)
    rng = random.Random(3)
    for cid in (1, 2, 3):
        store.commit_checkpoint(decision_for(_checkpoint(cid, rng)))
    assert _bases(root) == {1: None, 2: 1, 3: 1}
    DeltaTable(f"{root}/checkpoints").delete("checkpoint_id = 1")  # the base's row is lost
    fresh = _open(root)
    errors = []
    for read in (lambda: fresh.load_checkpoint(3), lambda: fresh.history.enumerator_rows([2, 3])):
        with pytest.raises(StateError) as err:
            read()
        errors.append(err.value)
    assert (
        "hold their enumerator state as deltas against checkpoints [1], which are not in the state store"
        in (str(errors[0]))
    )
    assert errors[0].params["missing"] == errors[1].params["missing"] == [1]
    assert errors[0].params["checkpoint_ids"] == [3] and errors[1].params["checkpoint_ids"] == [2, 3]


def test_a_new_store_a_rescale_and_regional_checkpoints_keep_restores_exact(tmp_path):
    root = str(tmp_path / "state")
    rng = random.Random(11)
    store = _open(root, full_snapshot_every=20)
    first = _checkpoint(1, rng)
    store.commit_checkpoint(decision_for(first))
    second = regional(2, first)
    second = dataclasses.replace(second, enumerator=_snapshot(2, rng))
    store.commit_checkpoint(decision_for(second))
    restarted = _open(root, full_snapshot_every=20)  # a restart: the first commit is full
    third = _checkpoint(3, rng)
    restarted.commit_checkpoint(decision_for(third))
    rescaled = _checkpoint(4, rng, parallelism=2)
    restarted.commit_checkpoint(decision_for(rescaled))
    fifth = _checkpoint(5, rng, parallelism=2)
    restarted.commit_checkpoint(decision_for(fifth))
    assert _bases(root) == {1: None, 2: 1, 3: None, 4: None, 5: 4}
    for expected in (first, second, third, rescaled, fifth):
        assert _open(root).load_checkpoint(expected.checkpoint_id) == expected


def test_retention_keeps_every_kept_checkpoints_base_and_compaction_keeps_its_rows(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=5, compact_every=3)
    rng = random.Random(5)
    committed = {}
    for cid in range(1, 13):
        committed[cid] = _checkpoint(cid, rng)
        store.commit_checkpoint(decision_for(committed[cid]))
        store.retain(2)
        kept = store.ids()
        bases = _bases(root)
        for k in kept:  # every kept checkpoint's base is kept, and restores exactly
            assert bases[k] is None or bases[k] in kept
            assert _open(root).load_checkpoint(k) == committed[k]
    # 11 and 12 are deltas against 11? no: 11 is full (every 5th: 1, 6, 11), 12 a delta against 11
    assert store.ids() == [11, 12]
    # at 9 and 10 the base 6 was kept besides the latest two
    enum_ids = set(
        DeltaTable(f"{root}/enumerator_state").to_pyarrow_table().column("checkpoint_id").to_pylist()
    )
    assert {11, 12} <= enum_ids


def test_retention_pins_the_base_while_a_delta_is_kept(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=10)
    rng = random.Random(9)
    committed = {cid: _checkpoint(cid, rng) for cid in range(1, 6)}
    for cid in range(1, 6):
        store.commit_checkpoint(decision_for(committed[cid]))
        store.retain(1)
    assert store.ids() == [1, 5]  # 1 is the base of 5
    assert _open(root).latest_checkpoint() == committed[5]
    with pytest.raises(CheckpointError, match=r"cannot delete checkpoints \[1\].*kept checkpoints \[5\]"):
        store._delete(1)
    store.compact()
    assert _open(root).latest_checkpoint() == committed[5]


def test_orphan_rows_of_a_killed_attempt_are_never_part_of_a_snapshot_and_a_redo_is_full(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=10)
    rng = random.Random(13)
    first = _checkpoint(1, rng)
    store.commit_checkpoint(decision_for(first))
    second = _checkpoint(2, rng)
    decision = decision_for(second)

    class Killed(Exception):
        pass

    def kill():
        raise Killed

    with pytest.raises(Killed):
        store.commit_checkpoint(decision, before_row=kill)  # delta rows written, no row
    assert _open(root).ids() == [1]
    assert _open(root).latest_checkpoint() == first
    assert set(_open(root).history.enumerator_rows().column("checkpoint_id").to_pylist()) == {1}
    redo = _open(root, full_snapshot_every=10)  # the next process finishes the decision
    redo.commit_checkpoint(decision)
    assert _bases(root) == {1: None, 2: None}
    assert _open(root).load_checkpoint(2) == second
    third = _checkpoint(3, rng)
    redo.commit_checkpoint(decision_for(third))
    assert _bases(root)[3] == 2
    assert _open(root).load_checkpoint(3) == third
    orphans = (
        DeltaTable(f"{root}/enumerator_state")
        .to_pyarrow_table()
        .filter(pc.field("checkpoint_id") == 2)
        .column("attempt_id")
        .unique()
    )
    assert len(orphans) == 2  # the killed attempt's delta and the redo's full rows: one counts


def test_state_written_before_the_rule_opens_with_every_checkpoint_full(tmp_path):
    root = str(tmp_path / "state")
    store = _open(root, full_snapshot_every=1)  # full rows only, then drop the new column
    rng = random.Random(17)
    committed = {cid: _checkpoint(cid, rng) for cid in (1, 2)}
    for cpt in committed.values():
        store.commit_checkpoint(decision_for(cpt))
    old = (
        DeltaTable(f"{root}/checkpoints")
        .to_pyarrow_table()
        # and the columns added after it (phase times, failures): state written before them all
        .drop_columns(
            [
                "enumerator_base",
                "enumerator_row_count",
                "plan_ms",
                "read_ms",
                "sink_ms",
                "failures",
                "discovery",
            ]
        )
    )
    write_deltalake(f"{root}/checkpoints", old, mode="overwrite", schema_mode="overwrite")
    assert "enumerator_base" not in DeltaTable(f"{root}/checkpoints").schema().to_arrow().names
    reader = DeltaStateStore(root, "orders", None, read_only=True)
    assert reader.latest_checkpoint() == committed[2]
    assert len(reader.history.enumerator_rows()) == sum(
        len(serde.enumerator_to_rows(c.enumerator)) for c in committed.values()
    )
    writer = _open(root)  # migrates: the column is added, old rows read NULL (full)
    assert _bases(root) == {1: None, 2: None}
    third = _checkpoint(3, rng)
    writer.commit_checkpoint(decision_for(third))
    fourth = _checkpoint(4, rng)
    writer.commit_checkpoint(decision_for(fourth))
    assert _bases(root) == {1: None, 2: None, 3: None, 4: 3}
    assert _open(root).load_checkpoint(4) == fourth
    assert isinstance(DeltaTable(f"{root}/checkpoints").to_pyarrow_table(), pa.Table)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "20"])
def test_full_snapshot_every_is_validated_with_a_clear_error(tmp_path, bad):
    with pytest.raises(InvalidParameterError, match="full_snapshot_every=.*an integer >= 1"):
        _open(str(tmp_path / "state"), full_snapshot_every=bad)
    with pytest.raises(ConfigError, match=r"checkpoint\.full_snapshot_every=.*an integer >= 1"):
        config_from_mapping(
            {
                "name": "p",
                "source": {"kind": "files", "path": str(tmp_path / "in")},
                "state": {"path": str(tmp_path / "s")},
                "sink": {"path": str(tmp_path / "k")},
                "checkpoint": {"full_snapshot_every": bad},
            }
        )


def test_the_config_key_reaches_the_store(tmp_path):
    config = config_from_mapping(
        {
            "name": "p",
            "source": {"kind": "files", "path": str(tmp_path / "in")},
            "state": {"path": str(tmp_path / "s")},
            "sink": {"path": str(tmp_path / "k")},
            "checkpoint": {"full_snapshot_every": 7},
        }
    )
    assert config.checkpoint.full_snapshot_every == 7


# -- the real driver, store and sink (no Spark): crashes, redo, retention ------------------


@pytest.mark.parametrize(
    "point", [CrashPoint.BEFORE_CHECKPOINT_ROW, CrashPoint.AFTER_SINK_COMMIT, CrashPoint.DURING_RETENTION]
)
def test_a_driver_killed_mid_commit_finishes_from_delta_state_exactly_once(tmp_path, point):
    pipeline = LocalPipeline(tmp_path, retain=1)
    pipeline.write_input(files=6, lines=40)  # 240 records, 20 per epoch: 12 epochs
    driver = pipeline.driver(CrashAt(point, 4))
    driver.open()
    for _ in range(3):
        driver.run_epoch()
    with pytest.raises(Crash):
        driver.run_epoch()
    again = pipeline.driver()  # a new process: restore, then redo epoch 4 from its decision
    again.open()
    while again.run_epoch().committed_records:
        pass
    bases = _bases(pipeline.state)
    assert any(b is not None for b in bases.values())  # deltas were written and are kept
    store = DeltaStateStore(pipeline.state, pipeline.name, None, read_only=True)
    for cid in store.ids():  # what restore reads == what the checks and the report read
        restored = store.load_checkpoint(cid)
        assert restored.enumerator is not None
        rows = store.history.enumerator_rows([cid]).drop_columns(["checkpoint_id", "attempt_id"])
        assert rows.to_pylist() == serde.enumerator_to_rows(restored.enumerator)
        base = bases[cid]
        assert base is None or base in store.ids()
    latest = store.latest_checkpoint()
    assert latest is not None and latest.enumerator is not None
    assert len(latest.enumerator.finished) == 6  # every file read to its end
    sink = DeltaTable(pipeline.sink_path).to_pyarrow_table(columns=["split_id", "offset"])
    pairs = list(zip(*(sink.column(i).to_pylist() for i in (0, 1)), strict=True))
    assert len(pairs) == len(set(pairs)) == 240  # each record exactly once
