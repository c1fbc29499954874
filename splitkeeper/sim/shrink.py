"""Shrinking: the shortest scenario that still breaks a rule; :func:`simulate` runs, then shrinks.

Given a run whose first finding is of kind K, :func:`shrink_finding` looks for
a smaller scenario whose replay still produces a finding of kind K:

1. cut the events after the step of the finding;
2. delta debugging (Zeller's *ddmin*) over the events: drop chunks, halving
   the chunk size when no chunk can go, down to single events;
3. the same over the initial splits;
4. the lowest parallelism that still fails;
5. 2-4 again while they still shrink something;
6. one last pass dropping single events, then single splits (the result is
   1-minimal: removing any one event or split makes the failure go away),
   budget permitting; reader and region numbers are then normalized.

Every candidate is replayed from scratch by the deterministic simulator and
stops at the first finding of kind K, so a candidate costs at most as many
steps as it has events. ``max_runs`` caps the replays; the best scenario found
so far is returned when it runs out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from splitkeeper.sim.events import Scenario
from splitkeeper.sim.simulator import (
    Components,
    Finding,
    FindingKind,
    ShrinkResult,
    SimConfig,
    SimulationResult,
    run_scenario,
)

T = TypeVar("T")


class _Budget:
    def __init__(self, runs: int) -> None:
        self.left = runs
        self.used = 0

    def spend(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        self.used += 1
        return True


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool], budget: _Budget) -> list[T]:
    """A sub-list of ``items`` (order kept) for which ``fails`` still holds, as short as ddmin finds.

    ``fails(items)`` is assumed true. Stops early when ``budget`` runs out.
    """
    current = list(items)
    n = 2
    while len(current) >= 2:
        chunk = -(-len(current) // n)
        parts = [current[i : i + chunk] for i in range(0, len(current), chunk)]
        reduced = False
        if len(parts) > 2:  # a single chunk may be enough on its own
            for part in parts:
                if not budget.spend():
                    return current
                if fails(part):
                    current, n, reduced = part, 2, True
                    break
        if not reduced:
            for i in range(len(parts)):
                complement = [x for j, p in enumerate(parts) if j != i for x in p]
                if not budget.spend():
                    return current
                if fails(complement):
                    current, n, reduced = complement, max(n - 1, 2), True
                    break
        if not reduced:
            if n >= len(current):
                break
            n = min(len(current), 2 * n)
    if len(current) == 1 and budget.spend() and fails([]):
        return []
    return current


def _one_by_one(items: Sequence[T], fails: Callable[[list[T]], bool], budget: _Budget) -> list[T]:
    current = list(items)
    i = len(current) - 1
    while i >= 0:
        candidate = current[:i] + current[i + 1 :]
        if not budget.spend():
            break
        if fails(candidate):
            current = candidate
        i -= 1
    return current


def shrink_finding(
    config: SimConfig,
    scenario: Scenario,
    finding: Finding,
    components: Components | None = None,
    *,
    max_runs: int = 400,
) -> ShrinkResult:
    """The shortest scenario found whose replay still breaks ``finding``'s rule (same kind)."""
    kind: FindingKind = finding.kind
    budget = _Budget(max_runs)
    last: dict[str, Finding] = {}

    def fails(candidate: Scenario) -> bool:
        result = run_scenario(config, candidate, components, stop_on=lambda f: f.kind is kind)
        hit = next((f for f in result.violations if f.kind is kind), None)
        if hit is not None:
            last["finding"] = hit
        return hit is not None

    def without_events(base: Scenario, one_by_one: bool = False) -> Scenario:
        search = _one_by_one if one_by_one else ddmin
        kept = search(list(base.events), lambda evs: fails(replace(base, events=tuple(evs))), budget)
        return replace(base, events=tuple(kept))

    def without_splits(base: Scenario, one_by_one: bool = False) -> Scenario:
        search = _one_by_one if one_by_one else ddmin
        kept = search(
            list(base.initial_splits), lambda ss: fails(replace(base, initial_splits=tuple(ss))), budget
        )
        return replace(base, initial_splits=tuple(kept))

    def fewer_readers(base: Scenario) -> Scenario:
        for parallelism in range(1, base.parallelism):
            if not budget.spend():
                break
            if fails(replace(base, parallelism=parallelism)):
                return replace(base, parallelism=parallelism)
        return base

    def size(s: Scenario) -> tuple[int, int, int]:
        return (len(s.events), len(s.initial_splits), s.parallelism)

    best = replace(scenario, events=scenario.events[: finding.step])
    while True:  # each pass can open the way for another (fewer readers -> fewer splits needed)
        before = size(best)
        best = fewer_readers(without_splits(without_events(best)))
        if size(best) == before or budget.left <= 0:
            break
    best = without_splits(without_events(best, one_by_one=True), one_by_one=True).normalized()
    # replay the winner once more so the reported finding is the one this very scenario produces
    fails(best)
    return ShrinkResult(
        kind=kind,
        scenario=best,
        finding=last.get("finding", finding),
        original_events=len(scenario.events),
        runs=budget.used + 1,
    )


def simulate(
    config: SimConfig,
    scenario: Scenario | None = None,
    components: Components | None = None,
    *,
    shrink: bool = True,
    max_shrink_runs: int = 400,
    progress: Callable[[int, int, SimulationResult], None] | None = None,
    progress_every: int = 0,
) -> SimulationResult:
    """Run, and when a rule broke, shrink to the shortest scenario that still breaks the first one.

    The result's ``shrunk`` holds that scenario (None when nothing broke or
    ``shrink`` is False). Deterministic: same arguments, same result.
    """
    scenario = scenario if scenario is not None else config.scenario()
    result = run_scenario(config, scenario, components, progress=progress, progress_every=progress_every)
    if shrink and result.violations:
        shrunk = shrink_finding(config, scenario, result.violations[0], components, max_runs=max_shrink_runs)
        result = replace(result, shrunk=shrunk)
    return result
