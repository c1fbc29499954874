"""Faults injected from outside a running driver: the broker, a Python worker, a second driver.

Each :class:`LiveFault` watches the epoch lines of one driver process (an act of the
schedule), starts its injection in a thread of its own when its epoch line comes, and
once the process exited turns what it saw into :class:`~splitkeeper_tools.chaos.schedule.Fault`
records with their evidence. The driver is never told: it meets the fault as it would in
production.
"""

from __future__ import annotations

import abc
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from splitkeeper_tools.chaos.processes import (
    EpochLine,
    RunOutcome,
    ancestry,
    command_line,
    in_sleep,
    pyspark_workers,
    say,
)
from splitkeeper_tools.chaos.schedule import Fault, FaultKind
from splitkeeper_tools.kafka_testbed import BrokerCrash, BrokerHandle

Launch = Callable[[str, list[str]], RunOutcome]  # (label, splitkeeper argv) -> outcome, in a child process


class LiveFault(abc.ABC):
    """A fault started when the watched driver prints the epoch line :meth:`due` accepts.

    :meth:`on_epoch` is called on every epoch line, from the thread that reads the driver's
    output; :meth:`inject` runs once, in its own thread; :meth:`faults` is called after the
    driver exited (and :meth:`join`).
    """

    def __init__(self, run: str) -> None:
        self.run = run  # the label of the watched driver process
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def due(self, line: EpochLine) -> bool:
        """Whether the fault starts now that the driver printed ``line``."""

    @abc.abstractmethod
    def inject(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        """Inject the fault into the running driver ``proc``, which just printed ``line`` (own thread)."""

    @abc.abstractmethod
    def faults(self, outcome: RunOutcome) -> list[Fault]:
        """The faults meant, with what the evidence says, once the driver exited."""

    def on_epoch(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        if self._thread is None and self.due(line):
            self._thread = threading.Thread(target=self._guarded, args=(line, proc), daemon=True)
            self._thread.start()

    def _guarded(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        try:
            self.inject(line, proc)
        except Exception as err:  # noqa: BLE001 - reported as the fault's evidence
            self.error = err
            say(f"[{self.run}] {type(self).__name__} failed: {err!r}")

    def join(self, timeout_s: float = 600) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _not_started(self) -> str:
        if self.error is not None:
            return f"the injection failed: {self.error!r}"
        return "its epoch line never came" if self._thread is None else ""


class BrokerKill(LiveFault):
    """SIGKILL the broker while the driver reads and the producer has messages in flight, then restart it.

    Triggered by the driver's first epoch line (the next epoch discovers, plans and reads; the
    previous one just committed its offsets to the group): the driver's process tree is SIGSTOPped
    there, so the kill meets it alive in that next epoch however fast its epochs are (an epoch with
    nothing new takes milliseconds: a driver ran past its crash point within the delay once), and
    SIGCONTed as soon as the broker is dead, to go on against a broker that is down and then
    restarted. ``delay_s`` (seeded, 0-0.5 s) is how long the frozen driver waits before the kill.
    Right before the kill ``burst`` messages are handed to the idempotent producer without waiting,
    so produce requests are in flight when the broker dies; their delivery reports come after the
    restart. ``after`` runs once the broker is back (the rest of the share).
    """

    def __init__(
        self,
        run: str,
        broker: BrokerHandle,
        delay_s: float,
        enqueue: Callable[[], int],
        after: Callable[[], None],
    ) -> None:
        super().__init__(run)
        self.broker = broker
        self.delay_s = delay_s
        self.enqueue = enqueue
        self.after = after
        self.during_epoch: int | None = None
        self.in_flight = 0
        self.driver_alive = False
        self.crash: BrokerCrash | None = None
        self.handed_over = False  # the share went to the producer (burst and rest)

    def due(self, line: EpochLine) -> bool:
        return True

    def inject(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        from splitkeeper_tools.chaos.processes import descendants

        self.during_epoch = line.epoch + 1
        stopped: list[int] = []
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)

        def thaw() -> None:
            for pid in reversed(stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            stopped.clear()

        try:
            time.sleep(self.delay_s)
            self.in_flight = self.enqueue()
            self.driver_alive = proc.poll() is None
            say(
                f"[{self.run}] SIGKILL of the broker during epoch {self.during_epoch} "
                f"({self.in_flight} messages in flight, driver alive: {self.driver_alive})"
            )
            self.handed_over = True
            try:
                self.crash = self.broker.crash_and_restart(down_s=1.0, on_killed=thaw)
                say(f"[{self.run}] {self.crash.describe()}")
            finally:
                self.after()
        finally:
            thaw()

    def settle(self) -> None:
        """Once the driver exited: hand the share over if the kill never came (every message is produced;
        the fault itself is reported missing)."""
        if self._thread is None and not self.handed_over:
            self.handed_over = True
            self.enqueue()
            self.after()

    def faults(self, outcome: RunOutcome) -> list[Fault]:
        fault = Fault(
            FaultKind.BROKER_SIGKILL,
            self.run,
            "the broker process is SIGKILLed (no controlled shutdown) while a driver reads and commits "
            "and the producer has messages in flight, then started again",
            self.during_epoch,
        )
        if self.crash is None:
            fault.evidence = self._not_started() or "the broker was not killed"
            return [fault]
        line = outcome.epoch(self.during_epoch or 0)
        fault.injected = self.crash.exit_status == -9 and self.driver_alive and self.in_flight > 0
        fault.evidence = (
            f"{self.crash.describe()}; {self.in_flight} producer messages in flight at the kill; driver "
            f"pid {outcome.pid} alive at the kill: {self.driver_alive}; epoch {self.during_epoch} "
            + ("not printed" if line is None else f"{line.kind}, failed regions {line.failed or 'none'}")
            + f"; the driver exited {outcome.returncode}"
        )
        return [fault]


class WorkerKill(LiveFault):
    """SIGKILL the Python worker that runs the slow region's task of ``epoch`` while it runs.

    The slow region's task sleeps ``slow_s`` seconds before it reads (``--fault
    stall:S:R@E`` within the timeout); its worker is the driver's pyspark worker
    (:func:`~splitkeeper_tools.chaos.processes.pyspark_workers`) that is asleep and was not asleep
    when epoch ``epoch - 1`` ended. Without the kill the region would acknowledge; with it, Spark
    reports the worker lost and, where it gives a task one attempt (local Spark), the region
    declines. With ``reruns`` (a Spark standalone master: ``spark.task.maxFailures`` 4) Spark runs
    the task again, and the region acknowledges from that attempt (only the path a finished attempt
    reported is committed; the sink check shows nothing twice) or declines when attempts run out.

    With ``long_lived`` (``readers: long_lived``) the worker is a reader slot's, held by the run's
    reader job since the slot said hello (blocked on its socket between epochs, not asleep): the
    evidence must also name that slot (the driver's ``reader slot (J, I) ready (task T, pid P)``
    line with the killed pid), and says whether a new reader job replaced the one the kill failed.
    """

    def __init__(
        self,
        run: str,
        epoch: int,
        region: int,
        window_s: float,
        reruns: bool = False,
        long_lived: bool = False,
    ) -> None:
        super().__init__(run)
        self.epoch = epoch
        self.region = region
        self.window_s = window_s
        self.reruns = reruns
        self.long_lived = long_lived
        self.killed: tuple[int, str, str] | None = None  # pid, its ancestry, its command line
        self.after_s = 0.0

    def due(self, line: EpochLine) -> bool:
        return line.epoch == self.epoch - 1

    def inject(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        started = time.monotonic()
        asleep_before = {w for w in pyspark_workers(proc.pid) if in_sleep(w)}  # a cancelled stall's
        while proc.poll() is None and time.monotonic() - started < self.window_s:
            for worker in pyspark_workers(proc.pid):
                if worker not in asleep_before and in_sleep(worker):
                    chain, cmd = ancestry(worker, proc.pid), command_line(worker)
                    os.kill(worker, signal.SIGKILL)
                    self.killed, self.after_s = (worker, chain, cmd), time.monotonic() - started
                    say(f"[{self.run}] SIGKILL of Python worker {chain}")
                    return
            time.sleep(0.05)

    def faults(self, outcome: RunOutcome) -> list[Fault]:
        fault = Fault(
            FaultKind.WORKER_SIGKILL,
            self.run,
            f"the Python worker running region {self.region}'s task of epoch {self.epoch} (slowed within "
            "the timeout) is SIGKILLed",
            self.epoch,
        )
        line = outcome.epoch(self.epoch)
        if self.killed is None:
            fault.evidence = self._not_started() or f"no sleeping worker found within {self.window_s:g}s"
            return [fault]
        pid, chain, _cmd = self.killed
        lost = "Python worker exited unexpectedly" in outcome.stderr
        declined = line is not None and line.failed.get(self.region) == "decline"
        rerun = self.reruns and lost and line is not None and self.region not in line.failed
        fault.injected = declined or rerun
        fault.evidence = (
            f"pid {pid} asleep in the task's stall, SIGKILLed {self.after_s:.1f}s after epoch "
            f"{self.epoch - 1} ended: {chain}; epoch {self.epoch} "
            + ("not printed" if line is None else f"{line.kind}, failed regions {line.failed or 'none'}")
            + ("; Spark: 'Python worker exited unexpectedly'" if lost else "")
            + (f"; Spark ran the task again and region {self.region} acknowledged" if rerun else "")
        )
        if self.long_lived:
            slot = re.search(rf"reader slot (\(\d+, \d+\)) ready \(task (\d+), pid {pid}\)", outcome.stderr)
            jobs = len(re.findall(r"starting reader job \d+", outcome.stderr))
            fault.injected = fault.injected and slot is not None
            fault.evidence += (
                f"; long-lived reader slot {slot[1]} (task {slot[2]}) was that worker"
                if slot is not None
                else f"; no long-lived reader slot had pid {pid}"
            ) + f"; {jobs} reader jobs started in the run"
        return [fault]


class ConcurrentDrivers(LiveFault):
    """Start a second ``run`` and a ``recover`` of the same pipeline while the driver runs ``epoch``.

    Both must stop before writing anything: exit 2 with ``[LEASE_HELD]`` (protocol rule
    5.6), no epoch line, while the running driver stays alive; the sink check at the end
    shows nothing was duplicated. ``epoch`` is a long one (a stalled region), so the
    running driver is mid-run for the whole attempt. Both start when the epoch before it starts
    (at the line of ``epoch - 2``): a window of two epochs. With long-lived readers the epoch
    after the stall launches no job and the driver reaches its crash point a second or two after
    the stall; at load 30-40 on 2 cores the two attempts took 42-46 s to read the lease, past the
    stalled epoch's 31 s, and found the holder gone.
    """

    def __init__(self, run: str, epoch: int, config: Path, launch: Launch) -> None:
        super().__init__(run)
        self.epoch = epoch
        self.config = config
        self.launch = launch
        self.outcomes: dict[FaultKind, RunOutcome] = {}
        self.alive = (False, False)  # the running driver, at the start and at the end of both

    def due(self, line: EpochLine) -> bool:
        return line.epoch == max(1, self.epoch - 2)

    def inject(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        cfg = str(self.config)
        commands = {
            FaultKind.CONCURRENT_DRIVER: ("second-driver", ["run", "--config", cfg, "--epochs", "1"]),
            FaultKind.CONCURRENT_RECOVER: (
                "concurrent-recover",
                ["recover", "--config", cfg, "--checkpoint", "latest", "--epochs", "1"],
            ),
        }
        alive_before = proc.poll() is None

        def start(kind: FaultKind) -> None:
            label, argv = commands[kind]
            self.outcomes[kind] = self.launch(label, argv)

        threads = [threading.Thread(target=start, args=(kind,), daemon=True) for kind in commands]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.alive = (alive_before, proc.poll() is None)

    def faults(self, outcome: RunOutcome) -> list[Fault]:
        out = []
        for kind, what in (
            (FaultKind.CONCURRENT_DRIVER, "a second `run`"),
            (FaultKind.CONCURRENT_RECOVER, "a `recover --checkpoint latest`"),
        ):
            fault = Fault(
                kind,
                self.run,
                f"{what} of the same pipeline starts while driver pid {outcome.pid} runs epoch {self.epoch} "
                "or the one before: refused by the pipeline lease (exit 2, [LEASE_HELD]) before it writes",
                self.epoch,
            )
            other = self.outcomes.get(kind)
            if other is None:
                fault.evidence = self._not_started() or "not started"
            else:
                held = next((ln for ln in other.stderr.splitlines() if "[LEASE_HELD]" in ln), "")
                refused = other.returncode == 2 and bool(held) and not other.epochs
                fault.injected = refused and all(self.alive)
                fault.evidence = (
                    f"exit {other.returncode} after {other.elapsed_s:g}s, {len(other.epochs)} epochs; "
                    + (f"{held.strip()[:260]}" if held else "no [LEASE_HELD]")
                    + f"; the running driver alive before/after: {self.alive[0]}/{self.alive[1]}"
                )
            out.append(fault)
        return out


#: DriverPause: takeover runs at most while the driver stays frozen (one a store fault stopped runs again).
TAKEOVER_RUNS = 3


class DriverPause(LiveFault):
    """SIGSTOP the driver past its lease's ttl while a takeover runs; then SIGCONT it.

    After the driver's epoch line ``epoch`` its whole process tree (the driver, its JVM, its
    Python workers) is SIGSTOPped; a takeover ``run`` of the same pipeline (its own config file,
    whose ``lease.wait_s`` outlasts the ttl) watches the frozen holder's lease for the ttl by its
    own clock, takes it over and commits an epoch; then the tree is SIGCONTed. The woken driver
    must commit nothing more: its lease re-check before the sink commit, or the fence in the
    commit, stops it (exit 2, ``[LEASE_LOST]`` or ``[CONCURRENT_RUN]``); the verification at the
    end shows the data exact. A takeover that an injected store fault stops
    (:func:`~splitkeeper_tools.chaos.store.store_failures`) runs again while the driver stays
    frozen, up to :data:`TAKEOVER_RUNS` in all: the fault is about the woken driver, which a
    takeover that committed nothing cannot show.
    """

    def __init__(self, run: str, epoch: int, takeover: Path, ttl_s: float, launch: Launch) -> None:
        super().__init__(run)
        self.epoch = epoch
        self.takeover = takeover
        self.ttl_s = ttl_s
        self.launch = launch
        self.outcome: RunOutcome | None = None
        self.frozen_s = 0.0
        self.stopped: list[int] = []

    def due(self, line: EpochLine) -> bool:
        return line.epoch >= self.epoch

    def inject(self, line: EpochLine, proc: subprocess.Popen[str]) -> None:
        from splitkeeper_tools.chaos.processes import descendants
        from splitkeeper_tools.chaos.store import store_failures

        self.epoch = line.epoch
        started = time.monotonic()
        for pid in [proc.pid, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append(pid)
        say(
            f"[{self.run}] SIGSTOP of driver pid {proc.pid} ({len(self.stopped)} processes) "
            f"after epoch {line.epoch}"
        )
        try:
            argv = ["run", "--config", str(self.takeover), "--epochs", "1"]
            self.outcome = self.launch("takeover", argv)
            for again in range(1, TAKEOVER_RUNS):
                if not store_failures([self.outcome]):
                    break
                # a store fault stopped it before it committed (--store s3): again, the driver still frozen
                say(f"[{self.run}] the takeover failed on the store: it runs again, the driver still frozen")
                self.outcome = self.launch(f"takeover-again{again}", argv)
        finally:
            self.frozen_s = time.monotonic() - started
            for pid in reversed(self.stopped):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            say(f"[{self.run}] SIGCONT of the driver after {self.frozen_s:.0f}s")

    def faults(self, outcome: RunOutcome) -> list[Fault]:
        fault = Fault(
            FaultKind.DRIVER_SIGSTOP,
            self.run,
            f"the driver is SIGSTOPped after an epoch line, past its lease's {self.ttl_s:g}s ttl; a takeover "
            "`run` takes the lease over and commits; the driver, SIGCONTed, must commit nothing more",
            self.epoch,
        )
        if self.outcome is None:
            fault.evidence = self._not_started() or "no takeover ran"
            return [fault]
        takeover = self.outcome
        committed = [e.epoch for e in takeover.epochs if e.completed]
        late = [e.epoch for e in outcome.epochs if e.epoch > self.epoch and e.completed]
        stopped = next(
            (ln for ln in outcome.stderr.splitlines() if "[LEASE_LOST]" in ln or "[CONCURRENT_RUN]" in ln), ""
        )
        fault.injected = (
            self.frozen_s >= self.ttl_s
            and takeover.returncode == 0
            and bool(committed)
            and not late
            and outcome.returncode == 2
            and bool(stopped)
        )
        fault.evidence = (
            f"frozen {self.frozen_s:.0f}s; takeover exit {takeover.returncode}, committed {committed}; "
            f"the woken driver exit {outcome.returncode}, committed after waking {late or 'nothing'}; "
            + (stopped.strip()[:260] if stopped else "no [LEASE_LOST] or [CONCURRENT_RUN]")
        )
        return [fault]
