"""Operator requests to a running pipeline, in a Delta table beside its state (``state/control.ddl``).

Rules:

1. :meth:`ControlRequests.request_stop` appends a ``stop`` request (who asked, when). It
   writes nothing else, needs no lease (the run that holds it is the one being asked), and
   may be repeated.
2. :meth:`ControlRequests.stop_requested_since` answers whether a stop was requested at or
   after a moment (a run asks with its own start time, so an old request stops nothing).
   It only reads; a missing table is no request.

The run that is asked ends on a final global checkpoint and exits normally (protocol rule
2.6); ``splitkeeper stop`` also sends SIGTERM to a holder on the same host, which has the
same effect at once.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import StateTables

__all__ = ["CONTROL_TABLE", "ControlRequests", "requester"]

CONTROL_TABLE = "control"
STOP = "stop"


def requester() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in a container
        user = "unknown"
    return f"{user}@{socket.gethostname()} (pid {os.getpid()}: {' '.join(sys.argv)[:200]})"


class ControlRequests:
    """The control requests of one pipeline (see the module doc)."""

    def __init__(self, tables: StateTables, pipeline: str) -> None:
        self.tables = tables
        self.pipeline = pipeline

    def request_stop(self) -> datetime:
        """Rule 1; returns when the request was recorded."""
        now = datetime.now(UTC)
        row = {"pipeline": self.pipeline, "request": STOP, "requested_at": now, "requested_by": requester()}
        self.tables.ensure(CONTROL_TABLE)
        self.tables.append(CONTROL_TABLE, spec(CONTROL_TABLE).rows([row]))
        return now

    def stop_requested_since(self, moment: datetime) -> bool:
        """Rule 2."""
        rows = self.tables.read(CONTROL_TABLE, columns=["pipeline", "request", "requested_at"])
        if rows.num_rows == 0:
            return False
        mask = pc.and_(
            pc.and_(pc.equal(rows["pipeline"], self.pipeline), pc.equal(rows["request"], STOP)),
            pc.greater_equal(rows["requested_at"], pa.scalar(moment, rows.schema.field("requested_at").type)),
        )
        return bool(pc.any(mask).as_py())
