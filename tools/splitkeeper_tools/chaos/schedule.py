"""The fault table of ``splitkeeper-tools chaos`` and the schedule one ``--seed`` draws from it.

:data:`PLANNED` says how many faults of each :class:`FaultKind` one run injects, at any
``--messages``. :func:`draw_schedule` lays them out over the driver processes of a run
(:class:`Act`): which crash point kills which process, which regions fail, stall or
have their Python worker killed, which processes meet a broker SIGKILL. Everything
random comes from the seed; the same seed gives the same schedule. Pure: nothing here
starts a process.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from splitkeeper.core.ports import CrashPoint

PARALLELISM = 4
RESCALED_PARALLELISM = 6


class FaultKind(enum.Enum):
    """What a chaos run does to the pipeline; the value is the key of ``faults_by_kind``."""

    READER_FAILURE = "reader_failure"  # --fault fail:R@E: a region task raises
    STALLED_REGION = "stalled_region"  # --fault stall:S:R@E past region_timeout_s: cancelled
    DRIVER_SIGKILL = "driver_sigkill"  # SPLITKEEPER_CRASH_AT: the driver dies at a crash point
    BROKER_SIGKILL = "broker_sigkill"  # the broker process is SIGKILLed mid-epoch, then restarted
    WORKER_SIGKILL = "worker_sigkill"  # a pyspark worker is SIGKILLed while it runs a region task
    CONCURRENT_DRIVER = "concurrent_driver"  # a second `run` while one runs: refused by the lease
    CONCURRENT_RECOVER = "concurrent_recover"  # a `recover` while a run runs: refused by the lease
    RESCALE_UP = "rescale_up"  # recover --parallelism 6 from 4
    RESCALE_DOWN = "rescale_down"  # recover --parallelism 4 from 6
    #: with ``--store s3`` only (not in PLANNED): the driver SIGSTOPped past its lease's ttl, a
    #: takeover commits, the driver SIGCONTed commits nothing more
    DRIVER_SIGSTOP = "driver_sigstop"


#: The fault table: how many faults of each kind one chaos run injects.
PLANNED: Mapping[FaultKind, int] = {
    FaultKind.READER_FAILURE: 1,
    FaultKind.STALLED_REGION: 1,
    FaultKind.DRIVER_SIGKILL: len(CrashPoint),  # one per crash point (protocol rule 5.5)
    FaultKind.BROKER_SIGKILL: 2,
    FaultKind.WORKER_SIGKILL: 1,
    FaultKind.CONCURRENT_DRIVER: 1,
    FaultKind.CONCURRENT_RECOVER: 1,
    FaultKind.RESCALE_UP: 1,
    FaultKind.RESCALE_DOWN: 1,
}


@dataclass
class Fault:
    """One fault a run meant to inject, and whether the evidence says it happened.

    ``skipped`` faults could not be injected by design (a broker this command does not
    own); every other fault that is not ``injected`` fails the run.
    """

    kind: FaultKind
    run: str  # the label of the driver process it hit
    detail: str
    epoch: int | None = None
    crash_point: str | None = None
    injected: bool = False
    skipped: bool = False
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}


@dataclass(frozen=True, slots=True)
class Tuning:
    """The sizes and timeouts of a run of ``messages`` messages (small runs stay short)."""

    messages: int

    @property
    def epoch_records(self) -> int:
        """Records per epoch: the fullest partition (~22% of the messages) takes about 14 epochs."""
        return max(100, self.messages // 8)

    @property
    def region_timeout_s(self) -> float:
        """Past any healthy region's read, even a driver's first epoch on a loaded machine.

        A driver's first epoch starts its Python workers cold, and with fewer task slots than
        regions (local Spark on 2 cores) the last regions wait for a slot, which the timeout
        counts too: such an epoch took 12 s on a busy 2-core machine, and past 20 s at a load of
        12-17 (a rescale's first epoch then aborted on timeouts of healthy regions and the
        rescale-down fault went missing). A healthy region that timed out would blur the faults
        the schedule puts on given regions.
        """
        return 30.0 if self.messages <= 50_000 else 40.0

    @property
    def stall_s(self) -> float:
        """A stalled region sleeps this long: far past the timeout, so it is cancelled."""
        return 4 * self.region_timeout_s

    @property
    def slow_s(self) -> float:
        """A slow region sleeps this long, within the timeout: the window to kill its worker."""
        return round(0.4 * self.region_timeout_s, 1)

    @property
    def lease_ttl_s(self) -> float:
        """The pipeline lease's ttl (heartbeat every third of it).

        Long enough that a heartbeat delayed on a loaded machine never lets the lease
        expire under a live driver (the concurrent ``run`` and ``recover`` must be refused).
        A SIGKILLed driver's lease needs no wait: it ran on this host and its process is
        gone, so the next driver takes it over at once (protocol rule 5.6).
        """
        return 30.0

    @property
    def connect_timeout_s(self) -> float:
        """How long the source waits for a broker: longer than a broker restart, even a slow one."""
        return 60.0


def faults_epoch_records(records: Sequence[int], epochs: int) -> int:
    """The epoch budget of the act with the region faults, so that every region has ranges to read
    in each of its first ``epochs`` epochs (its region faults fall in them, and it dies in the last).

    A region with nothing to read in an epoch gets no task (``core.driver.regions_to_run``), so a
    region fault drawn for it would never fire. The driver shares an epoch's budget evenly among
    the splits (``EpochDriver.plan``); ``records`` holds what each split (Kafka partition) has when
    the act starts. ``len(records) * (min(records) // epochs)`` records per epoch leave every split,
    so every region that owns one, a range in each of those epochs, whichever region owns which
    split. The first share is produced with at least ``epochs`` messages in every partition.
    """
    if not records or min(records) < epochs:
        raise ValueError(f"every split needs at least {epochs} records for {epochs} epochs, not {records}")
    return len(records) * (min(records) // epochs)


@dataclass(frozen=True, slots=True)
class RegionFaultSpec:
    """A region fault the driver itself injects (``--fault``), at an absolute epoch."""

    kind: FaultKind  # READER_FAILURE, STALLED_REGION, or WORKER_SIGKILL (the slow region whose worker dies)
    region: int
    epoch: int
    spec: str  # the --fault argument


@dataclass(frozen=True, slots=True)
class Act:
    """One driver process of the schedule: ``run``, or ``recover --parallelism`` (a rescale).

    It runs up to ``epochs`` epochs and dies at ``crash`` in its epoch number
    ``crash_after + 1`` or, if that one aborted, a later one
    (``SPLITKEEPER_CRASH_AT=point@E+``). Live faults hit it from outside while it runs:
    the broker is SIGKILLed ``broker_kill_delay_s`` after its first epoch line, while the
    next epoch discovers and reads (``broker_kill``), the worker of
    the slow region is SIGKILLed in ``worker_kill_epoch``, a second ``run`` and a
    ``recover`` start during ``concurrent_epoch``. ``produce``: a share of the messages
    arrives while it runs.
    """

    label: str
    epochs: int
    crash: CrashPoint
    crash_after: int
    rescale_to: int | None = None
    region_faults: tuple[RegionFaultSpec, ...] = ()
    broker_kill: bool = False
    broker_kill_delay_s: float = 0.0
    produce: bool = False
    worker_kill_epoch: int | None = None
    concurrent_epoch: int | None = None
    pause: bool = False  # SIGSTOPped after its first epoch line while a takeover commits
    meets: tuple[FaultKind, ...] = ()  # the fault kinds it meets besides its crash

    def slow_region(self) -> RegionFaultSpec | None:
        return next((f for f in self.region_faults if f.kind is FaultKind.WORKER_SIGKILL), None)


def draw_schedule(seed: int, tuning: Tuning, pause: bool = False) -> list[Act]:
    """The driver processes of one run, drawn from ``seed``; together they meet every fault of PLANNED.

    1. ``faults`` (a fresh pipeline, P=4): epoch 1 commits a first checkpoint; epochs 2-4,
       in a seeded order, have a region fail, a region stall past the timeout (a second
       ``run`` and a ``recover`` start meanwhile) and a slow region whose Python worker is
       SIGKILLed; three regional checkpoints in a row make epoch 5 a forced global one
       (protocol rule 2.2), where the driver dies.
    2. ``ingest-1``, ``rescale-up`` (P=6), ``ingest-2``, ``rescale-down`` (P=4),
       ``ingest-3``: each dies at its crash point in its second epoch (or a later one if
       that one aborts); two of the three ``ingest`` processes (seeded) meet a broker
       SIGKILL after their first epoch, so their second epoch waits for the broker to
       return, and die in their third; each ``ingest`` process receives a share of the
       remaining messages.

    The six crash points are a seeded permutation over the six processes. With ``pause``
    (``--store s3``), ``rescale-down`` is also SIGSTOPped after its first epoch line while a
    takeover commits (:class:`~splitkeeper_tools.chaos.live.DriverPause`).
    """
    rng = random.Random(f"chaos-schedule-{seed}")
    points = list(CrashPoint)
    rng.shuffle(points)
    order = [FaultKind.READER_FAILURE, FaultKind.STALLED_REGION, FaultKind.WORKER_SIGKILL]
    rng.shuffle(order)
    region_faults = []
    for i, kind in enumerate(order):
        region, epoch = rng.randrange(PARALLELISM), 2 + i
        seconds = {FaultKind.STALLED_REGION: tuning.stall_s, FaultKind.WORKER_SIGKILL: tuning.slow_s}
        spec = (
            f"fail:{region}@{epoch}"
            if kind is FaultKind.READER_FAILURE
            else f"stall:{seconds[kind]:g}:{region}@{epoch}"
        )
        region_faults.append(RegionFaultSpec(kind, region, epoch, spec))
    by_kind = {f.kind: f for f in region_faults}
    acts = [
        Act(
            "faults",
            epochs=7,
            crash=points[0],
            crash_after=4,
            region_faults=tuple(region_faults),
            worker_kill_epoch=by_kind[FaultKind.WORKER_SIGKILL].epoch,
            concurrent_epoch=by_kind[FaultKind.STALLED_REGION].epoch,
            meets=(*order, FaultKind.CONCURRENT_DRIVER, FaultKind.CONCURRENT_RECOVER),
        )
    ]
    broker_acts = set(rng.sample(range(3), PLANNED[FaultKind.BROKER_SIGKILL]))
    for i in range(3):
        kill = i in broker_acts
        acts.append(
            Act(
                f"ingest-{i + 1}",
                epochs=5 if kill else 4,
                crash=points[1 + 2 * i],
                # with a broker SIGKILL: in the epoch after the one that meets it (a crash at after_plan
                # in that epoch would come before the kill, whose delay starts at the epoch line)
                crash_after=2 if kill else 1,
                broker_kill=kill,
                broker_kill_delay_s=round(rng.uniform(0.0, 0.5), 2) if kill else 0.0,
                produce=True,
                meets=(FaultKind.BROKER_SIGKILL,) if kill else (),
            )
        )
        if i < 2:
            up = i == 0
            acts.append(
                Act(
                    "rescale-up" if up else "rescale-down",
                    epochs=4 if pause and not up else 3,
                    crash=points[2 + 2 * i],
                    # one checkpoint at the new parallelism first; a paused driver is woken heading for
                    # the next epoch (the takeover's): its crash point comes one later, past the fence
                    crash_after=2 if pause and not up else 1,
                    rescale_to=RESCALED_PARALLELISM if up else PARALLELISM,
                    pause=pause and not up,
                    meets=(FaultKind.RESCALE_UP,)
                    if up
                    else (FaultKind.RESCALE_DOWN, *((FaultKind.DRIVER_SIGSTOP,) if pause else ())),
                )
            )
    return acts


def planned_counts(acts: list[Act]) -> dict[FaultKind, int]:
    """How many faults of each kind ``acts`` meet (a crash each, plus what they name in ``meets``):
    every kind of PLANNED, and any other kind they meet."""
    counts = {kind: 0 for kind in FaultKind}
    for act in acts:
        counts[FaultKind.DRIVER_SIGKILL] += 1
        for kind in act.meets:
            counts[kind] += 1
    return {kind: n for kind, n in counts.items() if kind in PLANNED or n}
