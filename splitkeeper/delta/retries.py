"""splitkeeper's own retries of store calls, counted per operation, for the metrics.

The storage clients retry transient errors themselves (:mod:`splitkeeper.delta.storage` rule 4:
delta-rs, pyarrow), unseen here. On top of them, splitkeeper retries in a few places of its own;
each retry calls :func:`count` with its operation (:data:`OPERATIONS`):

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
  (:mod:`splitkeeper.delta.lease`).

:func:`counts` is what this process counted so far (a CLI run is one process);
:class:`~splitkeeper.app.metrics.PipelineMetrics` reports it as
``splitkeeper_store_retries_total{operation}``. Thread-safe (the heartbeat is a thread of its own).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

__all__ = ["OPERATIONS", "back_off", "count", "counts"]

OPERATIONS = (
    "fence_reread",
    "fence_resend",
    "table_create",
    "state_append",
    "state_delete",
    "store_probe",
    "lease_heartbeat",
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
