"""The pipeline lease: who drives a pipeline now, in a Delta table beside its state.

A driver takes the lease before it writes, heartbeats while it runs and releases it
when it stops; another driver of the same pipeline is refused with a message that
says who holds it, since when, and what to do. The lease lives in the ``lease`` table
under the state root (``state/lease.ddl``): one row, replaced by every write, each
write fenced on the lease's *generation* (:mod:`~splitkeeper.delta.fence`: app id =
pipeline, version = generation), so two writers of one generation never both land.
Every write (take, heartbeat, release) moves the generation on: it is the heartbeat
counter.

No clock of another machine is trusted. ``acquired_at``, ``heartbeat_at`` and
``expires_at`` are the holder's wall clock, shown to people only; the one duration
read from the row is the holder's ttl (``expires_at - heartbeat_at``, one clock).

Rules:

1. :meth:`PipelineLease.take` takes the lease at once when nobody holds it: no row, a
   released row, or one whose holder ran on this host and its process is gone (killed:
   no need to wait). Otherwise the holder is *stale* only once its generation has not
   changed for the holder's ttl as measured by this reader's own monotonic clock, from
   the moment this reader (this process) first saw that generation. A take waits for
   that up to ``wait_s`` (polling the row); by default (0) it does not wait and a live
   or not yet proven stale holder refuses it with :class:`LeaseHeldError`, naming the
   holder and how a waiting run takes it over. The takeover write is fenced on the
   generation seen stale: a heartbeat landing meanwhile refuses it. Takeovers are logged.
   Each take gets a fresh ``token`` and the next generation.
2. :meth:`PipelineLease.heartbeat` moves the generation on, fenced on the generation
   this holder wrote last: if anybody wrote since (a takeover), it fails with
   :class:`LeaseLostError` and writes nothing.
3. :meth:`PipelineLease.verify` is the holder's check right before a sink commit: a
   fenced read (the generation is still ours) when its last renewal started less than
   half a ttl ago by its own monotonic clock, else a heartbeat (a paused holder that
   wakes up renews first: either its renewal lands, and a stale-looking takeover is
   fenced out, or it finds the takeover). LeaseLostError: nothing may be committed.
4. :meth:`PipelineLease.release` marks the lease released (the next take needs no
   wait); after a takeover it writes nothing (the lease is not ours to release).
5. :meth:`PipelineLease.holder` only reads (``status`` uses it; a missing table is no
   holder).
6. :func:`held` takes the lease and heartbeats it from a daemon thread every
   ``ttl_s / 3``. A heartbeat that fails for another reason than a takeover (a store
   error) is retried with backoff until the ttl since the last renewal is gone; then, or
   at a takeover, :meth:`HeldLease.check` raises the error, so the driver stops before
   its next epoch (``before_epoch``) and before any sink commit (``before_sink_commit``,
   which also calls :meth:`PipelineLease.verify`).

Clocks are injectable (:class:`LeaseClock`); the process's monotonic clock keeps what
it saw of every lease, so a take retried in the same process goes on watching. Clocks
of different hosts may differ by any amount; only their rates must agree within a small
fraction of the ttl. The fences of the sink and the state tables hold whatever the
lease says: the lease makes a second run stop early with a clear message, and keeps a
paused holder from committing once another run took over.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from splitkeeper import process
from splitkeeper.core.defaults import LEASE_TTL_S
from splitkeeper.delta import retries
from splitkeeper.delta.fence import fenced_commit
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import StateTables, guarded
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError, LeaseHeldError, LeaseLostError

__all__ = [
    "SYSTEM_CLOCK",
    "HeldLease",
    "LeaseClock",
    "LeaseHeldError",
    "LeaseHolder",
    "LeaseLostError",
    "LeaseOwner",
    "PipelineLease",
    "held",
]

log = logging.getLogger(__name__)

LEASE_TABLE = "lease"


@dataclass(frozen=True, slots=True)
class LeaseOwner:
    """Who takes a lease: the host, the process, its command line and (on Linux) its identity.

    ``process`` (:func:`splitkeeper.process.identity`) tells this process apart from a later one
    that got the same pid, and from a process of another container with the same
    host name (another pid namespace or boot).
    """

    host: str
    pid: int
    command: str
    process: str | None = None

    @classmethod
    def this_process(cls) -> LeaseOwner:
        pid = os.getpid()
        return cls(socket.gethostname(), pid, " ".join(sys.argv)[:500] or "python", process.identity(pid))

    def describe(self) -> str:
        return f"{self.command!r} (pid {self.pid} on {self.host})"

    def gone(self) -> bool:
        """True when this owner's process certainly no longer exists.

        Only a process this one can see is checked: the same host, and when the owner
        recorded its identity, the same boot and pid namespace. Then the owner is gone
        when its pid is free or now names a process that started at another time (a
        reused pid). For anything else it is False: the lease's expiry decides.
        """
        if self.host != socket.gethostname() or self.pid <= 0 or self.pid == os.getpid():
            return False
        if self.process is not None:
            namespace = process.namespace()
            if namespace is None or not self.process.startswith(namespace + "/"):
                return False  # another container or boot: its processes are not ours to see
            now = process.identity(self.pid)
            return now is None or self.process != now
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # exists, another user's
            return False
        return False


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """The lease row: who holds it (or held it last), since when, until when."""

    pipeline: str
    generation: int
    token: str
    owner: LeaseOwner
    acquired_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    released: bool

    def live(self) -> bool:
        """Not released and not known dead (its process gone from this host): held, for all a
        reader can tell without watching it (rule 1)."""
        return not self.released and not self.owner.gone()

    @property
    def ttl_s(self) -> float:
        """The holder's ttl: ``expires_at - heartbeat_at``, both of the holder's clock."""
        return max(0.0, (self.expires_at - self.heartbeat_at).total_seconds())

    def to_row(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "generation": self.generation,
            "token": self.token,
            "host": self.owner.host,
            "pid": self.owner.pid,
            "command": self.owner.command,
            "process": self.owner.process,
            "acquired_at": self.acquired_at,
            "heartbeat_at": self.heartbeat_at,
            "expires_at": self.expires_at,
            "released": self.released,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> LeaseHolder:
        return cls(
            pipeline=row["pipeline"],
            generation=int(row["generation"]),
            token=row["token"],
            owner=LeaseOwner(row["host"], int(row["pid"]), row["command"], row.get("process")),
            acquired_at=row["acquired_at"],
            heartbeat_at=row["heartbeat_at"],
            expires_at=row["expires_at"],
            released=bool(row["released"]),
        )


def _now() -> datetime:
    return datetime.now(UTC)


class LeaseClock:
    """The clocks of a lease reader or holder: ``monotonic`` decides (takeover, renewal), ``wall``
    only stamps the row for people; ``sleep`` waits. ``seen`` keeps, per lease, the generation
    this clock's reader saw last and when it first saw it (rule 1). Tests inject their own."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _now,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.monotonic = monotonic
        self.wall = wall
        self.sleep = sleep
        self.seen: dict[tuple[str, str], tuple[int, str, float]] = {}
        self.lock = threading.Lock()

    def silent_for(self, key: tuple[str, str], holder: LeaseHolder) -> float:
        """Seconds of this clock since it first saw ``holder``'s generation (0 the first time)."""
        now = self.monotonic()
        with self.lock:
            seen = self.seen.get(key)
            if seen is None or seen[:2] != (holder.generation, holder.token):
                self.seen[key] = (holder.generation, holder.token, now)
                return 0.0
            return now - seen[2]


