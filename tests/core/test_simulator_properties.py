"""Property tests: random event sequences through the simulator, invariants checked after every step.

Hypothesis writes the scenarios (parallelism, initial splits, events: epochs
with crashes, declines and timeouts, reader failures after a checkpoint,
global restarts, rescales up and down with even-split or union state, new
splits, removed subscriptions, checkpoints requested mid-restore) and the
configuration (strategy, max_consecutive_failures, max_failure_ratio, legacy
or deferred readers). The simulator checks every protocol section 6 rule after every
step; a property fails with the scenario and the first broken rules, and
Hypothesis then shrinks the scenario itself.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from splitkeeper.core.rescale import Redistribution
from splitkeeper.sim import SimConfig, Simulator, run_scenario, simulate
from splitkeeper.sim.broken import BUGS
from splitkeeper.sim.events import (
    FILES,
    TOPICS,
    CheckpointDuringRestore,
    DiscoverSplits,
    Epoch,
    GlobalRestart,
    ReaderFailure,
    RegionFailure,
    RemoveSubscription,
    Rescale,
    Scenario,
    SplitSpec,
)

SUBSCRIPTIONS = [*TOPICS, FILES]


@st.composite
def split_specs(draw: st.DrawFn) -> SplitSpec:
    subscription = draw(st.sampled_from(SUBSCRIPTIONS))
    number = draw(st.integers(min_value=0, max_value=30))
    return SplitSpec(
        split_id=f"{subscription}-{number}",
        subscription=subscription,
        start=draw(st.integers(min_value=0, max_value=5)),
        length=draw(st.integers(min_value=0, max_value=20)),
        bounded=subscription == FILES,
    )


epoch_events = st.builds(
    Epoch,
    budget=st.integers(min_value=1, max_value=8),
    growth=st.integers(min_value=0, max_value=4),
    failures=st.lists(
        st.tuples(st.integers(min_value=0, max_value=7), st.sampled_from(list(RegionFailure))), max_size=3
    ).map(tuple),
    commit_retry=st.booleans(),
)
fault_events = st.one_of(
    st.builds(ReaderFailure, st.integers(min_value=0, max_value=7)),
    st.just(GlobalRestart()),
    st.builds(Rescale, st.integers(min_value=1, max_value=6), st.sampled_from(list(Redistribution))),
    st.builds(CheckpointDuringRestore, st.integers(min_value=0, max_value=7)),
    st.builds(RemoveSubscription, st.sampled_from(SUBSCRIPTIONS)),
    st.builds(DiscoverSplits, st.lists(split_specs(), min_size=1, max_size=3).map(tuple)),
)
events = st.one_of(epoch_events, epoch_events, epoch_events, fault_events)
scenarios = st.builds(
    Scenario,
    parallelism=st.integers(min_value=1, max_value=5),
    initial_splits=st.lists(split_specs(), max_size=12, unique_by=lambda s: s.split_id).map(tuple),
    events=st.lists(events, max_size=40).map(tuple),
)
configs = st.builds(
    SimConfig,
    strategy=st.sampled_from(["least-loaded", "round-robin", "weighted", "legacy-hash"]),
    max_consecutive_failures=st.integers(min_value=0, max_value=3),
    max_failure_ratio=st.sampled_from([0.25, 0.5, 1.0]),
    reassign_on_recovery=st.booleans(),
)


def explain(scenario: Scenario, config: SimConfig, result: object) -> str:
    violations = getattr(result, "violations", ())
    return "\n".join(
        [
            f"strategy={config.strategy} mcf={config.max_consecutive_failures} "
            f"ratio={config.max_failure_ratio} deferred={config.reassign_on_recovery}"
        ]
        + scenario.describe()
        + [str(v) for v in violations[:5]]
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios, config=configs)
def test_any_event_sequence_keeps_every_invariant_after_every_step(
    scenario: Scenario, config: SimConfig
) -> None:
    sim = Simulator(config, scenario)
    result = sim.run()
    assert result.ok, explain(scenario, config, result)
    assert (result.records_lost, result.records_duplicated, result.records_unexpected) == (0, 0, 0)
    assert result.max_ref_chain_depth <= config.max_consecutive_failures
    attempts = sum(isinstance(e, Epoch | CheckpointDuringRestore) for e in scenario.events)
    c = result.checkpoints
    assert c.global_ + c.regional + c.aborted == attempts  # every checkpoint attempt has one outcome
    assert result.refused_during_restore == sum(
        isinstance(e, CheckpointDuringRestore) for e in scenario.events
    )
    if config.reassign_on_recovery and config.strategy in ("least-loaded", "round-robin"):
        assert result.max_imbalance <= 1
        assert result.foreign_moves == 0  # sticky: a partial failover moves only the failed reader's splits


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    readers=st.integers(min_value=1, max_value=8),
    splits=st.integers(min_value=0, max_value=40),
    failure_rate=st.floats(min_value=0.0, max_value=1.0),
    strategy=st.sampled_from(["least-loaded", "round-robin", "weighted", "legacy-hash"]),
    max_consecutive_failures=st.integers(min_value=0, max_value=3),
)
def test_seeded_runs_keep_every_invariant_and_replay_identically(
    seed: int, readers: int, splits: int, failure_rate: float, strategy: str, max_consecutive_failures: int
) -> None:
    config = SimConfig(
        readers=readers,
        splits=splits,
        steps=60,
        failure_rate=failure_rate,
        seed=seed,
        strategy=strategy,
        max_consecutive_failures=max_consecutive_failures,
    )
    first = run_scenario(config)
    assert first.ok, explain(config.scenario(), config, first)
    assert run_scenario(config).to_dict() == first.to_dict()


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), bug=st.sampled_from(sorted(BUGS)))
def test_shrunk_sequence_of_a_broken_component_still_fails_and_is_never_longer(seed: int, bug: str) -> None:
    config = SimConfig(readers=4, splits=16, steps=120, failure_rate=0.3, seed=seed)
    components = BUGS[bug].components
    result = simulate(config, components=components, max_shrink_runs=150)
    assume(not result.ok)
    shrunk = result.shrunk
    assert shrunk is not None
    assert len(shrunk.scenario.events) <= result.violations[0].step
    assert len(shrunk.scenario.initial_splits) <= config.splits
    replay = run_scenario(config, shrunk.scenario, components)
    assert shrunk.kind in {f.kind for f in replay.violations}
