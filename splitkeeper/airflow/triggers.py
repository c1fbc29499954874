"""``SplitkeeperNewDataTrigger``: wakes a pipeline's ingest when its source has something new.

An Airflow 3 event trigger (``BaseEventTrigger``): an ``AssetWatcher`` runs it in the triggerer,
and every event it yields is an asset event that schedules the DAGs watching the asset.
:func:`splitkeeper.airflow.splitkeeper_dags` wires it for a pipeline file with
``airflow.schedule: on_new_data``; it works the same under a deferrable task.

Every ``poll_interval`` seconds it asks :func:`splitkeeper.app.services.pending_work`, in a
thread: the pipeline's latest checkpoint restored read-only, then the driver's own discovery
(the file listing; Kafka's end offsets) against it. No Spark, no lease, nothing written, no
record read. A failed look (the object store or the broker unreachable) is logged and the next
one is tried.

Exactly one DAG run per batch of new data, across restarts of the triggerer and the scheduler.
The *work* of a look is its key: the latest checkpoint id it was computed against, whether the
state asks for a checkpoint, and the pending splits. The trigger's cursor is that key plus the
number of DAG runs the ingest DAG had when it fired, kept in the Airflow Variable
``splitkeeper_new_data__<ingest dag id>`` (:func:`cursor_variable`). What Airflow 3.1 does,
read in its code, and what the rules below rest on:

- A trigger event becomes durable only when the triggerer's supervisor commits it
  (``Trigger.submit_event`` -> ``AssetManager.register_asset_change``: an ``AssetEvent`` row and
  an ``AssetDagRunQueue`` row per watching DAG). Until then it is in the trigger runner's or the
  supervisor's memory, and a SIGKILL of the triggerer loses it. A Variable write
  (``PutVariable``) and a DAG-run count (``GetDRCount``) are answered by the supervisor only
  after its database call, so the cursor is durable before the event is yielded.
- The queue holds one row per (asset, DAG) (its primary key; the insert of a second one is
  skipped). The scheduler creates one run from it, hands the run every asset event since the
  previous asset-triggered run, and deletes the DAG's rows in the same transaction. So any number
  of events that land before that run is created make one run. A DAG at ``max_active_runs``
  (1 for splitkeeper) keeps its row until the active run ends: still one run.
- A scheduler killed at any point loses nothing: the events and the queue rows are in the
  database, and a run's creation and the deletion of its queue rows commit together. (An event
  that lands while the scheduler creates a run may have its row deleted with the others; that
  run was created after the event's look, so it reads the event's data.)
- A trigger cannot see asset events or the queue; it can count the DAG's runs, by state.
- The ingest run discovers its work when its task starts, so a run created after a look reads
  at least what that look found.

The rules, checked in this order at every look (:func:`decide`; the order of the steps in
:meth:`SplitkeeperNewDataTrigger.run` is part of them):

1. Nothing pending: no event.
2. A run of the ingest DAG is queued or running: no event. That run, or the one queued after it
   by an event already fired, is the run for what is pending; the trigger looks again after it
   ends, and fires then only for what the run did not read (data that came after its discovery
   moves the key: another split, or the same split after a checkpoint moved on).
3. The key equals the cursor's and the DAG has more runs than the cursor counted: a run was
   created after the event and has ended, so the event landed and had its run. No event (a run
   that failed before its first checkpoint is retried by Airflow's retries or by hand; the next
   new data moves the key and fires).
4. The key equals the cursor's, no run was created since, and this trigger instance fired it: the
   event waits in the queue for the scheduler. No event.
5. The key equals the cursor's, no run was created since, and an earlier triggerer (before a
   restart) fired it: fire again. The first event either was lost (a kill before its commit) or
   waits in the queue, where the second one joins it (one run either way).
6. Otherwise (a new key): count the DAG's runs, write the cursor (key and count), read it back,
   then yield the event. A kill before the write fires again after the restart (rule 6); a kill
   between the write and the event's commit fires again (rule 5); a kill after the commit finds
   the event queued (rule 5, joined) or its run created (rule 2 or 3).
7. The ingest run itself (:func:`already_consumed`, called first by
   :class:`~splitkeeper.airflow.operators.SplitkeeperIngestOperator`): a run triggered only by
   this trigger's events, every one naming a checkpoint older than the latest, with nothing
   pending now, was made by an event whose data an earlier run consumed. It succeeds at once as
   a no-op (logged, its XCom ``{"skipped": true, ...}``): no lease, no Spark, no checkpoint.

So a batch leads to one run that reads it, except where a run failed and was not rerun, or a
second triggerer (a zombie of a high-availability pair) fired beside the first: the queue then
usually joins the two, and a run the queue did not join skips itself (rule 7).
Without a DAG id (a deferrable task) or outside a triggerer (no supervisor to reach), the
trigger falls back to polling alone: it fires once per key and again when the key moves (rules
1, 4 and 6 without the cursor), which can fire twice for a batch after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

try:
    from airflow.triggers.base import BaseEventTrigger, TriggerEvent
except ImportError:  # pragma: no cover - Airflow before 3.0 has no event-driven scheduling
    from airflow.triggers.base import BaseTrigger as BaseEventTrigger  # type: ignore[assignment]
    from airflow.triggers.base import TriggerEvent

log = logging.getLogger("splitkeeper.airflow")

#: How often a trigger looks at the source when none is given (``airflow.poll_interval_s``).
POLL_INTERVAL_S = 60.0

#: The DAG-run states in which a run is still to read what it discovers (rule 2).
ACTIVE_STATES = ("queued", "running")


def look(pipeline_config: str | None) -> dict[str, Any]:
    """One look at the pipeline's source: what a run started now would read (no Spark).
    ``pipeline_config`` None: ``$SPLITKEEPER_PIPELINE_CONFIG``.

    The pipeline file is read through :class:`~splitkeeper.airflow.hooks.SplitkeeperHook` (its
    connections filled in, the store connections' variables applied). Returns the event payload:
    pipeline, latest checkpoint id, the pending split ids (at most 20 named) and their count,
    and whether the state itself asks for a checkpoint.
    """
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.app import services

    config = SplitkeeperHook(pipeline_config).open()
    work = services.pending_work(config)
    return {
        "pipeline": config.name,
        "pipeline_config": pipeline_config,
        "checkpoint_id": work.checkpoint_id,
        "pending": work.any,
        "unsettled": work.unsettled,
        "splits": list(work.splits[:20]),
        "split_count": len(work.splits),
    }


def work_key(found: Mapping[str, Any]) -> list[Any]:
    """The work a look found, as the cursor keeps it (JSON: a list)."""
    return [found["checkpoint_id"], found["unsettled"], found["split_count"], *found["splits"]]


def cursor_variable(dag_id: str) -> str:
    """The Airflow Variable holding the trigger's cursor for the ingest DAG ``dag_id``."""
    return f"splitkeeper_new_data__{dag_id}"


@dataclass(frozen=True)
class Cursor:
    """What the trigger last fired for: the work's key and the ingest DAG's run count then."""

    key: list[Any]
    dag_runs: int

    def dumps(self) -> str:
        return json.dumps({"key": self.key, "dag_runs": self.dag_runs}, sort_keys=True)

    @classmethod
    def loads(cls, text: str | None) -> Cursor | None:
        """The cursor a Variable holds; None for none, or for a value this module did not write."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(key=list(data["key"]), dag_runs=int(data["dag_runs"]))
        except (ValueError, TypeError, KeyError) as err:
            log.warning("splitkeeper: the new-data cursor %r is not one (%s): ignoring it", text, err)
            return None


@dataclass(frozen=True)
class Decision:
    """What one look leads to: fire or not, and the rule (1-6) that says so."""

    fire: bool
    rule: int
    why: str


def decide(
    found: Mapping[str, Any],
    *,
    cursor: Cursor | None,
    fired_here: bool,
    dag_runs: int,
    active_runs: int,
) -> Decision:
    """The module's rules 1-6 for one look (``found``), the stored ``cursor``, whether this
    trigger instance fired the cursor's key, and the ingest DAG's run counts now (all runs, and
    the queued or running ones)."""
    if not found["pending"]:
        return Decision(False, 1, "nothing pending")
    if active_runs > 0:
        return Decision(False, 2, f"{active_runs} run(s) of the ingest DAG queued or running")
    if cursor is not None and cursor.key == work_key(found):
        if dag_runs > cursor.dag_runs:
            return Decision(False, 3, "a run was created after this work's event: it had its run")
        if fired_here:
            return Decision(False, 4, "this work's event waits in the queue for the scheduler")
        return Decision(
            True, 5, "fired before a restart and no run since: firing again (the queue joins them)"
        )
    return Decision(True, 6, "new work")


class AirflowLedger:
    """The cursor and the run counts, through the triggerer's supervisor (Task SDK calls)."""

    def __init__(self, dag_id: str) -> None:
        self.dag_id = dag_id
        self.variable = cursor_variable(dag_id)

    @staticmethod
    def reachable() -> bool:
        """Whether this process talks to an Airflow supervisor (a triggerer or a task)."""
        try:
            from airflow.sdk.execution_time import task_runner
        except ImportError:  # pragma: no cover - no Task SDK
            return False
        return getattr(task_runner, "SUPERVISOR_COMMS", None) is not None

    async def load(self) -> Cursor | None:
        from airflow.sdk import Variable
        from asgiref.sync import sync_to_async

        return Cursor.loads(await sync_to_async(Variable.get)(self.variable, default=None))

    async def save(self, cursor: Cursor) -> bool:
        """Write the cursor and read it back (``Variable.set`` logs a failed write, not raises)."""
        from airflow.sdk import Variable
        from asgiref.sync import sync_to_async

        text = cursor.dumps()
        await sync_to_async(Variable.set)(
            self.variable, text, description="splitkeeper: the new-data trigger's cursor (do not edit)"
        )
        return bool(await sync_to_async(Variable.get)(self.variable, default=None) == text)

    async def runs(self, states: tuple[str, ...] | None = None) -> int:
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
        from asgiref.sync import sync_to_async

        count = await sync_to_async(RuntimeTaskInstance.get_dr_count)(
            dag_id=self.dag_id, states=list(states) if states else None
        )
        return int(count)


def trigger_payloads(context: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The payloads of the new-data events that triggered this DAG run (a task's ``context``), or
    None when anything else triggered it (a schedule, a hand, another asset's event)."""
    accessor = context.get("triggering_asset_events")
    events = [event for per_asset in (accessor or {}).values() for event in per_asset]
    payloads = []
    for event in events:
        extra = getattr(event, "extra", None) or {}
        payload = extra.get("payload") if extra.get("from_trigger") else None
        if not isinstance(payload, dict) or "checkpoint_id" not in payload or "splits" not in payload:
            return None
        payloads.append(payload)
    return payloads or None


def already_consumed(
    pipeline_config: str | None, payloads: list[dict[str, Any]] | None
) -> dict[str, Any] | None:
    """Rule 7: the no-op result of an ingest run whose triggering events' work an earlier run
    consumed, or None (the run goes on). One look at the source (no Spark)."""
    if not payloads:
        return None
    named = [p["checkpoint_id"] for p in payloads]
    now = look(pipeline_config)
    latest = now["checkpoint_id"]
    if now["pending"] or latest is None or any(c is not None and c >= latest for c in named):
        return None
    result = {
        "skipped": True,
        "pipeline": now["pipeline"],
        "latest_checkpoint_id": latest,
        "event_checkpoint_ids": named,
        "reason": (
            f"every event of this run names a checkpoint before {latest} ({sorted(set(map(str, named)))}) "
            "and nothing is pending: an earlier run read its data"
        ),
    }
    log.info("splitkeeper: pipeline %s: nothing to do (rule 7): %s", now["pipeline"], result["reason"])
    return result


class SplitkeeperNewDataTrigger(BaseEventTrigger):
    """Fires when the pipeline's source has something a run would read; once per batch with
    ``dag_id`` in a triggerer (the module's rules).

    :param pipeline_config: the pipeline file (as the operators take it)
    :param poll_interval: seconds between two looks at the source (``airflow.poll_interval_s``)
    :param dag_id: the ingest DAG the asset schedules; None: polling alone (no cursor)
    """

    def __init__(
        self, pipeline_config: str, poll_interval: float = POLL_INTERVAL_S, dag_id: str | None = None
    ) -> None:
        super().__init__()
        self.pipeline_config = pipeline_config
        self.poll_interval = float(poll_interval)
        self.dag_id = dag_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "pipeline_config": self.pipeline_config,
            "poll_interval": self.poll_interval,
        }
        if self.dag_id is not None:
            kwargs["dag_id"] = self.dag_id
        return (f"{type(self).__module__}.{type(self).__qualname__}", kwargs)

    def ledger(self) -> AirflowLedger | None:
        """Where the cursor lives, or None: polling alone (no DAG id, or no supervisor)."""
        if self.dag_id is None:
            return None
        if not AirflowLedger.reachable():
            log.warning(
                "splitkeeper: no Airflow supervisor to keep the new-data cursor of %s in: polling alone",
                self.dag_id,
            )
            return None
        return AirflowLedger(self.dag_id)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ledger = self.ledger()
        fired: list[Any] | None = None  # the key this instance fired (rule 4)
        while True:
            try:
                found = await asyncio.to_thread(look, self.pipeline_config)
            except Exception as err:  # noqa: BLE001 - a failed look is retried at the next interval
                log.warning("splitkeeper: looking at %s for new data failed: %s", self.pipeline_config, err)
                found = None
            if found is not None:
                try:
                    event = await self._after_look(found, ledger, fired)
                except Exception as err:  # noqa: BLE001 - Airflow unreachable: no event, look again
                    log.warning(
                        "splitkeeper: the new-data cursor of %s is out of reach: %s", self.dag_id, err
                    )
                    event = None
                if not found["pending"]:
                    fired = None
                if event is not None:
                    fired = work_key(found)
                    yield event
            await asyncio.sleep(self.poll_interval)

    async def _after_look(
        self, found: dict[str, Any], ledger: AirflowLedger | None, fired: list[Any] | None
    ) -> TriggerEvent | None:
        """The rules for one look; the cursor written (rule 6) before the event is returned."""
        key = work_key(found)
        if ledger is None:  # the polling fallback: once per key
            decision = decide(
                found,
                cursor=None if fired is None else Cursor(fired, 0),
                fired_here=True,
                dag_runs=0,
                active_runs=0,
            )
            return self._event(found, decision) if decision.fire else None
        if not found["pending"]:
            return None
        active = await ledger.runs(ACTIVE_STATES)  # counted after the look: rule 2
        cursor = await ledger.load()
        dag_runs = await ledger.runs()
        decision = decide(
            found, cursor=cursor, fired_here=fired == key, dag_runs=dag_runs, active_runs=active
        )
        log.debug("splitkeeper: %s: rule %d: %s", self.dag_id, decision.rule, decision.why)
        if not decision.fire:
            return None
        stale = decision.rule == 6 or cursor is None or cursor.dag_runs != dag_runs
        if stale and not await ledger.save(Cursor(key, dag_runs)):
            log.warning("splitkeeper: the new-data cursor of %s was not written: no event yet", self.dag_id)
            return None
        return self._event(found, decision, dag_runs=dag_runs)

    @staticmethod
    def _event(found: dict[str, Any], decision: Decision, dag_runs: int | None = None) -> TriggerEvent:
        log.info(
            "splitkeeper: pipeline %s has new data (%d split(s)): firing (rule %d: %s)",
            found["pipeline"],
            found["split_count"],
            decision.rule,
            decision.why,
        )
        payload = dict(found)
        if dag_runs is not None:
            payload["dag_runs"] = dag_runs
        return TriggerEvent(payload)
