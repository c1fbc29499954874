"""The fence: one first-writer-wins commit, checked by Delta's own app transactions.

Every "only one run may do this" rule of splitkeeper is this one function:

- the sink's epoch commit (app id = pipeline, version = epoch): it lands only if
  the pipeline's recorded epoch is exactly the one this run restored or last
  committed;
- the write-ahead plan of an epoch (``epoch_plans``: planned epochs strictly increase);
- the ``checkpoints`` row (version = checkpoint id; idempotent for the same decision);
- the pipeline lease (version = the lease's generation).

:func:`fenced_commit` ``(table, app_id, version, expected, write)``:

1. reads ``transaction_version(app_id)`` of ``table`` as it is loaded (the caller
   refreshes it first, or passes the snapshot it decided on);
2. when that already is ``version``: the commit happened before. With an ``attempt``
   it is a replay only if the recorded commit names the same attempt (its custom
   metadata ``attempt_id``); then nothing is written and the result says
   ``replayed``. Another attempt's commit of the version is a conflict;
3. when it is not ``expected``: :class:`~splitkeeper.errors.ConcurrentRunError`
   naming the pipeline, the table, the version, what was found and what was
   expected; nothing is written;
4. otherwise ``write(table, properties)`` commits *on that snapshot* with
   ``Transaction(app_id, version)`` in ``properties``: delta-rs's conflict check
   fails the commit when any commit after the snapshot recorded the same app id
   (``CommitFailedError``), so of two writers that both passed step 3 exactly one
   lands. The loser re-reads: the winner's commit of the same attempt is a replay
   (two redos of one decision), anything else a ConcurrentRunError. A loser may
   leave an uncommitted parquet file in the table folder; it is never in the log,
   so no reader sees it.
5. when the write raises an error of the store (``OSError``: a 503, a reset connection, a
   timeout; not a refusal of the operating system, which
   :func:`~splitkeeper.delta.tables.guarded` names), whether the commit landed may be unknown:
   a reset can cut the answer to a put that landed, and delta-rs does not retry a conditional
   put. The table is re-read (up to :data:`LOST_ANSWER_READS` times, with backoff). If it
   records ``version`` with this commit's ``attempt_id``, the commit landed: the result is that
   commit, as if the answer had arrived. If it records the version ``expected``, nothing landed
   yet: a :class:`~splitkeeper.errors.StateError` ``[STATE_ERROR]`` names the store's error and
   says that the next run's open finds out (a put still in flight may land later; the next open
   redoes or discards it from the decision record, protocol rule 5.4). Anything else is a
   conflict (step 4). Each re-read counts as a retry (:mod:`splitkeeper.delta.retries`,
   ``fence_reread``).
6. ``sends`` > 1, for a ``write`` that only commits (a row append: the plan, the checkpoint row):
   a commit step 5 found not landed is sent again, on the table as read again, with the same
   ``Transaction(app_id, version)`` and attempt, up to ``sends`` times in all (each a
   ``fence_resend`` retry, after a backoff), before the StateError. That is safe whatever became
   of the earlier put: if it still lands, the two meet in delta-rs's conflict check and step 4
   finds its own attempt's commit (a replay). The sink's write moves the epoch's files first,
   which must happen once, so its commit is sent once and the next run settles it (rule 5.4).

The commit's custom metadata carries ``app_id``, ``version_key: version`` and
``attempt_id`` (when given) plus the caller's keys; :func:`recorded_commit` finds
it again in the table's history. Called on the driver; one call per commit; safe
to call from several processes at once (that is its purpose).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from splitkeeper.delta import retries
from splitkeeper.errors import ConcurrentRunError, StateError

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties

__all__ = ["COMMIT_SENDS", "FenceResult", "fenced_commit", "recorded_commit"]

log = logging.getLogger(__name__)

#: How many of the newest commits :func:`recorded_commit` reads before it reads the whole history.
RECENT_HISTORY = 64
#: Step 5: how many times a commit whose answer was lost re-reads the table (waits 0.5, 1, 2 s).
LOST_ANSWER_READS = 4
#: Step 6: how many times the callers whose write only commits send a commit that did not land.
COMMIT_SENDS = 3

WriteFn = Callable[["DeltaTable", "CommitProperties"], None]


@dataclass(frozen=True, slots=True)
class FenceResult:
    """What :func:`fenced_commit` did: committed ``version`` (at Delta ``table_version``) or replayed it."""

    app_id: str
    version: int
    replayed: bool
    table_version: int | None
    metadata: dict[str, Any] = field(default_factory=dict)


def _metadata_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A history entry's custom metadata: top-level keys (delta-rs) or ``userMetadata`` JSON (Spark)."""
    import json

    found = dict(entry)
    text = entry.get("userMetadata")
    if isinstance(text, str):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            found = {**parsed, **found}
    return found


def recorded_commit(
    table: DeltaTable, app_id: str, version: int, version_key: str = "txn_version"
) -> dict[str, Any] | None:
    """The newest commit whose metadata names ``app_id`` and ``version_key == version``, or None.

    Searches the newest :data:`RECENT_HISTORY` commits, then the whole history still in
    the log (log cleanup may have removed older commits: then None). The result has the
    commit's metadata keys plus ``version`` (the Delta table version).
    """
    from splitkeeper.delta.tables import guarded

    def search(limit: int | None) -> tuple[dict[str, Any] | None, int]:
        entries = guarded(table.table_uri, lambda: table.history(limit))
        for entry in entries:
            meta = _metadata_of(entry)
            try:
                matches = meta.get("app_id") == app_id and int(meta.get(version_key, -1)) == int(version)
            except (TypeError, ValueError):
                matches = False
            if matches:
                return meta, len(entries)
        return None, len(entries)

    found, seen = search(RECENT_HISTORY)
    if found is None and seen >= RECENT_HISTORY:
        found, _seen = search(None)
    return found


