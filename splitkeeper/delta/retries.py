"""splitkeeper's own retries of store calls: the one loop, and its counts per operation (metrics).

The storage clients retry transient errors themselves (:mod:`splitkeeper.delta.storage` rule 4:
delta-rs, pyarrow), unseen here. On top of them, a write whose store call failed may still have
landed (a reset can cut the answer to a put that landed, and delta-rs does not retry a conditional
put), so splitkeeper's own retries of a write are one loop, :func:`send_until_landed`: send, and
after a failure read the store again, ask whether the write is there (landed), and only when it is
not send it again after a backoff. The fence's commit, a table's create and a state table's append
and delete are that loop; what differs is what "landed" reads. The store probe retries an HTTP
answer (no write to find again) and the lease heartbeat a renewal while its ttl lasts: each
:func:`back_off` of theirs is counted here all the same. (Our own and not ``tenacity``: the product's
data path does not depend on it, and the loop is the landed check, not the backoff.)

Each retry calls :func:`count` with its operation (:data:`OPERATIONS`):

- ``fence_reread``: a Delta commit whose store call failed (its answer may be lost) re-reads the
  table to find out whether it landed (:mod:`splitkeeper.delta.fence` step 5), again while the
  re-read fails;
- ``fence_resend``: a Delta commit that only commits a row (an epoch's plan, a checkpoint row)
  failed in the store and, read again, had not landed: it is sent again with the same app
  transaction (:mod:`splitkeeper.delta.fence` step 6);
- ``table_create``: creating a table (version 0) failed in the store: the table is read again,
  and created again while it is not there (:func:`splitkeeper.delta.tables.ensure_table`);
- ``state_append``: an append to a state table failed in the store and the table, read again,
  does not record it: it is sent again with the same app transaction
  (:meth:`splitkeeper.delta.tables.StateTables.append`, rule 4);
- ``state_delete``: a delete of settled rows of a state table failed (in the store, or refused as
  a copy of itself that had landed): the table is read again and the delete sent again (rule 5);
- ``store_probe``: the store probe's request answered 5xx or not at all, sent again
  (:mod:`splitkeeper.delta.probe`);
- ``lease_heartbeat``: a failed lease heartbeat, tried again while the ttl lasts
  (:mod:`splitkeeper.delta.lease`);
- ``source_sample``: the file source's one-GET content sample of a new object answered 5xx or
  not at all, sent again (:mod:`splitkeeper.sources.files.fs` contract 4).

:func:`counts` is what this process counted so far (a CLI run is one process);
:class:`~splitkeeper.app.metrics.PipelineMetrics` reports it as
``splitkeeper_store_retries_total{operation}``. Thread-safe (the heartbeat is a thread of its own).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

__all__ = ["OPERATIONS", "back_off", "count", "counts", "send_until_landed"]

log = logging.getLogger(__name__)

T = TypeVar("T")

OPERATIONS = (
    "fence_reread",
    "fence_resend",
    "table_create",
    "state_append",
    "state_delete",
    "store_probe",
    "lease_heartbeat",
    "source_sample",
)

_lock = threading.Lock()
_counts: Counter[str] = Counter()


def count(operation: str) -> None:
    """One retry of ``operation`` (one of :data:`OPERATIONS`)."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown retried operation {operation!r}: one of {OPERATIONS}")
    with _lock:
        _counts[operation] += 1


def counts() -> dict[str, int]:
    """The retries this process made so far, per operation (every operation, 0 included)."""
    with _lock:
        return {operation: _counts[operation] for operation in OPERATIONS}


def back_off(operation: str, attempt: int, *, first_s: float, cap_s: float = math.inf) -> None:
    """Before retry ``attempt + 1`` of ``operation``: count it and wait ``first_s * 2**attempt``
    seconds, at most ``cap_s`` (the one exponential backoff of the fence, table creation and probe)."""
    count(operation)
    time.sleep(min(cap_s, first_s * 2**attempt))


def send_until_landed(
    send: Callable[[], T],
    *,
    landed: Callable[[BaseException], bool],
    operation: str,
    sends: int,
    failures: tuple[type[BaseException], ...] = (OSError,),
    resend: Callable[[BaseException], bool] = lambda _err: True,
    settle: Callable[[BaseException], bool] = lambda _err: False,
    first_s: float = 0.5,
    what: str = "the write",
) -> T | None:
    """The one "send, re-read, landed?, resend" loop of a store write.

    1. ``send()`` makes the write; its result is returned when it answers.
    2. When it raises one of ``failures``, ``landed(err)`` reads the store again and says whether
       the write is there all the same (True: done, None is returned: its answer was lost; the
       callback says so in the log); it may raise instead (the store holds another writer's write:
       a conflict, not a retry).
    3. Not landed: the write is sent again, while ``resend(err)`` and at most ``sends`` sends in all;
       else the last failure is raised (the caller says what it means).

    Each retry waits ``first_s * 2**n`` seconds and counts as an ``operation`` retry
    (:func:`back_off`): before the resend, or, where ``settle(err)``, before the store is read again
    (a create still in flight may land meanwhile; such a failure then counts, landed or not).
    """
    attempt = 0
    while True:
        try:
            return send()
        except failures as err:
            failure = err
        settled = settle(failure)
        if settled:
            back_off(operation, attempt, first_s=first_s)
        if landed(failure):
            return None
        attempt += 1
        if attempt >= sends or not resend(failure):
            raise failure
        log.warning("%s failed (%s), not landed: sending it again", what, failure)
        if not settled:
            back_off(operation, attempt - 1, first_s=first_s)
