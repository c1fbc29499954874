"""Operator checkpoints (protocol section 8) in the core, without an engine: where each split stands,
what a rewind changes, and what a reset decides and audits."""

from __future__ import annotations

import pytest

from splitkeeper.core.lag import split_lags, split_places
from splitkeeper.core.operator import (
    read_again_from,
    reset_action,
    reset_decision,
    rewind_changes,
    rewind_decision,
    skipped_range,
)
from splitkeeper.core.types import (
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import InvalidParameterError


def _split(sid: str, position: int, end: int | None = 100) -> Split:
    return Split(sid, "s", position, end)


def _checkpoint(
    cid: int, a: int, b: int, *, finished: frozenset[str] = frozenset(), pooled: int = 5
) -> CompletedCheckpoint:
    """Split a owned by region 0, b by region 1 (region 1 fell back to checkpoint cid - 1), c pooled."""
    regions = {
        0: RegionState(0, (_split("a", a),)),
        1: RegionState(
            1, (_split("b", b),), ref_checkpoint_id=cid - 1, outcome=RegionOutcome.DECLINE, ref_depth=1
        ),
    }
    enum = EnumeratorSnapshot(
        cid,
        2,
        pool=() if "c" in finished else (_split("c", pooled),),
        assignments={0: (_split("a", a),), 1: (_split("b", b),)},
        finished=finished,
    )
    return CompletedCheckpoint(cid, CheckpointKind.REGIONAL, 2, regions, enum, consecutive_regional=1)


def test_split_places_take_owned_positions_from_the_regions_and_the_rest_from_the_enumerator() -> None:
    places = split_places(_checkpoint(3, 40, 20, finished=frozenset({"z"})))
    assert {sid: (p.status, p.owner, p.position) for sid, p in places.items()} == {
        "a": ("assigned", 0, 40),
        "b": ("assigned", 1, 20),
        "c": ("pool", None, 5),
        "z": ("finished", None, None),
    }


def test_split_lags_are_the_live_places_most_lag_first_at_the_regions_positions() -> None:
    """``status`` and the incident commands walk one list: split_lags is split_places without the
    finished ids, with each split's lag."""
    cp = _checkpoint(3, 40, 20, finished=frozenset({"z"}))
    # ends are 100: c (pooled at 5) lags 95, b (region 1, at 20) 80, a (region 0, at 40) 60; z is finished
    assert [(s.split_id, s.status, s.owner, s.position, s.lag) for s in split_lags(cp)] == [
        ("c", "pool", None, 5, 95),
        ("b", "assigned", 1, 20, 80),
        ("a", "assigned", 0, 40, 60),
    ]
    assert {s.split_id for s in split_lags(cp)} == {sid for sid, p in split_places(cp).items() if p.split}


def test_a_rewind_is_a_global_checkpoint_of_the_target_state_audited_per_changed_split() -> None:
    latest, target = _checkpoint(5, 90, 60, finished=frozenset({"c"})), _checkpoint(2, 30, 60)
    changes = {c.split_id: c for c in rewind_changes(latest, target)}
    assert sorted(changes) == ["a", "c"]  # b stands where it stood
    assert changes["a"].undone == 60 and changes["a"].before == "at 90 (reader 0)"
    assert changes["c"].before == "finished" and changes["c"].after == "at 5 (pool)"

    decision = rewind_decision(latest, target, 7, attempt_id="x", operator="ann@host", reason="bad transform")
    cp = decision.checkpoint
    assert cp.checkpoint_id == 7 and cp.kind is CheckpointKind.GLOBAL and cp.consecutive_regional == 0
    assert all(r.outcome is RegionOutcome.ACK and r.ref_checkpoint_id is None for r in cp.regions.values())
    assert (
        cp.enumerator is not None
        and cp.enumerator.checkpoint_id == 7
        and cp.enumerator.finished == frozenset()
    )
    assert split_places(cp)["a"].position == 30
    assert [(a.split_id, a.decision) for a in decision.audit] == [
        ("a", RecoveryDecision.REWOUND),
        ("c", RecoveryDecision.REWOUND),
    ]
    assert all("by ann@host: bad transform" in a.detail for a in decision.audit)
    assert decision.reason == "rewind to checkpoint 2 by ann@host: bad transform"


def test_a_rewind_goes_back_only_and_takes_a_new_epoch() -> None:
    latest = _checkpoint(5, 90, 60)
    with pytest.raises(InvalidParameterError, match="before the latest one"):
        rewind_decision(latest, latest, 6, attempt_id="x", operator="o", reason="")
    with pytest.raises(InvalidParameterError, match="after the latest checkpoint 5"):
        rewind_decision(latest, _checkpoint(2, 1, 1), 5, attempt_id="x", operator="o", reason="")


def test_a_forward_reset_skips_an_audited_range_and_a_backward_one_reads_again() -> None:
    latest = _checkpoint(5, 40, 60)
    forward, change = reset_decision(latest, "a", 55, 6, attempt_id="x", operator="o", reason="poison")
    assert split_places(forward.checkpoint)["a"].position == 55 and change.skipped == 15
    (record,) = forward.audit
    assert record.decision is RecoveryDecision.SKIPPED_BY_OPERATOR and skipped_range(record) == (40, 55)
    backward, change = reset_decision(latest, "c", 2, 6, attempt_id="x", operator="o")
    assert split_places(backward.checkpoint)["c"].position == 2 and change.undone == 3
    assert (
        backward.audit[0].decision is RecoveryDecision.RESET_BY_OPERATOR
        and skipped_range(backward.audit[0]) is None
    )
    assert forward.checkpoint.kind is CheckpointKind.GLOBAL


def test_a_reset_decision_gives_its_sink_action_and_where_the_split_is_read_again() -> None:
    """Issue 36, item 14: the sink commit of a reset is derived from its decision alone (so ``recover
    --repair`` can commit it again), and a backward reset or a rewind ends an earlier skipped gap."""
    latest = _checkpoint(5, 40, 60)
    forward, _change = reset_decision(latest, "a", 55, 6, attempt_id="x", operator="o", reason="poison")
    assert reset_action(forward) == {"kind": "reset", "split": "a", "from": 55, "forward": True}
    assert read_again_from(forward.audit[0]) is None  # a skip reads nothing again
    back, _change = reset_decision(forward.checkpoint, "a", 40, 7, attempt_id="y", operator="o")
    assert reset_action(back) == {"kind": "reset", "split": "a", "from": 40, "forward": False}
    assert read_again_from(back.audit[0]) == 40
    rewound = rewind_decision(
        _checkpoint(5, 90, 60),
        _checkpoint(2, 30, 60),
        7,
        attempt_id="x",
        operator="o",
        reason="x -> at 99 (y)",
    )
    assert reset_action(rewound) is None  # a rewind's sink commit needs the sink's versions
    assert {a.split_id: read_again_from(a) for a in rewound.audit} == {"a": 30}


@pytest.mark.parametrize(
    ("split", "position", "says"),
    [
        ("nope", 1, "a split of the latest checkpoint"),
        ("z", 1, "not finished"),
        ("a", 101, "<= the split's end 100"),
        ("a", 40, "other than the split's position now"),
        ("a", -1, "an offset >= 0"),
    ],
)
def test_a_reset_refuses_what_it_cannot_do(split: str, position: int, says: str) -> None:
    latest = _checkpoint(5, 40, 60, finished=frozenset({"z"}))
    with pytest.raises(InvalidParameterError, match=says):
        reset_decision(latest, split, position, 6, attempt_id="x", operator="o")


def test_a_reset_outside_the_sources_log_is_clamped_to_it_and_says_so() -> None:
    """Issue 36, item 7: as kafka-consumer-groups --reset-offsets, an offset past the log end goes to
    the end and one below the log start to the start; at the end already, the reset is refused."""
    unbounded = CompletedCheckpoint(
        5,
        CheckpointKind.GLOBAL,
        1,
        {0: RegionState(0, (_split("k", 40, None),))},
        EnumeratorSnapshot(5, 1, assignments={0: (_split("k", 40, None),)}),
    )
    ahead, change = reset_decision(unbounded, "k", 999_999, 6, attempt_id="x", operator="o", bounds=(10, 500))
    assert split_places(ahead.checkpoint)["k"].position == 500 and change.skipped == 460
    assert (change.requested, change.clamped_to) == (999_999, "the log end 500")
    assert "(offset 999999 asked for, clamped to the log end 500)" in ahead.audit[0].detail
    assert skipped_range(ahead.audit[0]) == (40, 500)
    back, change = reset_decision(unbounded, "k", 0, 6, attempt_id="x", operator="o", bounds=(10, 500))
    assert split_places(back.checkpoint)["k"].position == 10 and change.undone == 30
    assert change.clamped_to == "the log start 10" and read_again_from(back.audit[0]) == 10
    _inside, change = reset_decision(unbounded, "k", 20, 6, attempt_id="x", operator="o", bounds=(10, 500))
    assert change.requested is None and change.clamped_to == ""
    with pytest.raises(InvalidParameterError, match=r"999999 is outside it, and the log end 40 is where"):
        reset_decision(unbounded, "k", 999_999, 6, attempt_id="x", operator="o", bounds=(0, 40))
