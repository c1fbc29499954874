"""source.on_file_change in the core (protocol rule 1.9): what the enumerator does with a changed split.

The source only reports (:class:`SplitChange`); the enumerator applies the policy, tells the
owning reader, audits, and keeps finished splits' identities in its snapshot.
"""

from __future__ import annotations

import pytest

from splitkeeper.core.assignment import strategy_by_name
from splitkeeper.core.enumerator import RecordingEnumeratorContext, SplitEnumerator, UpdateCall
from splitkeeper.core.source import SplitChange, SplitChangeKind
from splitkeeper.core.types import RecoveryDecision, Split, SplitChangePolicy
from splitkeeper.errors import SourceError

ID1, ID2 = "f1:100:1:aaa", "f1:160:2:bbb"


def running(*splits: Split) -> tuple[RecordingEnumeratorContext, SplitEnumerator]:
    ctx = RecordingEnumeratorContext(1)
    enum = SplitEnumerator(ctx, strategy_by_name("round-robin"), reassign_on_recovery=True)
    enum.start()
    ctx.register_reader(0)
    enum.add_reader(0)
    enum.add_splits(splits)
    return ctx, enum


def finish(enum: SplitEnumerator, split_id: str) -> None:
    split = enum.split(split_id)
    assert split is not None and split.end is not None
    enum.update_positions([split.at(split.end)])
    enum.split_finished(0, split_id)


def decisions(enum: SplitEnumerator, split_id: str) -> list[RecoveryDecision]:
    return [r.decision for r in enum.audit_for(split_id)]


def grew(split_id: str, start: int, end: int) -> SplitChange:
    return SplitChange(split_id, SplitChangeKind.GREW, ID2, "file /in/a grew", start=start, end=end)


def test_a_finished_split_keeps_its_identity_in_the_snapshot() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    finish(enum, "a")
    snapshot = enum.snapshot(1)
    assert snapshot.finished == {"a"} and snapshot.finished_identities == {"a": ID1}
    restored = SplitEnumerator(
        RecordingEnumeratorContext(1), strategy_by_name("round-robin"), reassign_on_recovery=True
    )
    restored.restore(snapshot)
    assert restored.finished_identities == {"a": ID1}


@pytest.mark.parametrize("policy", [SplitChangePolicy.FAIL, SplitChangePolicy.APPEND])
def test_a_rewritten_split_fails_under_fail_and_append_naming_it(policy: SplitChangePolicy) -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    enum.update_positions([Split("a", "/in", 40, 100, identity=ID1)])
    change = SplitChange("a", SplitChangeKind.CHANGED, ID2, "file /in/a was rewritten", start=0)
    with pytest.raises(SourceError, match=r"split 'a': file /in/a was rewritten; .*new_version") as err:
        enum.apply_split_changes([change], policy)
    assert err.value.code == "SOURCE_ERROR"
    assert enum.split("a") == Split("a", "/in", 40, 100, identity=ID1)


def test_growth_under_fail_asks_for_append() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    finish(enum, "a")
    with pytest.raises(SourceError, match="set source.on_file_change: append"):
        enum.apply_split_changes([grew("a", 100, 160)], SplitChangePolicy.FAIL)
    assert enum.finished_split_ids == {"a"}


def test_append_grows_a_live_splits_end_and_tells_its_owner() -> None:
    ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    enum.update_positions([Split("a", "/in", 40, 100, identity=ID1)])
    assert enum.apply_split_changes([grew("a", 100, 160)], SplitChangePolicy.APPEND) == 1
    assert enum.split("a") == Split("a", "/in", 40, 160, identity=ID2)
    (update,) = [c for c in ctx.calls if isinstance(c, UpdateCall)]
    assert update.updates == {0: (Split("a", "/in", 40, 160, identity=ID2),)}
    assert decisions(enum, "a")[-1] is RecoveryDecision.EXTENDED


def test_append_reopens_a_finished_split_at_its_old_end() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    finish(enum, "a")
    enum.apply_split_changes([grew("a", 100, 160)], SplitChangePolicy.APPEND)
    assert "a" not in enum.finished_split_ids
    assert enum.split("a") == Split("a", "", 100, 160, identity=ID2)
    assert enum.owner_of("a") == 0
    finish(enum, "a")
    assert enum.snapshot(1).finished_identities == {"a": ID2}