def _conflict(
    *, pipeline: str, table_name: str, what: str, version: int, found: int | None, expected: int | None
) -> ConcurrentRunError:
    return ConcurrentRunError(
        f"pipeline {pipeline!r}: cannot commit {what} {version} to table {table_name}: it records "
        f"{what} {found} but this run expected {expected}; another run committed meanwhile; only one run "
        "may drive a pipeline: this run stops, and the state is intact",
        pipeline=pipeline,
        table=table_name,
        epoch_id=version,
        found=found,
        expected=expected,
    )


def fenced_commit(
    table: DeltaTable,
    *,
    pipeline: str,
    table_name: str,
    app_id: str,
    version: int,
    expected: int | None,
    write: WriteFn,
    metadata: Mapping[str, Any] | None = None,
    version_key: str = "txn_version",
    attempt: str | None = None,
    what: str = "version",
    sends: int = 1,
) -> FenceResult:
    """Commit ``version`` of ``app_id`` with ``write`` if and only if the recorded version is ``expected``.

    See the module doc for the steps (``sends``: step 6). ``what`` names the version in messages
    ("epoch", "checkpoint", ...). ``write`` must make exactly one commit on the table
    object it gets, with the commit properties it gets.
    """
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    def replay_of(current: int | None) -> dict[str, Any] | None:
        """The recorded commit when ``current`` is ``version`` and it names ``attempt`` (a replay)."""
        if current != version:
            return None
        recorded = recorded_commit(table, app_id, version, version_key) or {}
        if attempt is not None and recorded.get("attempt_id") != attempt:
            return None
        return recorded

    def conflict(found: int | None) -> ConcurrentRunError:
        return _conflict(
            pipeline=pipeline,
            table_name=table_name,
            what=what,
            version=version,
            found=found,
            expected=expected,
        )

    current = table.transaction_version(app_id)
    if current == version:
        recorded = replay_of(current)
        if recorded is None:
            raise conflict(current)
        return FenceResult(app_id, version, True, recorded.get("version"), recorded)
    if current != expected:
        raise conflict(current)
    custom = {**(metadata or {}), "app_id": app_id, version_key: version}
    if attempt is not None:
        custom["attempt_id"] = attempt
    properties = CommitProperties(app_transactions=[Transaction(app_id, version)], custom_metadata=custom)
    from splitkeeper.delta.tables import guarded

    found: list[FenceResult] = []

    def lost(err: BaseException) -> bool:
        """Step 5: the store failed (guarded() named OS refusals); else step 4's loser."""
        return not isinstance(err, CommitFailedError)

    def landed(err: BaseException) -> bool:
        """Steps 4 and 5: read the table again; this attempt's commit there is a landed one (a
        replay of another process of the same attempt, or a lost answer), anything newer a conflict."""
        if lost(err):
            retries.count("fence_reread")
        _reread(table, LOST_ANSWER_READS if lost(err) else 1)
        now = table.transaction_version(app_id)
        recorded = replay_of(now)
        if recorded is None:
            if now != current:
                raise conflict(now) from err
            return False
        if lost(err):
            log.warning(
                "the commit of %s %s to table %s raised (%s), but the table, read again, records it",
                what,
                version,
                table_name,
                err,
            )
        else:
            log.info(
                "%s %s of %s was committed by another process of the same attempt", what, version, app_id
            )
        found.append(FenceResult(app_id, version, not lost(err), recorded.get("version"), recorded))
        return True

    try:
        retries.send_until_landed(  # step 6: only a commit found not landed after a lost answer is resent
            lambda: guarded(table.table_uri, lambda: write(table, properties)),
            landed=landed,
            operation="fence_resend",
            sends=max(1, sends),
            failures=(CommitFailedError, OSError),
            resend=lost,
            what=f"the commit of {what} {version} to table {table_name}",
        )
    except (CommitFailedError, OSError) as err:
        reason = (
            f"failed in the store ({err}), and the table, read again, does not record it: nothing is "
            "committed by this run. Run again: the next run's open finds out whether a commit still in "
            "flight landed, and finishes or discards it from the decision record"
            if lost(err)
            else f"failed ({err}) although no other run recorded a newer one; nothing was committed. "
            "Retry; if it fails again, check who else writes to the table"
        )
        raise StateError(
            f"pipeline {pipeline!r}: the commit of {what} {version} to table {table_name} {reason}",
            pipeline=pipeline,
            table=table_name,
            epoch_id=version,
        ) from err
    if found:
        return found[0]
    from splitkeeper.delta.tables import refresh

    refresh(table)  # a transaction commit does not advance the table object itself
    return FenceResult(app_id, version, False, table.version(), custom)


def _reread(table: DeltaTable, attempts: int) -> None:
    """Refresh ``table``, trying up to ``attempts`` times while the store fails (waits 0.5, 1, 2 s);
    raises the last failure then."""
    from splitkeeper.delta.tables import refresh

    for attempt in range(attempts):
        try:
            refresh(table)
            return
        except OSError:
            if attempt + 1 == attempts:
                raise
            retries.back_off("fence_reread", attempt, first_s=0.5)
