"""Fault injection for demos and tests: region failures, stalls, and driver crashes.

A :class:`FaultPlan` says which region fails or stalls at which epoch; the
epoch runner hands the matching :class:`~splitkeeper.spark.task.RegionFault`
to that region's task. Driver crashes are real: when ``SPLITKEEPER_CRASH_AT``
names a crash point (optionally ``point@epoch``, or ``point@epoch+`` for the first
epoch >= ``epoch`` that reaches the point), the driver process sends itself SIGKILL
there, leaving whatever was half-written for recovery to face. ``SPLITKEEPER_PAUSE_AT``
(the same grammar) makes it send itself SIGSTOP there instead, the first time the point
matches: a driver paused by the machine (a long GC pause, an overloaded host) until a test
sends SIGCONT.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from splitkeeper.core.ports import AnyCrashPoint, CrashPoint, SinkCrashPoint, UpkeepCrashPoint
from splitkeeper.errors import InvalidParameterError
from splitkeeper.spark.task import RegionFault

CRASH_ENV = "SPLITKEEPER_CRASH_AT"
PAUSE_ENV = "SPLITKEEPER_PAUSE_AT"
_paused: list[str] = []  # the pause this process made (one at most)


_FAULT = re.compile(r"^(?P<kind>fail|flaky|stall)(?::(?P<seconds>[0-9.]+))?:(?P<region>\d+)@(?P<epoch>\d+)$")


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Region faults by (epoch, region). Epochs are checkpoint ids as the runner numbers them."""

    faults: Mapping[tuple[int, int], RegionFault] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> FaultPlan:
        """Parse ``fail:R@E``, ``flaky:R@E`` (fails in the task's first attempt only, so a Spark task
        retry succeeds) and ``stall[:SECONDS]:R@E`` (default stall: one hour, past any timeout)."""
        faults: dict[tuple[int, int], RegionFault] = {}
        for spec in specs:
            m = _FAULT.match(spec.strip())
            if m is None:
                raise InvalidParameterError(
                    "fault",
                    spec,
                    "'fail:REGION@EPOCH', 'flaky:REGION@EPOCH' or 'stall[:SECONDS]:REGION@EPOCH', "
                    "e.g. fail:1@3 or stall:2@4",
                )
            text = f"stall:{m['seconds'] or 3600}" if m["kind"] == "stall" else m["kind"]
            faults[(int(m["epoch"]), int(m["region"]))] = RegionFault.parse(text)
        return cls(faults)

    def for_region(self, epoch: int, region: int) -> RegionFault | None:
        return self.faults.get((epoch, region))

    def __bool__(self) -> bool:
        return bool(self.faults)


_CRASH = re.compile(r"^(?P<point>[a-z_]+)(?:@(?P<epoch>\d+)(?P<later>\+)?)?$")


@dataclass(frozen=True, slots=True)
class CrashRequest:
    """What ``SPLITKEEPER_CRASH_AT`` asks for: die at ``point`` of ``epoch`` (None: of any epoch), or with
    ``or_later`` of the first epoch >= ``epoch`` that reaches ``point`` (an aborted epoch never reaches
    the points after the plan: the crash moves on to the next one)."""

    point: AnyCrashPoint
    epoch: int | None = None
    or_later: bool = False

    def matches(self, point: AnyCrashPoint, epoch: int) -> bool:
        if point is not self.point:
            return False
        if self.epoch is None:
            return True
        return epoch >= self.epoch if self.or_later else epoch == self.epoch


def crash_request(env: Mapping[str, str] | None = None, variable: str = CRASH_ENV) -> CrashRequest | None:
    """The crash ``SPLITKEEPER_CRASH_AT`` (or the pause ``variable`` names) asks for, or None.

    The driver calls it once at start (the pipeline's constructor) so that a
    misspelt value fails before anything is written, instead of never crashing.
    Raises InvalidParameterError naming the variable, the value and the points.
    """
    wanted = (os.environ if env is None else env).get(variable, "").strip()
    if not wanted:
        return None
    m = _CRASH.match(wanted)
    known: dict[str, AnyCrashPoint] = {p.value: p for p in (*CrashPoint, *SinkCrashPoint, *UpkeepCrashPoint)}
    points = list(known)
    if m is None or m["point"] not in points:
        raise InvalidParameterError(
            variable,
            wanted,
            f"'<point>', '<point>@<epoch>' or '<point>@<epoch>+' with point one of {', '.join(points)}",
        )
    return CrashRequest(
        known[m["point"]], None if m["epoch"] is None else int(m["epoch"]), m["later"] is not None
    )


def crash_if_requested(point: AnyCrashPoint, epoch: int, env: Mapping[str, str] | None = None) -> None:
    """SIGKILL this process when ``SPLITKEEPER_CRASH_AT`` names ``point`` (and matches ``epoch``).

    Called by the driver at each crash point. Nothing is flushed or cleaned up:
    that is the point. When ``SPLITKEEPER_PAUSE_AT`` names the point, the process stops
    itself (SIGSTOP) there first (once per process) and goes on when continued.
    """
    pause = crash_request(env, PAUSE_ENV)
    if pause is not None and pause.matches(point, epoch) and not _paused:
        _paused.append(point.value)
        print(f"splitkeeper: paused at {point.value} of epoch {epoch} (SIGSTOP)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    request = crash_request(env)
    if request is None or not request.matches(point, epoch):
        return
    print(
        f"splitkeeper: crash injected at {point.value} of epoch {epoch} (SIGKILL)",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGKILL)