def test_new_version_ends_the_split_where_it_stands_and_reads_the_replacement() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    enum.update_positions([Split("a", "/in", 40, 100, identity=ID1)])
    new = Split("a#v0123456789ab", "/in", 0, 100, identity=ID2)
    change = SplitChange("a", SplitChangeKind.CHANGED, ID2, "file /in/a was rewritten", replacement=(new,))
    enum.apply_split_changes([change], SplitChangePolicy.NEW_VERSION)
    assert "a" in enum.finished_split_ids and "a" not in enum.finished_identities
    assert enum.split("a#v0123456789ab") == new
    (replaced,) = [r for r in enum.audit_for("a") if r.decision is RecoveryDecision.REPLACED]
    assert "ended at 40, new version: a#v0123456789ab" in replaced.detail
    assert [r.detail for r in enum.audit_for(new.split_id)][0] == "at 0"


def test_a_moved_finished_split_is_finished_under_its_new_id_starting_at_its_end() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    finish(enum, "a")
    moved = SplitChange("a", SplitChangeKind.MOVED, ID1, "file /in/a was moved", end=100, moved_to="arch/a")
    enum.apply_split_changes([moved], SplitChangePolicy.FAIL)
    assert enum.finished_split_ids == {"a", "arch/a"}
    assert enum.add_splits([Split("arch/a", "/in", 0, 100, identity=ID1)]) == 0
    discovered = [r for r in enum.audit_for("arch/a") if r.decision is RecoveryDecision.DISCOVERED]
    assert [r.detail for r in discovered] == ["at 100"]  # the restart checks: its records begin at its end


def test_a_moved_live_split_goes_on_from_its_position_under_the_new_id() -> None:
    _ctx, enum = running(Split("a", "/in", 0, 100, identity=ID1))
    enum.update_positions([Split("a", "/in", 40, 100, identity=ID1)])
    moved = SplitChange("a", SplitChangeKind.MOVED, ID1, "file /in/a was moved", end=100, moved_to="arch/a")
    enum.apply_split_changes([moved], SplitChangePolicy.FAIL)
    assert enum.split("a") is None and "a" in enum.finished_split_ids
    assert enum.split("arch/a") == Split("arch/a", "/in", 40, 100, identity=ID1)
    assert decisions(enum, "a")[-1] is RecoveryDecision.MOVED


def test_an_unread_split_is_refreshed_whatever_the_policy() -> None:
    _ctx, enum = running(Split("bad", "/in", 0, 1, identity="unreadable"))
    now = Split("bad", "/in", 0, 50, identity=ID1)
    change = SplitChange(
        "bad", SplitChangeKind.CHANGED, ID1, "file /in/bad can be read now", replacement=(now,)
    )
    enum.apply_split_changes([change], SplitChangePolicy.FAIL)
    assert enum.split("bad") == now
    assert decisions(enum, "bad")[-1] is RecoveryDecision.REFRESHED


@pytest.mark.parametrize("policy", list(SplitChangePolicy))
def test_a_recreated_split_ends_keeping_its_identity_and_its_replacement_is_read_under_any_policy(
    policy: SplitChangePolicy,
) -> None:
    """Issue 36, item 6: a Kafka topic deleted and re-created under the same name is new data; the old
    data is gone, so no policy applies: the split ends where it stands (keeping its identity, so the
    source tells its id from the new topic's) and the new partition is read from its start."""
    old, new_identity = "kafka:AAAAAAAAAHsAAAAAAAAByA", "kafka:AAAAAAAAAcgAAAAAAAAAew"
    _ctx, enum = running(Split("rc-0", "rc", 0, None, identity=old))
    enum.update_positions([Split("rc-0", "rc", 100, None, identity=old)])
    new = Split("rc-0#v0123456789ab", "rc", 0, None, backlog_end=150, identity=new_identity)
    change = SplitChange(
        "rc-0",
        SplitChangeKind.RECREATED,
        new_identity,
        "topic 'rc' was deleted and re-created",
        replacement=(new,),
    )
    assert enum.apply_split_changes([change], policy) == 1
    assert "rc-0" in enum.finished_split_ids and enum.finished_identities == {"rc-0": old}
    assert enum.split("rc-0#v0123456789ab") == new and enum.owner_of(new.split_id) == 0
    (replaced,) = [r for r in enum.audit_for("rc-0") if r.decision is RecoveryDecision.REPLACED]
    assert "ended at 100, new version: rc-0#v0123456789ab" in replaced.detail
    assert [r.detail for r in enum.audit_for(new.split_id)][0] == "at 0"
