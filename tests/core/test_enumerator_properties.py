"""Hypothesis: random event sequences keep every ownership invariant (and balance) after every step.

A small model drives the real enumerator the way the framework does: readers
register, fail (``add_splits_back`` + re-register with their last checkpointed
state), splits are discovered and finished, checkpoints complete, and the job
restores globally (possibly at another parallelism, reader states dealt out
again). After every step the model checks, through
:mod:`splitkeeper.core.invariants`, that every live split is owned exactly
once, nothing finished or unknown survives, the pool is empty, balanced
strategies are balanced, and each reader owns only splits the context sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitkeeper.core.assignment import strategy_by_name
from splitkeeper.core.enumerator import (
    AssignmentCall,
    RecordingEnumeratorContext,
    RevocationCall,
    SplitEnumerator,
    fail_reader,
    restart_reader,
)
from splitkeeper.core.invariants import check_enumerator_state
from splitkeeper.core.types import EnumeratorSnapshot, Split


@dataclass
class Harness:
    parallelism: int
    strategy: str
    reassign: bool
    discovered: list[Split] = field(default_factory=list)
    live: set[str] = field(default_factory=set)
    states: dict[int, tuple[Split, ...]] = field(default_factory=dict)
    last: EnumeratorSnapshot | None = None
    cid: int = 0
    registered_at: dict[int, int] = field(default_factory=dict)  # reader -> index in ctx.calls

    def __post_init__(self) -> None:
        self._new_job(self.parallelism, None, {})

    def _new_job(
        self, parallelism: int, restored: EnumeratorSnapshot | None, reports: dict[int, tuple[Split, ...]]
    ) -> None:
        self.parallelism = parallelism
        self.ctx = RecordingEnumeratorContext(parallelism)
        self.enum = SplitEnumerator(
            self.ctx, strategy_by_name(self.strategy), reassign_on_recovery=self.reassign
        )
        if restored is not None:
            self.enum.restore(restored)
        self.enum.start()
        self.registered_at = {}
        for r in range(parallelism):
            self._register(r, reports.get(r, ()))

    def _register(self, reader: int, reported: tuple[Split, ...]) -> None:
        self.registered_at[reader] = len(self.ctx.calls)
        restart_reader(self.enum, self.ctx, reader, reported)

    # -- events -----------------------------------------------------------------------------

    def discover(self, count: int, bounded: bool) -> None:
        start = len(self.discovered)
        new = [Split(f"s{n:03d}", "t", end=100 if bounded else None) for n in range(start, start + count)]
        self.discovered.extend(new)
        self.live.update(x.split_id for x in new)
        self.enum.add_splits(new)

    def fail(self, pick: int) -> None:
        reader = pick % self.parallelism
        fail_reader(self.enum, self.ctx, reader)
        self._register(reader, self.states.get(reader, ()))

    def finish(self, pick: int) -> None:
        owned = sorted((sid, r) for r in range(self.parallelism) for sid in self.enum.owned_split_ids(r))
        bounded = [(sid, r) for sid, r in owned if self.enum.split(sid).end is not None]  # type: ignore[union-attr]
        if not bounded:
            return
        sid, reader = bounded[pick % len(bounded)]
        assert self.enum.split_finished(reader, sid) is True
        self.live.discard(sid)

    def checkpoint(self) -> None:
        self.cid += 1
        snap = self.enum.snapshot(self.cid)
        self.ctx.on_checkpoint(self.cid)
        self.ctx.on_checkpoint_complete(self.cid)
        self.states = dict(snap.assignments)
        self.last = snap

    def global_restore(self, parallelism: int) -> None:
        if self.last is None:
            return
        snap = self.last
        # Reader states are dealt out again at the new parallelism (even-split style).
        flat = [x for r in sorted(snap.assignments) for x in snap.assignments[r]]
        reports = {r: tuple(flat[r::parallelism]) for r in range(parallelism)}
        self._new_job(parallelism, snap, reports)
        self.states = reports
        # Work finished after the checkpoint is undone; the source is discovered again.
        self.live = {x.split_id for x in self.discovered} - set(snap.finished)
        self.enum.add_splits(self.discovered)

    # -- checks -----------------------------------------------------------------------------

    def check(self) -> None:
        enum = self.enum
        assignment = enum.assignment()
        balanced = self.reassign and enum.strategy.balanced
        violations = check_enumerator_state(
            assignment,
            known_live=self.live,
            finished=enum.finished_split_ids,
            balanced=balanced,
            readers=range(self.parallelism),
            weights={} if self.strategy == "weighted" else None,
        )
        assert violations == [], violations
        everything = {x.split_id for x in assignment.pool} | {
            x.split_id for splits in assignment.readers.values() for x in splits
        }
        assert everything == self.live  # nothing lost, nothing resurrected
        assert assignment.pool == ()  # every reader is registered: nothing waits
        assert enum.checkpoint_allowed
        if self.reassign:
            # Assignment happens only through the context: a deferred reader owns only what it was sent.
            for reader in range(self.parallelism):
                sent: set[str] = set()
                for call in self.ctx.calls[self.registered_at[reader] :]:
                    if isinstance(call, AssignmentCall):
                        sent.update(x.split_id for x in call.assignment.get(reader, ()))
                    elif isinstance(call, RevocationCall):
                        sent.difference_update(call.revocation.get(reader, ()))
                assert set(enum.owned_split_ids(reader)) <= sent


events = st.one_of(
    st.tuples(st.just("discover"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("fail"), st.integers(0, 9)),
    st.tuples(st.just("finish"), st.integers(0, 99)),
    st.tuples(st.just("checkpoint")),
    st.tuples(st.just("global_restore"), st.integers(1, 5)),
)


def run(harness: Harness, steps: list[tuple]) -> None:
    harness.check()
    for step in steps:
        getattr(harness, step[0])(*step[1:])
        harness.check()


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parallelism=st.integers(1, 5),
    strategy=st.sampled_from(["round-robin", "least-loaded", "weighted"]),
    steps=st.lists(events, max_size=25),
)
def test_deferred_balanced_strategies_keep_invariants_and_balance_after_every_event(
    parallelism: int, strategy: str, steps: list[tuple]
) -> None:
    run(Harness(parallelism, strategy, reassign=True), steps)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parallelism=st.integers(1, 5),
    strategy=st.sampled_from(["legacy-hash", "least-loaded"]),
    steps=st.lists(events, max_size=25),
)
def test_legacy_mode_and_legacy_hash_never_lose_or_duplicate_a_split(
    parallelism: int, strategy: str, steps: list[tuple]
) -> None:
    run(Harness(parallelism, strategy, reassign=False), steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parallelism=st.integers(1, 5), steps=st.lists(events, max_size=25))
def test_legacy_hash_with_deferred_assignment_never_loses_or_duplicates_a_split(
    parallelism: int, steps: list[tuple]
) -> None:
    run(Harness(parallelism, "legacy-hash", reassign=True), steps)
