"""The pipeline lease: who drives a pipeline now, in a Delta table beside its state.

A driver takes the lease before it writes, heartbeats while it runs and releases it
when it stops; another driver of the same pipeline is refused with a message that
says who holds it, since when, until when and what to do. The lease lives in the
``lease`` table under the state root (``state/lease.ddl``): one row, replaced by every
write, each write fenced on the lease's *generation* (:mod:`~splitkeeper.delta.fence`:
app id = pipeline, version = generation), so two writers of one generation never both
land.

Rules:

1. :meth:`PipelineLease.take` succeeds when nobody holds the lease: no row, a released
   row, an expired one (``expires_at`` passed: the holder stopped heartbeating), or one
   whose holder ran on this host and its process is gone (killed: no need to wait for
   the expiry). Takeovers are logged. A live holder refuses it with
   :class:`LeaseHeldError`. Each take gets a fresh ``token`` and the next generation.
2. :meth:`PipelineLease.heartbeat` moves ``heartbeat_at`` and ``expires_at`` forward,
   fenced on the generation this holder wrote last: if anybody wrote since (a takeover
   after expiry), it fails with :class:`LeaseLostError` and writes nothing.
3. :meth:`PipelineLease.release` marks the lease released (the next take needs no
   expiry); after a takeover it writes nothing (the lease is not ours to release).
4. :meth:`PipelineLease.holder` only reads (``status`` uses it; a missing table is no
   holder).
5. :func:`held` takes the lease and heartbeats it from a daemon thread every
   ``ttl_s / 3``; :meth:`HeldLease.check` raises the error that stopped the heartbeats
   (lease lost), so the driver stops before it writes (its ``before_epoch`` hook).

Time is the wall clock of the machines involved (UTC); the ttl must exceed their
clock skew plus a heartbeat interval. The fences of the sink and the state tables
hold whatever the lease says: the lease makes a second run stop early, with a clear
message, instead of at its first commit.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from splitkeeper import process
from splitkeeper.core.defaults import LEASE_TTL_S
from splitkeeper.delta.fence import fenced_commit
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import StateTables, guarded
from splitkeeper.errors import ConcurrentRunError, InvalidParameterError

__all__ = [
    "HeldLease",
    "LeaseHeldError",
    "LeaseHolder",
    "LeaseLostError",
    "LeaseOwner",
    "PipelineLease",
    "held",
]

log = logging.getLogger(__name__)

LEASE_TABLE = "lease"


class LeaseHeldError(ConcurrentRunError):
    """Another live run holds the pipeline's lease."""

    code = "LEASE_HELD"


class LeaseLostError(ConcurrentRunError):
    """This run's lease was taken over (it had expired) or changed under it."""

    code = "LEASE_LOST"


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

    def live(self, now: datetime) -> bool:
        return not self.released and self.expires_at > now and not self.owner.gone()

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


