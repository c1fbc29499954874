"""The state store of one pipeline: :class:`DeltaStateStore`, the ``StateStore`` port on delta-rs.

The tables live under ``<root>/<table>`` (their columns: :mod:`~splitkeeper.delta.schemas`, see
``state/README.md``); delta-rs is their only writer, through its public API. The
checkpoint chain and retention rules are the core's
(:class:`~splitkeeper.core.checkpoint.CheckpointStore`): this class keeps an in-memory
mirror of the kept checkpoints' metadata (ids, kinds, refs; no split state) and asks
the core before it writes.

Contract, in the order the driver calls it for epoch N (protocol rule 5.3):

1. :meth:`write_plan` before any region reads: the ``epoch_plans`` rows of N in one
   commit fenced on the epoch (:mod:`~splitkeeper.delta.fence`, app id = pipeline):
   planned epochs strictly increase, and a run that planned N (or later) first wins.
2. :meth:`write_decision` before the sink commit: one ``decisions`` row, keyed by
   (epoch, attempt). It is the redo record: :meth:`decision` reads it back, so a
   driver that died after the sink commit is finished from Delta alone.
3. (the sink commit, :mod:`splitkeeper.delta.sink`)
4. :meth:`commit_checkpoint`: the ``enumerator_state`` and ``audit`` rows, tagged with a
   fresh *rows attempt* id (the ``enumerator_state`` rows are a full snapshot or a delta
   against one, rule 6), then (after ``before_row``) the ``checkpoints`` row LAST,
   naming that rows attempt, in one commit fenced on the checkpoint id whose metadata
   names the decision's attempt. Only the row makes N exist; rows of an attempt no row
   names are never read (:mod:`~splitkeeper.delta.history`) and compaction deletes
   them. The same decision again (a redo after the row landed) writes nothing; another
   run's row of N, or of a later id, is a ConcurrentRunError.
5. :meth:`retain` after the side effects (:mod:`~splitkeeper.delta.retention`).
6. *Incremental enumerator state.* A checkpoint's ``enumerator_state`` rows are a full
   snapshot (``checkpoints.enumerator_base`` NULL) or the entries that changed since the
   full snapshot of a kept checkpoint B, with tombstones for the ones gone
   (``enumerator_base`` = B; :func:`serde.enumerator_delta`). A full snapshot is written
   for the first checkpoint this store commits (after a restart, a restore in another
   process, a redo), when ``full_snapshot_every`` checkpoints have been committed since
   B (including B), when the parallelism differs from B's, when B is no longer kept
   under the attempt this store wrote, and when the rows cannot be a delta. Restore
   reads B's rows (the attempt B's row names) and the delta; retention keeps the base of
   every kept checkpoint. State written before this rule has every checkpoint full.

Restore (:meth:`load_checkpoint`, :meth:`latest_checkpoint`) reads one checkpoint's
partition of ``checkpoints`` and of ``enumerator_state`` through pyarrow, with file
pruning on the partition column: no Spark, and what it reads does not grow with
history.

On construction the store creates missing tables and claims the directory: the
``pipeline`` table is created with its one row in version 0 (the first creator wins).
A directory of another pipeline, or written for another source fingerprint, is
refused with the messages tests pin; ``source_fingerprint=None`` skips the fingerprint
check (status needs no source). ``read_only=True`` creates and writes nothing (every
write raises StateError) and reads a missing directory as empty.

One store per driver process and pipeline; methods may be called from several
threads of that process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from splitkeeper.core.checkpoint import CheckpointStore, check_full_snapshot_every
from splitkeeper.core.defaults import FULL_SNAPSHOT_EVERY
from splitkeeper.core.failures import RegionFailure
from splitkeeper.core.ports import EpochDecision, EpochPlan, StateStore
from splitkeeper.core.restarts import RestartCheck
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RegionOutcome,
)
from splitkeeper.delta import serde, storage
from splitkeeper.delta.fence import COMMIT_SENDS, fenced_commit, recorded_commit
from splitkeeper.delta.history import StateHistory, merge_delta, snapshot_rows
from splitkeeper.delta.schemas import STATE_TABLES, spec
from splitkeeper.delta.tables import StateTables, guarded, load_deltalake, sql_string
from splitkeeper.errors import (
    CheckpointError,
    ConcurrentRunError,
    DamagedTableError,
    InvalidParameterError,
    SplitkeeperError,
    StateError,
)

__all__ = ["DeltaStateStore", "KeptCheckpoint", "StateCommit", "decision_for"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StateCommit:
    """What the last :meth:`DeltaStateStore.commit_checkpoint` wrote.

    ``commit_ms`` is recorded in the checkpoints row: the time from the start of the
    commit until the row was submitted (the enumerator_state and audit rows).
    ``total_ms`` includes the row itself. ``replayed``: the row was there already.
    """

    checkpoint_id: int
    attempt_id: str  # the rows attempt the checkpoints row names
    commit_ms: int
    total_ms: int
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class _Base:
    """The full snapshot this store wrote last: what its next deltas are against (rule 6)."""

    checkpoint_id: int
    attempt_id: str  # the rows attempt its checkpoints row names
    parallelism: int  # its enumerator snapshot's
    snapshot: EnumeratorSnapshot  # what its enumerator_state rows hold
    since: int = 1  # checkpoints committed since it, itself included
    # its live rows by split id, made by the first delta against it and kept by the next ones
    # (serde.enumerator_delta's ``base_rows``): each delta then builds the rows of its own snapshot only
    rows: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class KeptCheckpoint:
    """A kept checkpoint as the mirror knows it: metadata only (no split state)."""

    light: CompletedCheckpoint
    attempt_id: str
    configured_parallelism: int | None
    enumerator_base: int | None = None  # the full snapshot its enumerator_state rows are a delta against


def decision_for(
    completed: CompletedCheckpoint,
    audit: Sequence[AuditRecord] = (),
    *,
    configured_parallelism: int | None = None,
    attempt_id: str | None = None,
    reason: str = "",
    split_weights: Mapping[str, float] | None = None,
) -> EpochDecision:
    """A decision record for ``completed`` (a fresh attempt unless given): what tests and
    benchmarks commit with :meth:`DeltaStateStore.commit_checkpoint` without a driver."""
    return EpochDecision(
        checkpoint=completed,
        attempt_id=attempt_id or uuid.uuid4().hex,
        audit=tuple(audit),
        acknowledged=tuple(sorted(completed.regions)),
        configured_parallelism=configured_parallelism,
        reason=reason,
        split_weights=tuple(sorted((split_weights or {}).items())),
    )


def _light(completed: CompletedCheckpoint) -> CompletedCheckpoint:
    """The checkpoint without split state: what the core chain and retention rules look at."""
    return replace(
        completed,
        regions={r: replace(s, splits=(), operator_state=()) for r, s in completed.regions.items()},
        enumerator=None,
    )


def _kept_entry(row: Mapping[str, Any]) -> KeptCheckpoint:
    """A ``checkpoints`` row as the mirror keeps it (read back, or the row this store just wrote)."""
    regions = [{**region, "splits": [], "operator_state": []} for region in row["regions"] or ()]
    light = serde.checkpoint_from_rows(
        {
            "checkpoint_id": row["checkpoint_id"],
            "kind": row["kind"],
            "parallelism": row["parallelism"],
            "consecutive_regional": 0,
            "processing_backlog": False,
            "regions": regions,
            "enumerator": None,
        }
    )
    configured = row.get("configured_parallelism")
    base = row.get("enumerator_base")
    return KeptCheckpoint(
        light,
        row["attempt_id"],
        None if configured is None else int(configured),
        None if base is None else int(base),
    )


def _chains(ordered: Sequence[KeptCheckpoint]) -> CheckpointStore:
    chains = CheckpointStore()
    for entry in ordered:
        chains._put(entry.light)  # stored facts as they are: the core's rules were applied at commit
    return chains


def _rows_and_finished(data: pa.Table) -> tuple[list[dict[str, Any]], tuple[list[str], list[str | None]]]:
    """``enumerator_state`` rows as the decoder takes them: the rows of status ``finished`` (most of a
    large state, a file source's every file read) as their ``split_id`` and ``identity`` columns,
    the others as mappings (a mapping per finished row made the restore at 1,000,000 files slow)."""
    done = pc.fill_null(pc.equal(data.column("status"), "finished"), False)
    finished = data.filter(done)
    return data.filter(pc.invert(done)).to_pylist(), (
        finished.column("split_id").to_pylist(),
        finished.column("identity").to_pylist(),
    )


def _check_id(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameterError(name, value, "an integer >= 0")


class DeltaStateStore(StateStore, CheckpointStore):
    """The persistent state of one pipeline under ``root`` (see the module doc for the contract).

    ``run_id`` (default: a fresh uuid) tags the rows this process writes.
    ``compact_every``: :meth:`retain` compacts the tables after that many committed
    checkpoints. ``full_snapshot_every``: at most that many checkpoints share one full
    enumerator snapshot (rule 6; 1 writes a full snapshot every time).
    ``accept_source_change`` adopts state written for another source fingerprint.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        pipeline_name: str,
        source_fingerprint: str | None,
        *,
        run_id: str | None = None,
        compact_every: int = 50,
        full_snapshot_every: int = FULL_SNAPSHOT_EVERY,
        accept_source_change: bool = False,
        read_only: bool = False,
    ) -> None:
        CheckpointStore.__init__(self)
        if not isinstance(pipeline_name, str) or not pipeline_name.strip():
            raise InvalidParameterError("pipeline_name", pipeline_name, "a non-empty name")
        if source_fingerprint is not None and (
            not isinstance(source_fingerprint, str) or not source_fingerprint
        ):
            raise InvalidParameterError(
                "source_fingerprint", source_fingerprint, "a non-empty string, or None to skip the check"
            )
        if isinstance(compact_every, bool) or not isinstance(compact_every, int) or compact_every < 1:
            raise InvalidParameterError("compact_every", compact_every, "an integer >= 1")
        check_full_snapshot_every(full_snapshot_every)
        self.tables = StateTables(root, read_only=read_only)
        self.root = self.tables.root
        self.pipeline_name = pipeline_name
        self.source_fingerprint = source_fingerprint
        self.read_only = read_only
        self.run_id = run_id or uuid.uuid4().hex
        self.compact_every = compact_every
        self.full_snapshot_every = full_snapshot_every
        self._base: _Base | None = None
        # the enumerator rows write_decision computed: (epoch, attempt, base, delta, rows)
        self._decided: (
            tuple[int, str, _Base | None, list[dict[str, Any]] | None, list[dict[str, Any]]] | None
        ) = None
        self.history = StateHistory(self.tables, pipeline_name)
        self.last_commit: StateCommit | None = None
        self._lock = threading.RLock()
        # (checkpoints version, kept, the core's store of them): the one mirror of the checkpoints table
        self._mirror: tuple[int, tuple[KeptCheckpoint, ...], CheckpointStore] | None = None
        self._commits_since_compaction = 0
        if not read_only:
            load_deltalake()  # before the threads: see its doc
            with ThreadPoolExecutor(max_workers=3, thread_name_prefix="splitkeeper-state") as pool:
                for future in [
                    pool.submit(self.tables.ensure, name) for name in STATE_TABLES if name != "pipeline"
                ]:
                    future.result()
        self._claim_pipeline(accept_source_change)

    # -- tables ---------------------------------------------------------------------------

    def table_path(self, table: str) -> str:
        """Where ``table`` lives, as Spark reads it (``s3a://`` for an S3 root)."""
        return storage.spark_uri(self.tables.uri(table))

    def table_version(self, table: str) -> int:
        """The latest Delta version of ``table`` (-1 when it does not exist)."""
        return self.tables.version(table)

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise StateError(
                f"the state of pipeline {self.pipeline_name!r} at {self.root} is opened read-only (a dry "
                f"run or status): refusing to {what}",
                pipeline=self.pipeline_name,
                root=self.root,
            )

    # -- the pipeline claim -----------------------------------------------------------------

    def _claim_pipeline(self, accept_source_change: bool) -> None:
        """Claim the directory (create-if-absent of the pipeline table with its row) or check its owner."""
        claim = {
            "name": self.pipeline_name,
            "source_fingerprint": self.source_fingerprint or "",
            "state_format": serde.STATE_FORMAT,
            "created_at": datetime.now(UTC),
        }
        if self.read_only:
            rows = self.tables.read("pipeline").to_pylist()
            if not rows:
                return  # nothing written yet: reads as empty
        else:
            if self.source_fingerprint is None:
                found = self.tables.get("pipeline")
                if found is None:
                    raise InvalidParameterError(
                        "source_fingerprint", None, "the source's fingerprint when the store creates state"
                    )
            data = spec("pipeline").rows([claim])
            table, created = self.tables.ensure("pipeline", data=data)
            if created:
                return
            rows = self.tables.read("pipeline", table=table).to_pylist()
            if not rows:
                rows = self._claim_empty(table, data)
        if len(rows) != 1:
            raise StateError(
                f"state directory {self.root} has {len(rows)} rows in its pipeline table (one expected): "
                "the state is corrupt; restore it from a backup or use a fresh directory",
                root=self.root,
            )
        owner = rows[0]
        if owner["name"] != self.pipeline_name:
            raise StateError(
                f"state directory {self.root} belongs to pipeline {owner['name']!r}, not to pipeline "
                f"{self.pipeline_name!r}: give pipeline {self.pipeline_name!r} its own state.path, or run "
                f"pipeline {owner['name']!r} against this directory",
                root=self.root,
                owner=owner["name"],
                pipeline=self.pipeline_name,
            )
        if owner["state_format"] != serde.STATE_FORMAT:
            raise StateError(
                f"state directory {self.root} has state format {owner['state_format']}, this splitkeeper "
                f"writes format {serde.STATE_FORMAT}: use a fresh state directory",
                root=self.root,
            )
        if self.source_fingerprint is None or owner["source_fingerprint"] == self.source_fingerprint:
            return
        if not accept_source_change:
            raise StateError(
                f"state directory {self.root} of pipeline {self.pipeline_name!r} was written for source "
                f"fingerprint {owner['source_fingerprint']!r}, but the configured source has fingerprint "
                f"{self.source_fingerprint!r}: the source changed (kind, location or split layout). Use a "
                "fresh state directory, or accept the change explicitly (accept_source_change=True)",
                root=self.root,
                stored=owner["source_fingerprint"],
                configured=self.source_fingerprint,
            )
        self._writable("adopt the state for a changed source")
        log.warning(
            "pipeline %s: adopting state written for source %s for source %s",
            self.pipeline_name,
            owner["source_fingerprint"],
            self.source_fingerprint,
        )
        table = self.tables.require("pipeline")
        adopted: dict[str, Any] = {"source_fingerprint": self.source_fingerprint}
        guarded(table.table_uri, lambda: table.update(new_values=adopted))

    def _claim_empty(self, table: Any, data: pa.Table) -> list[dict[str, Any]]:
        """An existing, empty pipeline table (created by an older splitkeeper that died before its claim):
        claim it with one fenced append (the first claim wins), then read it."""
        from deltalake import write_deltalake

        with contextlib.suppress(ConcurrentRunError):  # another store claimed it: read theirs
            fenced_commit(
                table,
                pipeline=self.pipeline_name,
                table_name="pipeline",
                app_id="splitkeeper-claim",
                version=0,
                expected=None,
                write=lambda t, p: write_deltalake(t, data, mode="append", commit_properties=p),
                attempt=self.run_id,
                what="claim",
            )
        return self.tables.read("pipeline").to_pylist()

    # -- the kept checkpoints' metadata (the mirror) -----------------------------------------

    def kept(self) -> tuple[int, tuple[KeptCheckpoint, ...]]:
        """(checkpoints table version, the kept checkpoints ascending), cached per table version."""
        table = self.tables.get("checkpoints")
        if table is None:
            return -1, ()
        version = table.version()
        with self._lock:
            if self._mirror is not None and self._mirror[0] == version:
                return self._mirror[:2]
        data = self.tables.read(
            "checkpoints",
            table=table,
            columns=[
                "checkpoint_id",
                "kind",
                "parallelism",
                "regions",
                "attempt_id",
                "configured_parallelism",
                "enumerator_base",
            ],
        )
        ordered = tuple(
            sorted((_kept_entry(row) for row in data.to_pylist()), key=lambda k: k.light.checkpoint_id)
        )
        chains = _chains(ordered)
        with self._lock:
            self._mirror = (version, ordered, chains)
        return version, ordered

    def mirror(self) -> CheckpointStore:
        """The kept checkpoints as the core's in-memory :class:`CheckpointStore` (light: ids, kinds,
        refs, no split state), cached per version of the checkpoints table like :meth:`kept`: the one
        mirror the chain rules, the commit's checks and retention ask. Never add to it."""
        version, _kept = self.kept()
        with self._lock:
            if self._mirror is not None and self._mirror[0] == version:
                return self._mirror[2]
        chains = CheckpointStore()  # the table changed between the two reads: not cached
        for entry in self.kept()[1]:
            chains._put(entry.light)
        return chains

    # -- reads (StateStore and CheckpointStore) -------------------------------------------------

    def ids(self) -> list[int]:
        """Completed checkpoint ids, ascending (CheckpointStore contract)."""
        return [k.light.checkpoint_id for k in self.kept()[1]]

    def checkpoint_ids(self) -> list[int]:
        return self.ids()

    def ref_chain(self, checkpoint_id: int) -> list[int]:
        return self.mirror().ref_chain(checkpoint_id)

    def chain_depth(self, checkpoint_id: int) -> int:
        return self.mirror().chain_depth(checkpoint_id)

    def configured_parallelism(self, checkpoint_id: int) -> int | None:
        """The config's parallelism checkpoint ``checkpoint_id`` was taken under (None: not recorded,
        or not a kept checkpoint)."""
        for entry in self.kept()[1]:
            if entry.light.checkpoint_id == int(checkpoint_id):
                return entry.configured_parallelism
        return None

    def _read_checkpoint(
        self, checkpoint_id: int, attempt_id: str | None, as_of: datetime | str | None = None
    ) -> CompletedCheckpoint | None:
        """One checkpoint from its partitions (``attempt_id`` None: whichever row the partition holds)."""
        cp_table: Any = None
        enum_table: Any = None
        if as_of is not None:
            cp_table = self._as_of("checkpoints", as_of)
            enum_table = self._as_of("enumerator_state", as_of)
        part = [("checkpoint_id", "=", int(checkpoint_id))]
        rows = self.tables.read("checkpoints", partitions=part, table=cp_table).to_pylist()
        if attempt_id is not None:
            rows = [r for r in rows if r["attempt_id"] == attempt_id]
        if not rows:
            return None
        row = rows[0]
        enumerator_rows: list[dict[str, Any]] = []
        finished: tuple[list[str], list[str | None]] = ([], [])
        if row.get("enumerator") is not None:  # rule 6: the one reader of a checkpoint's snapshot rows
            stored = snapshot_rows(
                self.tables,
                self.pipeline_name,
                {int(checkpoint_id): row},
                [int(checkpoint_id)],
                checkpoints=cp_table,
                enumerator_state=enum_table,
            )
            enumerator_rows, finished = _rows_and_finished(stored[int(checkpoint_id)])
        return serde.checkpoint_from_rows(row, enumerator_rows, finished=finished)

    def _as_of(self, table: str, as_of: datetime | str) -> Any:
        from splitkeeper.delta.tables import open_table

        found = open_table(self.tables.uri(table))
        assert found is not None
        moment = as_of if not isinstance(as_of, datetime) or as_of.tzinfo else as_of.replace(tzinfo=UTC)
        guarded(found.table_uri, lambda: found.load_as_version(moment))
        return found

    def _load(self, checkpoint_id: int) -> CompletedCheckpoint | None:
        for entry in self.kept()[1]:
            if entry.light.checkpoint_id == int(checkpoint_id):
                return self._read_checkpoint(checkpoint_id, entry.attempt_id)
        return None

    def load_checkpoint(
        self, checkpoint_id: int, *, as_of: datetime | str | None = None
    ) -> CompletedCheckpoint:
        """The checkpoint ``checkpoint_id`` exactly as committed.

        ``as_of`` reads the tables as they were at that time (Delta time travel), which
        also finds checkpoints retention has deleted since, as long as the files were
        not vacuumed. CheckpointError names the id and the available ids if there is none.
        """
        try:
            found = (
                self._load(checkpoint_id)
                if as_of is None
                else self._read_checkpoint(checkpoint_id, None, as_of)
            )
        except DamagedTableError as err:
            if as_of is None:
                raise
            raise CheckpointError(  # time travel ends where VACUUM removed the files
                f"cannot read the state of pipeline {self.pipeline_name!r} as of {as_of}: {err.message}",
                checkpoint_id=checkpoint_id,
                as_of=str(as_of),
            ) from err
        except StateError:
            raise
        except Exception as err:
            if as_of is None:
                raise
            raise CheckpointError(
                f"cannot read the state of pipeline {self.pipeline_name!r} as of {as_of}: {err}",
                checkpoint_id=checkpoint_id,
                as_of=str(as_of),
            ) from err
        if found is None:
            at = "" if as_of is None else f" as of {as_of}"
            available = self.ids()
            raise CheckpointError(
                f"checkpoint {checkpoint_id} of pipeline {self.pipeline_name!r} is not in the state store "
                f"at {self.root}{at} (available: {available})",
                checkpoint_id=checkpoint_id,
                available=available,
            )
        return found

    def latest_checkpoint(self) -> CompletedCheckpoint | None:
        """The newest completed checkpoint (what a restart restores), or None when there is none."""
        kept = self.kept()[1]
        if not kept:
            return None
        latest = kept[-1]
        found = self._read_checkpoint(latest.light.checkpoint_id, latest.attempt_id)
        if found is None:  # deleted since the mirror was read: read again
            with self._lock:
                self._mirror = None
            return self.latest_checkpoint()
        return found

    def latest(self) -> CompletedCheckpoint | None:
        """CheckpointStore contract: :meth:`latest_checkpoint`."""
        return self.latest_checkpoint()

    def latest_global(self) -> CompletedCheckpoint | None:
        for entry in reversed(self.kept()[1]):
            if entry.light.kind is CheckpointKind.GLOBAL:
                return self._read_checkpoint(entry.light.checkpoint_id, entry.attempt_id)
        return None

    def latest_plan_epoch(self) -> int | None:
        """The highest epoch ever planned, or None (the plans' fence version; older, untagged plans
        are found by their partitions)."""
        table = self.tables.get("epoch_plans")
        if table is None:
            return None
        recorded = table.transaction_version(self.pipeline_name)
        partitions = [int(p["epoch_id"]) for p in table.partitions()]
        return max([v for v in (recorded, *partitions) if v is not None], default=None)

    def read_plan(self, epoch_id: int) -> serde.EpochPlan:
        """The plan of ``epoch_id`` exactly as written; StateError naming the latest planned epoch if none."""
        rows = self.tables.read("epoch_plans", partitions=[("epoch_id", "=", int(epoch_id))]).to_pylist()
        if not rows:
            raise StateError(
                f"pipeline {self.pipeline_name!r} has no plan for epoch {epoch_id} "
                f"(latest planned epoch: {self.latest_plan_epoch()})",
                pipeline=self.pipeline_name,
                epoch_id=epoch_id,
            )
        return serde.plan_from_rows(int(epoch_id), rows)

    def split_weights(self, checkpoint_id: int) -> Mapping[str, float]:
        """The owned splits' weights checkpoint ``checkpoint_id`` recorded (see the history API)."""
        return self.history.split_weights(checkpoint_id)

    def decision(self, epoch: int, attempt_id: str) -> EpochDecision | None:
        """The decision record of ``epoch`` with ``attempt_id``; None when it was never written."""
        rows = self.tables.read(
            "decisions",
            partitions=[("epoch_id", "=", int(epoch))],
            filter=pc.field("attempt_id") == attempt_id,
        ).to_pylist()
        return self.decision_from_row(rows[0]) if rows else None

    def decision_from_row(self, row: Mapping[str, Any]) -> EpochDecision:
        """The decision of a ``decisions`` row; entries that are a delta are applied to the rows of
        their base checkpoint (rule 6, read as a restore reads them)."""
        base_id = row.get("enumerator_base")
        if base_id is None:
            return serde.decision_from_row(row)
        part = [("checkpoint_id", "=", int(base_id))]
        heads = {
            int(r["checkpoint_id"]): r for r in self.tables.read("checkpoints", partitions=part).to_pylist()
        }
        if int(base_id) not in heads:
            raise StateError(
                f"decision of epoch {row['epoch_id']} (attempt {row['attempt_id']}) of pipeline "
                f"{self.pipeline_name!r}: its enumerator entries are a delta against checkpoint {base_id}, "
                f"which is not in {self.tables.uri('checkpoints')}; restore the state directory from a "
                "backup",
                checkpoint_id=int(base_id),
                table="decisions",
            )
        base = snapshot_rows(self.tables, self.pipeline_name, heads, [int(base_id)])[int(base_id)]
        entries = spec("enumerator_state").rows(
            [
                {**e, "checkpoint_id": int(row["epoch_id"]), "attempt_id": ""}
                for e in row["enumerator_entries"]
            ]
        )
        return serde.decision_from_row(row, _rows_and_finished(merge_delta(base, entries)))

    def __contains__(self, checkpoint_id: object) -> bool:
        return isinstance(checkpoint_id, int) and checkpoint_id in self.ids()

    # -- writes ----------------------------------------------------------------------------------

    def write_plan(
        self,
        epoch: int,
        plan: EpochPlan | serde.EpochPlan | Mapping[int, Iterable[Any]],
        run_id: str | None = None,
    ) -> None:
        """Persist the plan of ``epoch`` before any region reads it (contract step 1).

        ``plan`` maps every region to its ranges (:func:`serde.coerce_plan`); regions with
        nothing to read map to ``()``. If ``epoch`` or a later epoch is planned already,
        nothing is written and ConcurrentRunError names the pipeline, the epoch and the
        run that planned it; a replay must :meth:`read_plan` instead.
        """
        self._writable(f"plan epoch {epoch}")
        _check_id("epoch", epoch)
        stored = serde.coerce_plan(epoch, plan, run_id or self.run_id)
        if not stored.regions:
            raise InvalidParameterError(
                "plan", {}, "at least one region (regions with nothing to read map to ())"
            )
        table = self.tables.require("epoch_plans")
        recorded = table.transaction_version(self.pipeline_name)
        latest = self.latest_plan_epoch()
        if latest is not None and latest >= epoch:
            raise self._plan_conflict(epoch, latest)
        planned_at = datetime.now(UTC)
        data = spec("epoch_plans").rows(
            [{**row, "run_id": stored.run_id, "planned_at": planned_at} for row in serde.plan_to_rows(stored)]
        )
        from deltalake import write_deltalake

        try:
            fenced_commit(
                table,
                pipeline=self.pipeline_name,
                table_name="epoch_plans",
                app_id=self.pipeline_name,
                version=epoch,
                expected=recorded,
                write=lambda t, p: write_deltalake(t, data, mode="append", commit_properties=p),
                metadata={"run_id": stored.run_id},
                version_key="plan_epoch",
                attempt=uuid.uuid4().hex,
                what="epoch",
                sends=COMMIT_SENDS,  # the write only commits its rows (fence step 6)
            )
        except ConcurrentRunError as err:
            raise self._plan_conflict(epoch, self.latest_plan_epoch()) from err

    def _plan_conflict(self, epoch: int, latest: int | None) -> ConcurrentRunError:
        by = self._planned_by(latest) if latest is not None else "unknown"
        if latest == epoch:
            what = f"epoch {epoch} is already planned (by run {by})"
        elif latest is not None and latest > epoch:
            what = f"epoch {epoch} is older than the latest planned epoch {latest} (run {by})"
        else:
            what = f"another run planned epoch {epoch} at the same time"
        return ConcurrentRunError(
            f"pipeline {self.pipeline_name!r}: {what}; another run is driving this pipeline, or this run "
            f"must replay epoch {epoch} with read_plan({epoch}) instead of planning it again",
            pipeline=self.pipeline_name,
            epoch_id=epoch,
            planned_by=by,
            latest_planned=latest,
        )

    def _planned_by(self, epoch: int) -> str:
        rows = self.tables.read(
            "epoch_plans", partitions=[("epoch_id", "=", int(epoch))], columns=["run_id"]
        ).to_pylist()
        return str(rows[0]["run_id"]) if rows else "unknown"

    def write_decision(self, decision: EpochDecision) -> None:
        """Persist the epoch's decision before its sink commit (contract step 2). Its enumerator
        entries are the rows its checkpoint commit will write (rule 6: a delta against the kept full
        snapshot, or a full snapshot), computed once here and reused by :meth:`commit_checkpoint`."""
        self._writable(f"write the decision of epoch {decision.epoch}")
        base, delta, entries = self._entries(decision.checkpoint)
        base_id = None if base is None or delta is None else base.checkpoint_id
        row = {
            **serde.decision_to_row(decision, entries, base_id),
            "run_id": self.run_id,
            "decided_at": datetime.now(UTC),
        }
        self.tables.append("decisions", spec("decisions").rows([row]))
        with self._lock:
            self._decided = (decision.epoch, decision.attempt_id, base, delta, entries)

    def _entries(
        self, completed: CompletedCheckpoint, decision: EpochDecision | None = None
    ) -> tuple[_Base | None, list[dict[str, Any]] | None, list[dict[str, Any]]]:
        """(the base, the delta or None, the rows) of ``completed``'s ``enumerator_state`` rows
        (rule 6); those :meth:`write_decision` computed for ``decision`` when the base is the same."""
        snapshot = completed.enumerator
        base = None if snapshot is None else self._delta_base(completed)
        with self._lock:
            decided = self._decided
        if (
            decision is not None
            and decided is not None
            and decided[:2] == (decision.epoch, decision.attempt_id)
            and decided[2] is base
        ):
            return decided[2], decided[3], decided[4]
        delta = (
            None
            if base is None or snapshot is None
            else serde.enumerator_delta(base.snapshot, snapshot, base_rows=base.rows)
        )
        if delta is not None:
            return base, delta, delta
        return base, None, [] if snapshot is None else serde.enumerator_to_rows(snapshot)

    def discard_decision(self, epoch: int, attempt_id: str) -> None:
        """Delete the decision row ``(epoch, attempt_id)`` whose sink commit did not land."""
        self._writable(f"discard the refused decision of epoch {epoch}")
        predicate = f"epoch_id = {int(epoch)} AND attempt_id = {sql_string(attempt_id)}"
        self.tables.delete("decisions", predicate)

    def commit_checkpoint(
        self,
        decision: EpochDecision,
        before_row: Callable[[], None] | None = None,
        *,
        phases_ms: Mapping[str, int] | None = None,
        failures: Sequence[RegionFailure] = (),
    ) -> None:
        """Persist the decided checkpoint: enumerator_state and audit rows, the checkpoints row last.

        See contract step 4. The core's rules apply first (not ABORTED, refs kept:
        CheckpointError). ``before_row`` is called between the rows and the row (a crash
        point). The same decision again writes nothing once its row landed; a checkpoint
        id not newer than the latest committed one, or a row another run committed
        meanwhile, raises ConcurrentRunError naming the pipeline and the id. The figures
        of the commit are left in :attr:`last_commit`.
        """
        self._writable(f"commit checkpoint {decision.epoch}")
        started = time.perf_counter()
        completed = decision.checkpoint
        row = serde.checkpoint_to_row(completed)
        checkpoint_id = completed.checkpoint_id
        _check_id("checkpoint_id", checkpoint_id)
        table = self.tables.require("checkpoints")
        recorded = table.transaction_version(self.pipeline_name)
        if recorded == checkpoint_id:
            found = recorded_commit(table, self.pipeline_name, checkpoint_id, "checkpoint_id") or {}
            if found.get("attempt_id") == decision.attempt_id:
                self.last_commit = StateCommit(
                    checkpoint_id, str(found.get("rows_attempt_id", "")), 0, 0, True
                )
                return
        mirror = self.mirror()
        ids = mirror.ids()
        latest = max([i for i in (*ids, recorded) if i is not None], default=None)
        if latest is not None and checkpoint_id <= latest:
            raise self._checkpoint_conflict(checkpoint_id, latest)
        mirror.check_can_add(_light(completed))  # the core's rules: not aborted, refs kept
        rows_attempt = uuid.uuid4().hex
        key = {"checkpoint_id": checkpoint_id, "attempt_id": rows_attempt}
        snapshot = completed.enumerator
        base, delta, written = self._entries(completed, decision)
        with self._lock:
            self._decided = None  # used once (a full snapshot's rows are large)
        row["enumerator_base"] = None if delta is None or base is None else base.checkpoint_id
        audit_rows = [serde.audit_to_row(record, seq) for seq, record in enumerate(decision.audit)]
        batches = [
            ("enumerator_state", [{**r, **key} for r in written]),
            ("audit", [{**r, **key} for r in audit_rows]),
        ]
        writes = [(name, spec(name).rows(rows)) for name, rows in batches if rows]
        if len(writes) > 1:
            with ThreadPoolExecutor(max_workers=len(writes), thread_name_prefix="splitkeeper-state") as pool:
                for future in [pool.submit(self.tables.append, name, data) for name, data in writes]:
                    future.result()
        else:
            for name, data in writes:
                self.tables.append(name, data)
        if before_row is not None:
            before_row()
        commit_ms = round((time.perf_counter() - started) * 1000)
        row.update(
            key,
            run_id=self.run_id,
            created_at=datetime.now(UTC),
            commit_ms=commit_ms,
            enumerator_row_count=len(written) if snapshot is not None else None,
            configured_parallelism=decision.configured_parallelism,
            split_weights=serde.split_weights_to_rows(decision.split_weights),
            **serde.incident_columns(phases_ms, failures),
        )
        data = spec("checkpoints").rows([row])
        from deltalake import write_deltalake

        try:
            result = fenced_commit(
                table,  # the snapshot this commit decided on: a row committed since makes it fail
                pipeline=self.pipeline_name,
                table_name="checkpoints",
                app_id=self.pipeline_name,
                version=checkpoint_id,
                expected=recorded,
                write=lambda t, p: write_deltalake(t, data, mode="append", commit_properties=p),
                metadata={"rows_attempt_id": rows_attempt, "run_id": self.run_id},
                version_key="checkpoint_id",
                attempt=decision.attempt_id,
                what="checkpoint",
                sends=COMMIT_SENDS,  # the write only commits its rows (fence step 6)
            )
        except ConcurrentRunError as err:
            with self._lock:
                self._mirror = None
            current = self.tables.require("checkpoints").transaction_version(self.pipeline_name)
            raise self._checkpoint_conflict(checkpoint_id, current) from err
        attempt = str(result.metadata.get("rows_attempt_id", rows_attempt))
        with self._lock:
            self._mirror = self._mirror_after(
                table, None if result.replayed or attempt != rows_attempt else _kept_entry(row), ()
            )
            self._commits_since_compaction += 1
            if result.replayed or attempt != rows_attempt:
                self._base = None  # another attempt's rows count: start again from a full snapshot
            elif snapshot is not None and delta is None:
                self._base = _Base(checkpoint_id, rows_attempt, snapshot.parallelism, snapshot)
            elif base is not None and delta is not None:
                self._base = replace(base, since=base.since + 1)
        total_ms = round((time.perf_counter() - started) * 1000)
        self.last_commit = StateCommit(checkpoint_id, attempt, commit_ms, total_ms, result.replayed)

    def _delta_base(self, completed: CompletedCheckpoint) -> _Base | None:
        """The full snapshot ``completed``'s enumerator rows may be a delta against; None: write a
        full snapshot (rule 6)."""
        with self._lock:
            base = self._base
        if base is None or base.since >= self.full_snapshot_every:
            return None
        if completed.enumerator is None or base.checkpoint_id >= completed.checkpoint_id:
            return None
        if base.parallelism != completed.enumerator.parallelism:  # a rescale: start from a full snapshot
            return None
        kept = {k.light.checkpoint_id: k for k in self.kept()[1]}
        entry = kept.get(base.checkpoint_id)
        if entry is None or entry.attempt_id != base.attempt_id or entry.enumerator_base is not None:
            return None
        return base

    def _checkpoint_conflict(self, checkpoint_id: int, latest: int | None) -> ConcurrentRunError:
        if latest is not None and latest > checkpoint_id:
            what = f"checkpoint {checkpoint_id} is older than the latest committed checkpoint {latest}"
        elif latest is not None and latest == checkpoint_id:
            what = f"checkpoint {checkpoint_id} is already committed"
        else:
            what = f"another run committed checkpoint {checkpoint_id} at the same time"
        return ConcurrentRunError(
            f"pipeline {self.pipeline_name!r}: {what}; only one run may drive a pipeline, and checkpoint ids "
            "must increase (restart from latest_checkpoint())",
            pipeline=self.pipeline_name,
            epoch_id=checkpoint_id,
            latest=latest,
        )

    def add(self, completed: CompletedCheckpoint) -> None:
        """CheckpointStore contract: refuse what :meth:`check_can_add` refuses, else commit ``completed``
        without audit records (a fresh decision)."""
        self.check_can_add(completed)
        self.commit_checkpoint(decision_for(completed))

    def _put(self, completed: CompletedCheckpoint) -> None:
        self.commit_checkpoint(decision_for(completed))

    def _delete(self, checkpoint_id: int) -> None:
        from splitkeeper.delta.retention import delete_checkpoints

        delete_checkpoints(self, [checkpoint_id])

    def log_attempt(
        self,
        epoch: int,
        outcomes: Mapping[int, RegionOutcome],
        reason: str = "",
        *,
        kind: CheckpointKind = CheckpointKind.ABORTED,
        failures: Sequence[RegionFailure] = (),
    ) -> None:
        """Record an aborted checkpoint attempt for the timeline (never read by restore).

        May be called twice (the timeline then shows the attempt twice).
        """
        self._writable(f"log the attempt of epoch {epoch}")
        _check_id("checkpoint_id", epoch)
        if kind is not CheckpointKind.ABORTED:
            raise InvalidParameterError(
                "kind",
                getattr(kind, "value", kind),
                "aborted",
                hint="completed checkpoints go through commit_checkpoint",
            )
        row = {
            "checkpoint_id": epoch,
            "kind": kind.value,
            "regions": [
                {"region_id": int(r), "outcome": RegionOutcome(o).value} for r, o in sorted(outcomes.items())
            ],
            "reason": reason,
            "run_id": self.run_id,
            "logged_at": datetime.now(UTC),
            **serde.incident_columns(None, failures),
        }
        self.tables.append("checkpoint_log", spec("checkpoint_log").rows([row]))

    def record_restart_checks(self, checks: Sequence[RestartCheck]) -> None:
        """The in-run restart checks, appended to the validations table (history, as
        :mod:`splitkeeper.delta.validations` rule 3 says); a store error is logged, the run goes on."""
        from splitkeeper.delta.validations import ValidationRecords

        self._writable("record the in-run restart checks")
        try:
            ValidationRecords(self.tables, self.pipeline_name).record_restart_checks(checks)
        except (SplitkeeperError, OSError) as err:  # history only: the verdict is in the log and the error
            log.warning("pipeline %s: in-run restart checks not recorded: %s", self.pipeline_name, err)

    # -- retention (the rules are the core's; the work is retention.py's) -----------------------

    def retain(
        self,
        keep_latest: int,
        pinned: Collection[int] = (),
        mid_retention: Callable[[], None] | None = None,
    ) -> list[int]:
        """Delete the checkpoints the core retention rule lets go; return their ids, ascending.

        Archives them to ``checkpoint_log`` first (then ``mid_retention``, a crash point, is
        called); every ``compact_every`` committed checkpoints it also runs :meth:`compact`.
        Idempotent.
        """
        from splitkeeper.delta.retention import retain

        deleted = retain(self, keep_latest, pinned, mid_retention=mid_retention)
        with self._lock:
            due = self._commits_since_compaction >= self.compact_every
            if due:
                self._commits_since_compaction = 0
        if due:
            self.compact()
        return deleted

    def compact(self) -> Any:
        """Delete unreferenced rows and compact the tables (:func:`splitkeeper.delta.retention.compact`)."""
        from splitkeeper.delta.retention import compact

        return compact(self)

    def forget_mirror(self, table: Any = None, deleted: Collection[int] = ()) -> None:
        """Drop the cached metadata (retention calls it after it changed the checkpoints table): when
        ``table`` is the checkpoints table right after this store deleted ``deleted`` from it, the
        mirror follows without a read (:meth:`_mirror_after`)."""
        with self._lock:
            self._mirror = None if table is None else self._mirror_after(table, None, deleted)

    def _mirror_after(
        self, table: Any, added: KeptCheckpoint | None, deleted: Collection[int]
    ) -> tuple[int, tuple[KeptCheckpoint, ...], CheckpointStore] | None:
        """The mirror after this store's own commit to the checkpoints table (``added``: the row it
        appended; ``deleted``: the ids it deleted), under the lock, without reading the table: only
        when the cached mirror is of the version just before and ``table`` (the object the commit
        went through) is at the next one, so no other commit came between; None (read it again on
        the next use) otherwise, or when the commit was another attempt's (``added`` and
        ``deleted`` both empty)."""
        cached = self._mirror
        if cached is None or (added is None and not deleted):
            return None
        try:
            version = table.version()
        except Exception:  # noqa: BLE001 - not known: read it again
            return None
        if version != cached[0] + 1:
            return None
        gone = {int(i) for i in deleted}
        kept = [k for k in cached[1] if k.light.checkpoint_id not in gone]
        if added is not None:
            if any(k.light.checkpoint_id == added.light.checkpoint_id for k in kept):
                return None
            kept.append(added)
        ordered = tuple(sorted(kept, key=lambda k: k.light.checkpoint_id))
        return version, ordered, _chains(ordered)