#: The process's clocks: what a take saw is kept for the process's later takes.
SYSTEM_CLOCK = LeaseClock()


class PipelineLease:
    """The lease of ``pipeline`` in the ``lease`` table under the state root ``tables`` (see the module doc).

    One object per holder; shared between threads only through :func:`held` (its writes
    and :meth:`verify` are serialised).
    """

    def __init__(self, tables: StateTables, pipeline: str, clock: LeaseClock | None = None) -> None:
        if not isinstance(pipeline, str) or not pipeline:
            raise InvalidParameterError("pipeline", pipeline, "a non-empty pipeline name")
        self.tables = tables
        self.pipeline = pipeline
        self.clock = clock or SYSTEM_CLOCK
        self.mine: LeaseHolder | None = None  # what this object wrote last
        self._ttl_s = 0.0
        self.renewed_at = 0.0  # the clock's monotonic time when the last write of ``mine`` started
        self._lock = threading.RLock()

    @property
    def ttl_s(self) -> float:
        """The ttl this holder took the lease for."""
        return self._ttl_s or LEASE_TTL_S

    # -- reads --

    def _read(self) -> tuple[Any, LeaseHolder | None]:
        table = self.tables.get(LEASE_TABLE)
        if table is None:
            return None, None
        rows = self.tables.read(LEASE_TABLE, table=table).to_pylist()
        rows = [r for r in rows if r["pipeline"] == self.pipeline]
        return table, (LeaseHolder.from_row(max(rows, key=lambda r: r["generation"])) if rows else None)

    def holder(self) -> LeaseHolder | None:
        """The lease row, live or not; None when the pipeline never had a lease (rule 5)."""
        return self._read()[1]

    # -- writes --

    def _write(self, table: Any, row: LeaseHolder, expected: int | None, what: str) -> None:
        from deltalake import write_deltalake

        data = spec(LEASE_TABLE).rows([row.to_row()])
        fenced_commit(
            table,
            pipeline=self.pipeline,
            table_name=LEASE_TABLE,
            app_id=self.pipeline,
            version=row.generation,
            expected=expected,
            write=lambda t, p: guarded(
                t.table_uri, lambda: write_deltalake(t, data, mode="overwrite", commit_properties=p)
            ),
            metadata={"lease": what, "token": row.token},
            version_key="generation",
            attempt=f"{row.token}:{row.generation}",
            what="lease generation",
        )
        self.mine = row

    def take(
        self, owner: LeaseOwner | None = None, ttl_s: float = LEASE_TTL_S, wait_s: float = 0.0
    ) -> LeaseHolder:
        """Take the lease for ``ttl_s`` seconds (rule 1), waiting up to ``wait_s`` for a holder to
        prove stale; LeaseHeldError while another run holds it."""
        for name, value, positive in (("ttl_s", ttl_s, True), ("wait_s", wait_s, False)):
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not value >= 0
                or (positive and value == 0)
            ):
                raise InvalidParameterError(name, value, "seconds > 0" if positive else "seconds >= 0")
        owner = owner or LeaseOwner.this_process()
        clock = self.clock
        deadline = clock.monotonic() + wait_s
        while True:
            table, current = self._read()
            if table is None:
                table, _created = self.tables.ensure(LEASE_TABLE)
                table, current = self._read()
            silent = 0.0
            if current is not None and current.live():
                silent = clock.silent_for((str(table.table_uri), self.pipeline), current)
                if silent < current.ttl_s:
                    left = current.ttl_s - silent
                    if clock.monotonic() + left > deadline:
                        raise self._held_error(current, left, wait_s)
                    clock.sleep(min(left, max(current.ttl_s / 6, 0.05)))
                    continue
            return self._take(table, current, owner, float(ttl_s), silent)

    def _held_error(self, current: LeaseHolder, left: float, wait_s: float) -> LeaseHeldError:
        ttl = current.ttl_s
        watched = (
            f"this run would have to watch it {left:.1f} s more, past its lease.wait_s {wait_s:g}"
            if wait_s > 0
            else "this run does not wait: lease.wait_s 0"
        )
        return LeaseHeldError(
            f"pipeline {self.pipeline!r} is driven by {current.owner.describe()} since "
            f"{current.acquired_at.isoformat(timespec='seconds')} (its lease generation "
            f"{current.generation}, last heartbeat {current.heartbeat_at.isoformat(timespec='seconds')} "
            f"by its clock, ttl {ttl:g} s). Wait for that run to finish, or stop it; if it died or hangs, "
            f"a run that waits (lease.wait_s >= {ttl:g}) takes the lease over once no heartbeat came for "
            f"{ttl:g} s by its own clock ({watched})",
            pipeline=self.pipeline,
            holder=current.owner.describe(),
            since=current.acquired_at.isoformat(),
            generation=current.generation,
            ttl_s=ttl,
        )

    def _take(
        self, table: Any, current: LeaseHolder | None, owner: LeaseOwner, ttl_s: float, silent: float
    ) -> LeaseHolder:
        if current is not None and not current.released:
            log.warning(
                "pipeline %s: taking over the lease of %s, which %s (last heartbeat %s by its clock)",
                self.pipeline,
                current.owner.describe(),
                "is no longer running on this host"
                if current.owner.gone()
                else f"did not heartbeat for {silent:.1f} s of this host's clock (ttl {current.ttl_s:g} s)",
                current.heartbeat_at.isoformat(),
            )
        expected = table.transaction_version(self.pipeline)  # of the snapshot the row was read from
        with self._lock:
            started = self.clock.monotonic()
            now = self.clock.wall()
            row = LeaseHolder(
                pipeline=self.pipeline,
                generation=(expected or 0) + 1,
                token=uuid.uuid4().hex,
                owner=owner,
                acquired_at=now,
                heartbeat_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
                released=False,
            )
            try:
                self._write(table, row, expected, "take")
            except ConcurrentRunError as err:
                winner = self.holder()
                raise LeaseHeldError(
                    f"pipeline {self.pipeline!r}: the lease changed while this run took it "
                    f"({winner.owner.describe() if winner else 'unknown'} wrote it: a heartbeat or "
                    "another run's take); this run stops",
                    pipeline=self.pipeline,
                ) from err
            self._ttl_s = ttl_s
            self.renewed_at = started
            return row

    def _lost(self, mine: LeaseHolder, current: int | None) -> LeaseLostError:
        holder = self.holder()
        return LeaseLostError(
            f"pipeline {self.pipeline!r}: the lease of this run ({mine.owner.describe()}) was taken over "
            f"by {holder.owner.describe() if holder else 'another run'} at "
            f"{holder.acquired_at.isoformat(timespec='seconds') if holder else 'an unknown time'} "
            "(no heartbeat of this run was seen within its ttl). This run must stop without writing",
            pipeline=self.pipeline,
            found=current,
            expected=mine.generation,
        )

    def _fenced_update(self, change: Callable[[datetime], dict[str, Any]], what: str) -> LeaseHolder:
        with self._lock:
            if self.mine is None:
                raise LeaseLostError(
                    f"pipeline {self.pipeline!r}: this run holds no lease", pipeline=self.pipeline
                )
            mine = self.mine
            table = self.tables.require(LEASE_TABLE)
            current = table.transaction_version(self.pipeline)
            if current != mine.generation:
                raise self._lost(mine, current)
            started = self.clock.monotonic()
            row = replace(mine, generation=mine.generation + 1, **change(self.clock.wall()))
            try:
                self._write(table, row, mine.generation, what)
            except ConcurrentRunError as err:
                raise LeaseLostError(
                    f"pipeline {self.pipeline!r}: the lease changed while this run renewed it: another run "
                    "took it over; this run must stop without writing",
                    pipeline=self.pipeline,
                ) from err
            self.renewed_at = started
            return row

    def heartbeat(self) -> LeaseHolder:
        """Renew the lease: the next generation, ``expires_at`` a ttl on (rule 2); LeaseLostError
        after a takeover."""
        ttl = timedelta(seconds=self.ttl_s)
        return self._fenced_update(lambda now: {"heartbeat_at": now, "expires_at": now + ttl}, "heartbeat")

    def verify(self) -> None:
        """Right before a commit: the lease is still this run's (rule 3); LeaseLostError otherwise."""
        with self._lock:
            mine = self.mine
            if mine is None:
                raise LeaseLostError(
                    f"pipeline {self.pipeline!r}: this run holds no lease", pipeline=self.pipeline
                )
            if self.clock.monotonic() - self.renewed_at > self.ttl_s / 2:
                self.heartbeat()  # paused or slow: renew first (fenced), so no takeover can be decided
                return
            current = self.tables.require(LEASE_TABLE).transaction_version(self.pipeline)
            if current != mine.generation:
                raise self._lost(mine, current)

    def release(self) -> bool:
        """Give the lease back (rule 4); False (nothing written) when it was taken over."""
        if self.mine is None:
            return False
        try:
            self._fenced_update(lambda now: {"released": True, "heartbeat_at": now}, "release")
        except LeaseLostError as err:
            log.warning("%s", err.message)
            return False
        return True


