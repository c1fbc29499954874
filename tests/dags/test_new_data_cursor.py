"""The new-data trigger's cursor rules (:mod:`splitkeeper.airflow.triggers`), without Airflow
processes: :func:`decide` rule by rule, then the trigger's own ``run()`` against a ledger kept in
memory, killed (its generator dropped) at every step between the look and the event, with a
queue that joins events as Airflow's ``AssetDagRunQueue`` does. The real scheduler and triggerer
are SIGKILLed in ``test_new_data_exactly_once.py``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from splitkeeper.airflow import triggers
from splitkeeper.airflow.triggers import Cursor, SplitkeeperNewDataTrigger, decide, work_key


def _found(checkpoint_id: int | None = 4, *splits: str, pending: bool = True) -> dict[str, Any]:
    return {
        "pipeline": "p",
        "pipeline_config": "p.yaml",
        "checkpoint_id": checkpoint_id,
        "pending": pending,
        "unsettled": False,
        "splits": list(splits),
        "split_count": len(splits),
    }


A = _found(4, "a.txt")


@pytest.mark.parametrize(
    ("found", "cursor", "fired_here", "dag_runs", "active", "fire", "rule"),
    [
        (_found(4, pending=False), None, False, 0, 0, False, 1),
        (A, None, False, 3, 1, False, 2),  # a run is queued or running: it (or the next) reads it
        (A, Cursor(work_key(A), 3), False, 3, 1, False, 2),
        (A, Cursor(work_key(A), 3), False, 4, 0, False, 3),  # fired, its run came and went
        (A, Cursor(work_key(A), 3), True, 3, 0, False, 4),  # fired here, waiting in the queue
        (A, Cursor(work_key(A), 3), False, 3, 0, True, 5),  # fired before a restart, no run since
        (A, Cursor(work_key(A), 5), False, 3, 0, True, 5),  # runs deleted (db clean): fire again
        (A, None, False, 3, 0, True, 6),
        (A, Cursor(work_key(_found(3, "a.txt")), 2), False, 3, 0, True, 6),  # a checkpoint moved on
        (A, Cursor(work_key(_found(4, "a.txt", "b.txt")), 3), False, 3, 0, True, 6),
    ],
)
def test_decide_follows_the_numbered_rules(found, cursor, fired_here, dag_runs, active, fire, rule):
    decision = decide(found, cursor=cursor, fired_here=fired_here, dag_runs=dag_runs, active_runs=active)
    assert (decision.fire, decision.rule) == (fire, rule), decision.why


def test_a_cursor_round_trips_and_a_foreign_value_is_ignored():
    cursor = Cursor([4, False, 1, "a.txt"], 7)
    assert Cursor.loads(cursor.dumps()) == cursor
    assert Cursor.loads(None) is None and Cursor.loads("") is None
    assert Cursor.loads("not json") is None and Cursor.loads('{"key": [1]}') is None


class Killed(BaseException):
    """The triggerer died here."""


class World:
    """Airflow as the trigger sees it, in memory: the cursor Variable, the queue (one row however
    many events land before the run is created), the DAG runs; plus a kill at a named step."""

    def __init__(self) -> None:
        self.variable: str | None = None
        self.queued = False
        self.events: list[dict[str, Any]] = []
        self.runs: list[list[dict[str, Any]]] = []  # each run's consumed events
        self.active = 0
        self.kill_at: str | None = None
        self.pending_events: list[dict[str, Any]] = []

    def step(self, name: str) -> None:
        if self.kill_at == name:
            self.kill_at = None
            raise Killed(name)

    def commit(self, payload: dict[str, Any]) -> None:
        """The supervisor's ``submit_event``: an asset event and the queue row."""
        self.events.append(payload)
        self.pending_events.append(payload)
        self.queued = True

    def schedule(self) -> None:
        """The scheduler: one run from the queue, every event since the last run."""
        if self.queued and not self.active:
            self.runs.append(self.pending_events)
            self.pending_events, self.queued = [], False
            self.active = 1


class Ledger:
    def __init__(self, world: World) -> None:
        self.world = world

    async def load(self) -> Cursor | None:
        return Cursor.loads(self.world.variable)

    async def save(self, cursor: Cursor) -> bool:
        self.world.step("before the cursor")
        self.world.variable = cursor.dumps()
        self.world.step("after the cursor")
        return True

    async def runs(self, states: tuple[str, ...] | None = None) -> int:
        return self.world.active if states else len(self.world.runs)


class LifeOver(BaseException):
    """The test's end of one triggerer life (after its looks)."""


def _one_life(world: World, found: dict[str, Any], monkeypatch, looks: int = 3) -> None:
    """One triggerer life: ``looks`` looks at ``found``, each event committed unless a kill comes
    first (after the yield, before the commit: the event in memory only)."""
    left = iter(range(looks))

    def look(_path: str) -> dict[str, Any]:
        if next(left, None) is None:
            raise LifeOver
        return dict(found)

    monkeypatch.setattr(triggers, "look", look)
    trigger = SplitkeeperNewDataTrigger("p.yaml", poll_interval=0, dag_id="d")
    monkeypatch.setattr(trigger, "ledger", lambda: Ledger(world))

    async def life() -> None:
        async for event in trigger.run():
            world.step("before the commit")
            world.commit(event.payload)

    with contextlib.suppress(Killed, LifeOver):
        asyncio.run(life())


