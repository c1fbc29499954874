"""RecordingEnumeratorContext: reader registry, call recording and the assignment tracker."""

from __future__ import annotations

import pytest

from splitkeeper.core.enumerator import AssignmentCall, RecordingEnumeratorContext, RevocationCall
from splitkeeper.core.types import Split
from splitkeeper.errors import InvalidParameterError, ProtocolError


def s(n: int) -> Split:
    return Split(f"t-{n}", "t")


def ids(splits: list[Split]) -> list[str]:
    return [x.split_id for x in splits]


def registered(parallelism: int) -> RecordingEnumeratorContext:
    ctx = RecordingEnumeratorContext(parallelism)
    for r in range(parallelism):
        ctx.register_reader(r)
    return ctx


def test_calls_are_recorded_in_order_with_sequence_numbers():
    ctx = registered(2)
    ctx.assign_splits({0: [s(1)], 1: [s(2)]})
    ctx.revoke_splits({0: ["t-1"]})
    ctx.assign_splits({1: [s(1)]})
    ctx.assign_splits({0: []})  # empty calls are not recorded

    calls = ctx.calls
    assert [type(c) for c in calls] == [AssignmentCall, RevocationCall, AssignmentCall]
    assert [c.sequence for c in calls] == [0, 1, 2]
    revocation = calls[1]
    assert isinstance(revocation, RevocationCall) and revocation.revocation == {0: ("t-1",)}
    assert ids(ctx.splits_sent_to(1)) == ["t-2", "t-1"]


def test_assigning_to_an_unregistered_reader_is_a_protocol_error():
    ctx = RecordingEnumeratorContext(3)
    ctx.register_reader(0)
    with pytest.raises(ProtocolError, match=r"unregistered readers \[2\]"):
        ctx.assign_splits({0: [s(1)], 2: [s(2)]})


def test_registered_readers_is_a_read_only_view_with_reported_splits():
    ctx = RecordingEnumeratorContext(2)
    ctx.register_reader(1, [s(7)], location="host-a")
    view = ctx.registered_readers()
    assert view[1].reported_splits == (s(7),) and view[1].location == "host-a"
    with pytest.raises(TypeError):
        view[0] = view[1]  # type: ignore[index]


def test_tracker_returns_assignments_since_the_last_completed_checkpoint():
    ctx = registered(1)
    ctx.assign_splits({0: [s(1)]})
    ctx.on_checkpoint(1)
    ctx.assign_splits({0: [s(2)]})
    ctx.on_checkpoint(2)
    ctx.assign_splits({0: [s(3)]})
    assert ids(ctx.splits_assigned_since_last_checkpoint(0)) == ["t-1", "t-2", "t-3"]

    ctx.on_checkpoint_complete(1)
    assert ids(ctx.splits_assigned_since_last_checkpoint(0)) == ["t-2", "t-3"]
    ctx.on_checkpoint_complete(2)  # an aborted checkpoint would simply never complete
    assert ids(ctx.splits_assigned_since_last_checkpoint(0)) == ["t-3"]


def test_tracker_keeps_a_failed_regions_assignments_until_it_acknowledges_a_checkpoint():
    ctx = registered(2)
    ctx.assign_splits({0: [s(1)], 1: [s(2)]})
    ctx.on_checkpoint(1)
    ctx.on_checkpoint_complete(1, failed_readers=[0])  # regional: reader 0 fell back to older state
    assert ids(ctx.splits_assigned_since_last_checkpoint(0)) == ["t-1"]
    assert ctx.splits_assigned_since_last_checkpoint(1) == []

    ctx.on_checkpoint(2)
    ctx.on_checkpoint_complete(2, failed_readers=[0])
    assert ids(ctx.splits_assigned_since_last_checkpoint(0)) == ["t-1"]
    ctx.on_checkpoint(3)
    ctx.on_checkpoint_complete(3)
    assert ctx.splits_assigned_since_last_checkpoint(0) == []


def test_unregister_returns_and_forgets_the_readers_uncheckpointed_splits():
    ctx = registered(2)
    ctx.assign_splits({0: [s(1)], 1: [s(2)]})
    assert ids(ctx.unregister_reader(0)) == ["t-1"]
    assert 0 not in ctx.registered_readers()
    ctx.register_reader(0)
    assert ctx.splits_assigned_since_last_checkpoint(0) == []
    assert ids(ctx.splits_assigned_since_last_checkpoint(1)) == ["t-2"]
    with pytest.raises(ProtocolError, match="reader 1 is not registered"):
        RecordingEnumeratorContext(2).unregister_reader(1)


def test_checkpoint_ids_must_increase_in_the_tracker():
    ctx = registered(1)
    ctx.on_checkpoint(5)
    with pytest.raises(
        InvalidParameterError, match=r"checkpoint_id=5 is not allowed: an id greater than .* 5"
    ):
        ctx.on_checkpoint(5)


def test_set_parallelism_refuses_while_readers_beyond_the_new_range_are_registered():
    ctx = registered(3)
    with pytest.raises(ProtocolError, match=r"readers \[2\] are still registered"):
        ctx.set_parallelism(2)
    ctx.unregister_reader(2)
    ctx.set_parallelism(2)
    assert ctx.parallelism == 2
    with pytest.raises(InvalidParameterError, match="parallelism=-1"):
        ctx.set_parallelism(-1)