class PipelineLease:
    """The lease of ``pipeline`` in the ``lease`` table under the state root ``tables`` (see the module doc).

    One object per holder; not shared between threads except through :func:`held`.
    """

    def __init__(self, tables: StateTables, pipeline: str) -> None:
        if not isinstance(pipeline, str) or not pipeline:
            raise InvalidParameterError("pipeline", pipeline, "a non-empty pipeline name")
        self.tables = tables
        self.pipeline = pipeline
        self.mine: LeaseHolder | None = None  # what this object wrote last
        self._ttl_s = 0.0

    # -- reads --

    def _read(self) -> tuple[Any, LeaseHolder | None]:
        table = self.tables.get(LEASE_TABLE)
        if table is None:
            return None, None
        rows = self.tables.read(LEASE_TABLE, table=table).to_pylist()
        rows = [r for r in rows if r["pipeline"] == self.pipeline]
        return table, (LeaseHolder.from_row(max(rows, key=lambda r: r["generation"])) if rows else None)

    def holder(self) -> LeaseHolder | None:
        """The lease row, live or not; None when the pipeline never had a lease (rule 4)."""
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

    def take(self, owner: LeaseOwner | None = None, ttl_s: float = LEASE_TTL_S) -> LeaseHolder:
        """Take the lease for ``ttl_s`` seconds (rule 1); LeaseHeldError while another run holds it."""
        if not isinstance(ttl_s, int | float) or isinstance(ttl_s, bool) or ttl_s <= 0:
            raise InvalidParameterError("ttl_s", ttl_s, "seconds > 0")
        owner = owner or LeaseOwner.this_process()
        table, current = self._read()
        if table is None:
            table, _created = self.tables.ensure(LEASE_TABLE)
            table, current = self._read()
        now = _now()
        if current is not None and current.live(now):
            raise LeaseHeldError(
                f"pipeline {self.pipeline!r} is driven by {current.owner.describe()} since "
                f"{current.acquired_at.isoformat(timespec='seconds')}; its lease runs until "
                f"{current.expires_at.isoformat(timespec='seconds')} (last heartbeat "
                f"{current.heartbeat_at.isoformat(timespec='seconds')}). Wait for that run to finish, or "
                "stop it; if it died, the lease can be taken over after "
                f"{current.expires_at.isoformat(timespec='seconds')}",
                pipeline=self.pipeline,
                holder=current.owner.describe(),
                since=current.acquired_at.isoformat(),
                until=current.expires_at.isoformat(),
            )
        if current is not None and not current.released:
            log.warning(
                "pipeline %s: taking over the lease of %s, which %s (last heartbeat %s)",
                self.pipeline,
                current.owner.describe(),
                "is no longer running on this host"
                if current.owner.gone()
                else f"expired at {current.expires_at.isoformat()}",
                current.heartbeat_at.isoformat(),
            )
        expected = table.transaction_version(self.pipeline)
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
                f"pipeline {self.pipeline!r}: another run took the lease at the same moment "
                f"({winner.owner.describe() if winner else 'unknown'}); this run stops",
                pipeline=self.pipeline,
            ) from err
        self._ttl_s = float(ttl_s)
        return row

    def _fenced_update(self, change: dict[str, Any], what: str) -> LeaseHolder:
        if self.mine is None:
            raise LeaseLostError(
                f"pipeline {self.pipeline!r}: this run holds no lease", pipeline=self.pipeline
            )
        mine = self.mine
        table = self.tables.require(LEASE_TABLE)
        current = table.transaction_version(self.pipeline)
        if current != mine.generation:
            holder = self.holder()
            raise LeaseLostError(
                f"pipeline {self.pipeline!r}: the lease of this run ({mine.owner.describe()}) was taken over "
                f"by {holder.owner.describe() if holder else 'another run'} at "
                f"{holder.acquired_at.isoformat(timespec='seconds') if holder else 'an unknown time'} "
                "(it had expired: no heartbeat within its ttl). This run must stop without writing",
                pipeline=self.pipeline,
                found=current,
                expected=mine.generation,
            )
        row = replace(mine, generation=mine.generation + 1, **change)
        try:
            self._write(table, row, mine.generation, what)
        except ConcurrentRunError as err:
            raise LeaseLostError(
                f"pipeline {self.pipeline!r}: the lease changed while this run renewed it: another run took "
                "it over; this run must stop without writing",
                pipeline=self.pipeline,
            ) from err
        return row

    def heartbeat(self) -> LeaseHolder:
        """Extend the lease by its ttl (rule 2); LeaseLostError after a takeover."""
        now = _now()
        return self._fenced_update(
            {"heartbeat_at": now, "expires_at": now + timedelta(seconds=self._ttl_s or 60.0)}, "heartbeat"
        )

    def release(self) -> bool:
        """Give the lease back (rule 3); False (nothing written) when it was taken over."""
        if self.mine is None:
            return False
        try:
            self._fenced_update({"released": True, "heartbeat_at": _now()}, "release")
        except LeaseLostError as err:
            log.warning("%s", err.message)
            return False
        return True


class HeldLease:
    """A lease held by this process, heartbeated from a daemon thread (see :func:`held`)."""

    def __init__(self, lease: PipelineLease, interval_s: float) -> None:
        self.lease = lease
        self.interval_s = interval_s
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="splitkeeper-lease", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.lease.heartbeat()
            except BaseException as err:  # noqa: BLE001 - kept for check(); the thread ends
                self.error = err
                log.error("pipeline %s: lease heartbeat failed: %s", self.lease.pipeline, err)
                return

    def check(self) -> None:
        """Raise the error that stopped the heartbeats (the lease is lost); return quietly otherwise."""
        if self.error is not None:
            if isinstance(self.error, LeaseLostError):
                raise self.error
            raise LeaseLostError(
                f"pipeline {self.lease.pipeline!r}: the lease could not be renewed ({self.error}); this run "
                "must stop: another run may take it over once it expires",
                pipeline=self.lease.pipeline,
            ) from self.error

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
) -> Iterator[HeldLease]:
    """Take ``lease``, heartbeat it every ``interval_s`` (default ``ttl_s / 3``), release it on exit
    (rule 5)."""
    lease.take(owner, ttl_s)
    holding = HeldLease(lease, interval_s if interval_s is not None else ttl_s / 3)
    holding._thread.start()
    try:
        yield holding
    finally:
        holding.stop()
        if holding.error is None:
            lease.release()