@pytest.mark.parametrize("kill_at", [None, "before the cursor", "after the cursor", "before the commit"])
@pytest.mark.parametrize("scheduler_first", [False, True])
def test_a_batch_makes_one_run_whichever_step_the_triggerer_dies_at(kill_at, scheduler_first, monkeypatch):
    world = World()
    batch = _found(4, "a.txt", "b.txt")
    world.kill_at = kill_at
    _one_life(world, batch, monkeypatch)  # fires, or dies at kill_at
    if scheduler_first:
        world.schedule()  # the run is created before the restart (when the event landed)
    _one_life(world, batch, monkeypatch)  # the restarted triggerer, the same work pending
    world.schedule()
    _one_life(world, batch, monkeypatch)  # and again while the run is active
    assert len(world.runs) == 1, world.runs
    assert {p["checkpoint_id"] for p in world.runs[0]} == {4}
    # the run commits checkpoint 5 and ends: nothing pending, no event, no run
    world.active = 0
    _one_life(world, _found(5, pending=False), monkeypatch)
    world.schedule()
    assert len(world.runs) == 1
    # the next batch: one more run
    _one_life(world, _found(5, "c.txt"), monkeypatch)
    world.schedule()
    assert len(world.runs) == 2 and world.runs[1][-1]["splits"] == ["c.txt"]


def test_without_a_dag_id_or_a_supervisor_the_trigger_polls_alone(monkeypatch):
    """The fallback: once per key, again when the key moves; no Airflow call."""
    assert SplitkeeperNewDataTrigger("p.yaml").ledger() is None
    assert SplitkeeperNewDataTrigger("p.yaml", dag_id="d").ledger() is None  # no supervisor here
    looks = iter(
        [_found(4, "a.txt"), _found(4, "a.txt"), _found(4, "a.txt", "b.txt"), _found(5, pending=False)]
    )

    def look(_path: str) -> dict[str, Any]:
        found = next(looks, None)
        if found is None:
            raise LifeOver
        return found

    monkeypatch.setattr(triggers, "look", look)
    trigger = SplitkeeperNewDataTrigger("p.yaml", poll_interval=0, dag_id="d")

    async def fired(got: list[list[str]]) -> None:
        async for event in trigger.run():
            got.append(event.payload["splits"])

    got: list[list[str]] = []
    with pytest.raises(LifeOver):
        asyncio.run(fired(got))
    assert got == [["a.txt"], ["a.txt", "b.txt"]]


def test_an_ingest_run_for_data_an_earlier_run_read_is_a_no_op(tmp_path, monkeypatch):
    """Rule 7 against a real files pipeline and its real Delta state (no Spark: every run here
    reads an empty folder). A run whose events name an older checkpoint, with nothing pending,
    is a no-op; one whose events name the latest checkpoint, or with something pending, or
    triggered by anything but the trigger's events, goes on."""
    from types import SimpleNamespace

    from splitkeeper.airflow.triggers import already_consumed, look, trigger_payloads
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nsource: {kind: files, path: in}\nstate: {path: state}\nsink: {path: sink}\n"
        "airflow: {schedule: on_new_data}\n",
        encoding="utf-8",
    )
    assert services.run(load_config(str(path))).finished  # checkpoint 1, nothing read
    first = look(str(path))
    assert first["checkpoint_id"] == 1 and not first["pending"]

    def context(*payloads: dict[str, Any], from_trigger: bool = True) -> dict[str, Any]:
        events = [SimpleNamespace(extra={"from_trigger": from_trigger, "payload": p}) for p in payloads]
        return {"triggering_asset_events": {"splitkeeper-p-new-data": events}}

    older = {**_found(None, "a.txt"), "pipeline": "p"}  # fired before the first checkpoint
    skipped = already_consumed(str(path), trigger_payloads(context(older, older)))
    assert skipped is not None and skipped["skipped"] is True and skipped["latest_checkpoint_id"] == 1
    assert (
        skipped["event_checkpoint_ids"] == [None, None]
        and "an earlier run read its data" in skipped["reason"]
    )

    latest = {**_found(1, "a.txt"), "pipeline": "p"}
    assert already_consumed(str(path), trigger_payloads(context(older, latest))) is None
    assert trigger_payloads(context(older, from_trigger=False)) is None  # another asset's event
    assert trigger_payloads({}) is None and trigger_payloads({"triggering_asset_events": {}}) is None
    (tmp_path / "in" / "b.txt").write_text("new\n", encoding="utf-8")
    assert already_consumed(str(path), trigger_payloads(context(older))) is None  # pending: it runs


def test_no_event_while_a_run_is_active_and_none_again_for_what_a_failed_run_left(monkeypatch):
    """Rule 2: the key moves while a run reads (a checkpoint committed mid-run, a file added after
    its discovery): no event until the run ends. Rule 3: a run that ended without reading its
    batch (failed before its first checkpoint) is that batch's run: no second one for it."""
    world = World()
    batch = _found(4, "a.txt")
    _one_life(world, batch, monkeypatch)
    world.schedule()
    assert len(world.runs) == 1 and world.active == 1
    _one_life(world, _found(5, "a.txt"), monkeypatch)  # the run's first checkpoint, a.txt not done
    _one_life(world, _found(5, "a.txt", "b.txt"), monkeypatch)  # b.txt after the run's discovery
    assert not world.queued and len(world.events) == 1
    world.active = 0  # the run ends having read a.txt; b.txt is left
    _one_life(world, _found(6, "b.txt"), monkeypatch)
    world.schedule()
    assert len(world.runs) == 2 and world.runs[1][-1]["splits"] == ["b.txt"]
    world.active = 0  # this run fails before its first checkpoint: b.txt still pending, same key
    _one_life(world, _found(6, "b.txt"), monkeypatch)
    _one_life(world, _found(6, "b.txt"), monkeypatch)  # a restart too
    world.schedule()
    assert len(world.runs) == 2 and not world.queued
