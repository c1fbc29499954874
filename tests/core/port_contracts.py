"""Contract tests of the driver's ports that every implementation inherits (as
``splitkeeper/sources/contract.py`` does for sources).

``StateStoreContract`` (the ``StateStore`` port) runs on the simulator's in-memory store
(``tests/core/test_port_contracts.py``) and on ``DeltaStateStore``
(``tests/state/test_port_contracts.py``); ``EpochSinkContract`` (the ``EpochSink`` port) on the
simulator's sink and on ``DeltaSink``. A test class subclasses a contract and provides its
hooks; the tests use only what ``splitkeeper/core/ports.py`` promises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from core.test_checkpoint_store import global_checkpoint, regional_checkpoint
from splitkeeper.core.invariants import Violation, ViolationKind
from splitkeeper.core.ports import EpochDecision, EpochSink, RegionRun, StateStore
from splitkeeper.core.restarts import IN_RUN_RULES, RestartCheck, RestoreKind
from splitkeeper.core.source import PlannedRange
from splitkeeper.core.types import RegionOutcome, Split
from splitkeeper.errors import CheckpointError, ConcurrentRunError

Run = tuple[str, int, int]


def decision(
    checkpoint_id: int, attempt: str = "a", refs: dict[int, tuple[int, int]] | None = None
) -> EpochDecision:
    checkpoint = global_checkpoint(checkpoint_id) if not refs else regional_checkpoint(checkpoint_id, refs)
    return EpochDecision(
        checkpoint,
        attempt,
        acknowledged=(0,),
        configured_parallelism=3,
        reason="contract",
        split_weights=(("s-1", 2.5),),
    )


def plan(epoch: int) -> dict[int, list[PlannedRange]]:
    return {0: [PlannedRange(Split(f"s-{epoch}", "t", 0), 0, 5)], 1: []}


class StateStoreContract:
    """What every ``StateStore`` does (protocol rule 5.3: plan, decision, checkpoint row last)."""

    def make_store(self) -> StateStore:
        raise NotImplementedError

    def restart_checks(self, store: StateStore) -> list[tuple[str, int | None, str, tuple[int, ...]]]:
        """``(restore, checkpoint, verdict, readers)`` of every in-run check the store kept, oldest first."""
        raise NotImplementedError

    def test_in_run_restart_checks_are_kept_passed_and_failed_and_change_no_checkpoint(self) -> None:
        store = self.make_store()
        store.commit_checkpoint(decision(1))
        lost = Violation(ViolationKind.NOT_OWNED, ("s-2",), "1 live split(s) neither pooled nor owned: s-2")
        store.record_restart_checks(
            [RestartCheck(RestoreKind.GLOBAL_RESTORE, 1, 2, (0, 1), IN_RUN_RULES, notes=("a note",))]
        )
        store.record_restart_checks(
            [RestartCheck(RestoreKind.REGION_FALLBACK, 1, 3, (1,), IN_RUN_RULES, (lost,))]
        )
        assert self.restart_checks(store) == [
            ("global_restore", 1, "passed", (0, 1)),
            ("region_fallback", 1, "failed", (1,)),
        ]
        assert store.checkpoint_ids() == [1] and store.latest_checkpoint() == global_checkpoint(1)

    def test_an_empty_store_has_nothing_and_names_what_is_missing(self) -> None:
        store = self.make_store()
        assert store.latest_checkpoint() is None and store.checkpoint_ids() == []
        assert store.latest_plan_epoch() is None and store.decision(1, "a") is None
        with pytest.raises(CheckpointError, match="checkpoint 1 "):
            store.load_checkpoint(1)

    def test_planned_epochs_strictly_increase(self) -> None:
        store = self.make_store()
        store.write_plan(1, plan(1))
        assert store.latest_plan_epoch() == 1
        for again in (1, 0):
            with pytest.raises(ConcurrentRunError):
                store.write_plan(again, plan(again))
        store.write_plan(2, plan(2))
        assert store.latest_plan_epoch() == 2

    def test_a_decision_is_found_by_its_epoch_and_attempt_until_discarded(self) -> None:
        store = self.make_store()
        store.write_decision(decision(4, "a"))
        assert store.decision(4, "a") == decision(4, "a")
        assert store.decision(4, "b") is None and store.decision(5, "a") is None
        store.discard_decision(4, "a")
        assert store.decision(4, "a") is None

    def test_the_checkpoint_exists_only_once_its_row_is_written_and_reads_back_as_committed(self) -> None:
        store = self.make_store()
        seen: list[list[int]] = []
        store.commit_checkpoint(decision(1), before_row=lambda: seen.append(store.checkpoint_ids()))
        assert seen == [[]]  # before the row: not there yet
        assert store.checkpoint_ids() == [1]
        assert store.load_checkpoint(1) == store.latest_checkpoint() == global_checkpoint(1)
        assert store.configured_parallelism(1) == 3
        assert dict(store.split_weights(1)) == {"s-1": 2.5}

    def test_the_same_decision_again_changes_nothing(self) -> None:
        store = self.make_store()
        store.commit_checkpoint(decision(1))
        store.commit_checkpoint(decision(1))  # a redo after the row landed
        assert store.checkpoint_ids() == [1] and store.load_checkpoint(1) == global_checkpoint(1)

    def test_ref_chain_and_retention_follow_the_core_rule(self) -> None:
        store = self.make_store()
        store.commit_checkpoint(decision(1))
        store.commit_checkpoint(decision(2))
        store.commit_checkpoint(decision(3, refs={1: (2, 1)}))
        assert store.ref_chain(3) == [3, 2]
        assert store.retain(1) == [1]  # 2 stays: the kept 3 refers to it
        assert store.checkpoint_ids() == [2, 3]

    def test_an_aborted_attempt_is_logged_but_is_no_checkpoint(self) -> None:
        store = self.make_store()
        store.commit_checkpoint(decision(1))
        store.log_attempt(2, {0: RegionOutcome.ACK, 1: RegionOutcome.TIMEOUT}, "region 1 timed out")
        assert store.checkpoint_ids() == [1] and store.latest_checkpoint() == global_checkpoint(1)


class EpochSinkContract:
    """What every ``EpochSink`` does (protocol rule 5.2): one fenced, idempotent commit per epoch."""

    def make_sink(self) -> EpochSink:
        raise NotImplementedError

    def stage(self, sink: EpochSink, epoch: int, runs: Mapping[int, Sequence[Run]]) -> list[RegionRun]:
        """The acknowledged outputs of ``epoch``'s regions that read ``runs`` (records
        ``offset .. next - 1`` of a split, one record per offset)."""
        raise NotImplementedError

    def committed(self, sink: EpochSink) -> list[tuple[str, int]]:
        """``(split id, offset)`` of every record the sink holds, sorted (a duplicate shows twice)."""
        raise NotImplementedError

    def test_a_fresh_sink_has_no_recorded_epoch(self) -> None:
        sink = self.make_sink()
        assert sink.committed_epoch() is None and sink.committed_attempt(1) is None

    def test_a_commit_records_its_epoch_and_attempt_and_makes_the_records_visible(self) -> None:
        sink = self.make_sink()
        receipt = sink.commit(
            1, self.stage(sink, 1, {0: [("a", 0, 3)], 1: [("b", 0, 2)]}), expected=None, attempt_id="x"
        )
        assert (receipt.epoch, receipt.records, receipt.replayed) == (1, 5, False)
        assert sink.committed_epoch() == 1 and sink.committed_attempt(1) == "x"
        assert self.committed(sink) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)]
        second = sink.commit(2, self.stage(sink, 2, {0: [("a", 3, 4)]}), expected=1, attempt_id="y")
        assert (second.records, sink.committed_epoch(), sink.committed_attempt(2)) == (1, 2, "y")

    def test_a_redo_of_the_recorded_epoch_by_its_attempt_is_a_replay_with_the_same_receipt(self) -> None:
        sink = self.make_sink()
        outputs = self.stage(sink, 1, {0: [("a", 0, 3)]})
        first = sink.commit(1, outputs, expected=None, attempt_id="x")
        again = sink.commit(1, outputs, expected=None, attempt_id="x")
        assert again.replayed and (again.epoch, again.records) == (first.epoch, first.records) == (1, 3)
        assert self.committed(sink) == [("a", 0), ("a", 1), ("a", 2)]  # written once

    def test_the_fence_refuses_a_commit_that_does_not_expect_the_recorded_epoch(self) -> None:
        sink = self.make_sink()
        sink.commit(1, self.stage(sink, 1, {0: [("a", 0, 2)]}), expected=None, attempt_id="x")
        with pytest.raises(ConcurrentRunError):  # a run that restored before epoch 1 landed
            sink.commit(2, self.stage(sink, 2, {0: [("a", 0, 2)]}), expected=None, attempt_id="y")
        with pytest.raises(ConcurrentRunError):  # another attempt of the recorded epoch
            sink.commit(1, self.stage(sink, 1, {0: [("a", 0, 2)]}), expected=None, attempt_id="z")
        assert sink.committed_epoch() == 1 and sink.committed_attempt(1) == "x"
        assert self.committed(sink) == [("a", 0), ("a", 1)]
