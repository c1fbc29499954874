"""The verdicts of the restart checks, in a Delta table beside the state (``state/validations.ddl``).

Rules:

1. :meth:`ValidationRecords.record` appends one row per run of the restart checks of
   ``splitkeeper validate`` (the DAGs' validate task), passed or failed: the checkpoint, who ran
   them, the suites' statuses, the Data Docs page, the verdict, and ``tables``: the fingerprint of
   what the checks read (the Delta version of each state and sink-side table, and the settings the
   checks used). A failed run is recorded before its error is raised, so the run report can say
   the checks failed. It needs no lease (it changes nothing the protocol decides) and writes
   nothing else.
2. :meth:`ValidationRecords.passed` returns the latest *passed* validate row for a checkpoint whose
   fingerprint equals the given one, or None. The same checkpoint with the same table versions and
   settings is the same input: the checks would read the same rows and reach the same verdict,
   so a validate with nothing new names that row instead of scanning the sink again. A missing
   table is no row.
3. :meth:`ValidationRecords.record_restart_checks` appends the in-run restart checks
   (:mod:`splitkeeper.core.restarts`: a restore inside a run, proven before the run reads on), one
   row each, ``restore`` naming it; their fingerprint is empty (never a passed validate's).
4. :meth:`ValidationRecords.recorded` reads them back, newest first, for status, the run report
   and the metrics' seed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.compute as pc

from splitkeeper.core.restarts import RULE_OF, RestartCheck
from splitkeeper.delta.control import requester
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import StateTables, open_table

__all__ = ["VALIDATIONS_TABLE", "PassedValidation", "RecordedCheck", "ValidationRecords", "table_versions"]

VALIDATIONS_TABLE = "validations"


def table_versions(paths: Mapping[str, str | None]) -> dict[str, int]:
    """The latest Delta version of each table at ``paths`` (-1: no table there; None paths skipped)."""
    out: dict[str, int] = {}
    for name, path in paths.items():
        if path is None:
            continue
        table = open_table(path, missing_ok=True)
        out[name] = -1 if table is None else table.version()
    return out


@dataclass(frozen=True, slots=True)
class RecordedCheck:
    """One row of the validations table as status and the report show it (rule 4)."""

    checkpoint_id: int
    at: datetime
    by: str
    verdict: str  # passed | failed
    suites: dict[str, str]  # suite (validate) or rule (in-run) -> passed | failed
    restore: str | None = None  # None: a run of splitkeeper validate; else the in-run restore
    epoch: int | None = None  # in-run: the epoch that read next
    readers: tuple[int, ...] = ()
    detail: str = ""
    data_docs: str | None = None

    @property
    def in_run(self) -> bool:
        return self.restore is not None

    def line(self) -> str:
        """One sentence for status and the report."""
        when = self.at.strftime("%Y-%m-%d %H:%M:%S UTC")
        if self.restore is None:
            what = f"restart checks (validate) of checkpoint {self.checkpoint_id}: {self.verdict.upper()}"
        else:
            readers = ", ".join(map(str, self.readers))
            what = (
                f"in-run check of the {self.restore.replace('_', ' ')} of checkpoint {self.checkpoint_id} "
                f"(readers {readers}; before epoch {self.epoch}), rules {', '.join(self.suites)}: "
                f"{self.verdict.upper()}"
            )
        return f"{when} {what}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True, slots=True)
class PassedValidation:
    """One row of the validations table."""

    checkpoint_id: int
    validated_at: datetime
    validated_by: str
    fingerprint: dict[str, Any]
    suites: dict[str, str]
    data_docs: str | None


def _fingerprint_text(fingerprint: Mapping[str, Any]) -> str:
    return json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))


class ValidationRecords:
    """The passed restart-check runs of one pipeline (see the module doc)."""

    def __init__(self, tables: StateTables, pipeline: str) -> None:
        self.tables = tables
        self.pipeline = pipeline

    def record(
        self,
        checkpoint_id: int,
        fingerprint: Mapping[str, Any],
        suites: Mapping[str, str],
        data_docs: str | None,
        *,
        verdict: str = "passed",
        detail: str = "",
    ) -> datetime:
        """Rule 1; returns when the run was recorded."""
        now = datetime.now(UTC)
        row = {
            "pipeline": self.pipeline,
            "checkpoint_id": checkpoint_id,
            "validated_at": now,
            "validated_by": requester(),
            "tables": _fingerprint_text(fingerprint) if fingerprint else "",
            "suites": json.dumps(dict(suites), sort_keys=True),
            "data_docs": data_docs,
            "verdict": verdict,
            "detail": detail or None,
        }
        self._append([row])
        return now

    def record_restart_checks(self, checks: Sequence[RestartCheck]) -> None:
        """Rule 3."""
        now = datetime.now(UTC)
        by = requester()
        rows = []
        for i, check in enumerate(checks):
            failed = set(check.failed_rules)
            lines = [f"rule {RULE_OF[v.kind]} {v}" for v in check.violations] or list(check.notes)
            rows.append(
                {
                    "pipeline": self.pipeline,
                    "checkpoint_id": -1 if check.checkpoint_id is None else check.checkpoint_id,
                    "validated_at": now + timedelta(microseconds=i),  # their order, in one append
                    "validated_by": by,
                    "tables": "",
                    "suites": json.dumps({r: "failed" if r in failed else "passed" for r in check.rules}),
                    "verdict": check.verdict,
                    "restore": check.restore.value,
                    "epoch_id": check.epoch,
                    "readers": list(check.readers),
                    "detail": "; ".join(lines)[:4000] or None,
                }
            )
        if rows:
            self._append(rows)

    def _append(self, rows: list[dict[str, Any]]) -> None:
        self.tables.ensure(VALIDATIONS_TABLE)
        self.tables.append(VALIDATIONS_TABLE, spec(VALIDATIONS_TABLE).rows(rows))

    def recorded(self, *, in_run: bool | None = None, limit: int | None = None) -> list[RecordedCheck]:
        """Rule 4: the pipeline's rows, newest first; ``in_run`` True (False): only in-run checks
        (only validate runs); ``limit``: at most that many. A missing table is no row."""
        rows = self.tables.read(VALIDATIONS_TABLE, filter=pc.field("pipeline") == self.pipeline).to_pylist()
        if in_run is not None:
            rows = [r for r in rows if (r.get("restore") is not None) == in_run]
        rows.sort(key=lambda r: r["validated_at"], reverse=True)
        return [
            RecordedCheck(
                checkpoint_id=int(r["checkpoint_id"]),
                at=r["validated_at"],
                by=r["validated_by"],
                verdict=r.get("verdict") or "passed",
                suites=json.loads(r["suites"] or "{}"),
                restore=r.get("restore"),
                epoch=r.get("epoch_id"),
                readers=tuple(r.get("readers") or ()),
                detail=r.get("detail") or "",
                data_docs=r.get("data_docs"),
            )
            for r in rows[:limit]
        ]

    def passed(self, checkpoint_id: int, fingerprint: Mapping[str, Any]) -> PassedValidation | None:
        """Rule 2."""
        rows = self.tables.read(
            VALIDATIONS_TABLE,
            filter=(pc.field("pipeline") == self.pipeline) & (pc.field("checkpoint_id") == checkpoint_id),
        )
        wanted = _fingerprint_text(fingerprint)
        found = [
            r
            for r in rows.to_pylist()
            if r["tables"] == wanted
            and r.get("restore") is None
            and (r.get("verdict") or "passed") == "passed"
        ]
        if not found:
            return None
        row = max(found, key=lambda r: r["validated_at"])
        return PassedValidation(
            checkpoint_id=int(row["checkpoint_id"]),
            validated_at=row["validated_at"],
            validated_by=row["validated_by"],
            fingerprint=json.loads(row["tables"]),
            suites=json.loads(row["suites"]),
            data_docs=row["data_docs"],
        )