class HeldLease:
    """A lease held by this process, heartbeated from a daemon thread (see :func:`held`)."""

    #: The first retry of a failed heartbeat waits this long; each next one twice as long (at most
    #: the heartbeat interval).
    RETRY_S = 0.25

    def __init__(self, lease: PipelineLease, interval_s: float) -> None:
        self.lease = lease
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self.retries = 0  # failed heartbeats retried (store errors), over the run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="splitkeeper-lease", daemon=True)

    def _beat(self) -> None:
        wait = self.interval_s
        failures = 0
        while not self._stop.wait(wait):
            try:
                self.lease.heartbeat()
            except LeaseLostError as err:
                self.error = err
                log.error("pipeline %s: lease lost: %s", self.lease.pipeline, err)
                return
            except Exception as err:  # noqa: BLE001 - a store error: retried while the ttl lasts
                failures += 1
                self.retries += 1
                retries.count("lease_heartbeat")
                clock = self.lease.clock
                left = self.lease.ttl_s - (clock.monotonic() - self.lease.renewed_at)
                wait = min(self.RETRY_S * 2 ** (failures - 1), self.interval_s, max(left, 0.0))
                if left <= 0:
                    self.error = err
                    log.error(
                        "pipeline %s: lease heartbeat failed %d times, the last renewal is a ttl old: %s",
                        self.lease.pipeline,
                        failures,
                        err,
                    )
                    return
                log.warning(
                    "pipeline %s: lease heartbeat failed (%s); retry %d in %.2f s (%.1f s of the ttl left)",
                    self.lease.pipeline,
                    err,
                    failures,
                    wait,
                    left,
                )
                continue
            failures = 0
            wait = self.interval_s

    def check(self) -> None:
        """Raise the error that stopped the heartbeats (the lease is lost); return quietly otherwise."""
        if self.error is not None:
            if isinstance(self.error, LeaseLostError):
                raise self.error
            raise LeaseLostError(
                f"pipeline {self.lease.pipeline!r}: the lease could not be renewed within its ttl "
                f"({self.error}); this run must stop: another run may take it over",
                pipeline=self.lease.pipeline,
            ) from self.error

    def verify(self) -> None:
        """Before a sink commit: :meth:`check`, then :meth:`PipelineLease.verify` (rule 3)."""
        self.check()
        self.lease.verify()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@contextmanager
def held(
    lease: PipelineLease,
    owner: LeaseOwner | None = None,
    ttl_s: float = LEASE_TTL_S,
    interval_s: float | None = None,
    wait_s: float = 0.0,
) -> Iterator[HeldLease]:
    """Take ``lease`` (waiting up to ``wait_s`` for a stale holder), heartbeat it every
    ``interval_s`` (default ``ttl_s / 3``), release it on exit (rule 6)."""
    lease.take(owner, ttl_s, wait_s)
    holding = HeldLease(lease, interval_s if interval_s is not None else ttl_s / 3)
    holding._thread.start()
    try:
        yield holding
    finally:
        holding.stop()
        if holding.error is None:
            lease.release()
