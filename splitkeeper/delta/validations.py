"""The restart-check runs that passed, in a Delta table beside the state (``state/validations.ddl``).

Rules:

1. :meth:`ValidationRecords.record` appends one row when the restart checks of a checkpoint
   passed: the checkpoint, who ran them, the suites' statuses, the Data Docs page, and
   ``tables``: the fingerprint of what the checks read (the Delta version of each state and
   sink-side table, and the settings the checks used). It needs no lease (it changes nothing
   the protocol decides) and writes nothing else.
2. :meth:`ValidationRecords.passed` returns the latest row for a checkpoint whose fingerprint
   equals the given one, or None. The same checkpoint with the same table versions and
   settings is the same input: the checks would read the same rows and reach the same verdict,
   so a validate with nothing new names that row instead of scanning the sink again. A missing
   table is no row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc

from splitkeeper.delta.control import requester
from splitkeeper.delta.schemas import spec
from splitkeeper.delta.tables import StateTables, open_table

__all__ = ["VALIDATIONS_TABLE", "PassedValidation", "ValidationRecords", "table_versions"]

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
    ) -> datetime:
        """Rule 1; returns when the run was recorded."""
        now = datetime.now(UTC)
        row = {
            "pipeline": self.pipeline,
            "checkpoint_id": checkpoint_id,
            "validated_at": now,
            "validated_by": requester(),
            "tables": _fingerprint_text(fingerprint),
            "suites": json.dumps(dict(suites), sort_keys=True),
            "data_docs": data_docs,
        }
        self.tables.ensure(VALIDATIONS_TABLE)
        self.tables.append(VALIDATIONS_TABLE, spec(VALIDATIONS_TABLE).rows([row]))
        return now

    def passed(self, checkpoint_id: int, fingerprint: Mapping[str, Any]) -> PassedValidation | None:
        """Rule 2."""
        rows = self.tables.read(
            VALIDATIONS_TABLE,
            filter=(pc.field("pipeline") == self.pipeline) & (pc.field("checkpoint_id") == checkpoint_id),
        )
        wanted = _fingerprint_text(fingerprint)
        found = [r for r in rows.to_pylist() if r["tables"] == wanted]
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
