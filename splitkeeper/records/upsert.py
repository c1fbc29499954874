"""The upsert contract: which sink row a record replaces or deletes (``sink.mode: upsert``).

One definition, used by the three places that must agree: the sink's per-epoch Delta MERGE
(delta-rs, DataFusion SQL), the restart checks' fold of the change table (Spark SQL), and the
config's load-time checks.

1. **Key.** ``key`` is a tuple of distinct sink columns (data columns, or the Kafka ``key``
   bookkeeping column). A record that is not a tombstone and whose key has a null column (the
   field is missing, null, or of another type; no Kafka key) is a bad record, stage ``schema``,
   error class ``NullKey`` (a dead letter under ``errors.tolerance: all``): it never reaches the
   keyed table, where such records would fold into one NULL-key row that overwrites the ones
   before it. Keys compare null-safely (``IS NOT DISTINCT FROM``, Spark's ``<=>``), which only
   keyless tombstones (rule 4) and rows of older versions can meet.
2. **Order.** Within an epoch the record with the highest ``offset`` per key wins; two records of
   one key at the same offset in different splits are told apart by ``split_id`` (the higher wins).
   Across epochs the later epoch wins. So per-key order is the source's order when a key lives in
   one split (as in Kafka, where the producer's partitioner puts a key in one partition); for a key
   written to several splits the table holds the record of the latest epoch, and within it the
   highest offset: deterministic, but not the producer's order.
3. **Deletes.** A record is a delete of its key when :data:`TOMBSTONE` is true (its value was null:
   a Kafka tombstone) or when ``delete_when`` (a SQL predicate over the record's columns, e.g.
   ``op = 'd'``) is true; a predicate that is null is false. A delete of a key that is not in the
   table changes nothing.
4. **Tombstones without a key.** A tombstone's data columns are null. When ``key`` names a data
   column, the tombstone carries no key: it stays in the change table (the accounting) and changes
   nothing in the keyed table (:attr:`UpsertSpec.keyed_tombstones` is False). Key by the Kafka
   ``key`` column to delete on tombstones.
5. **Fold.** The keyed table always equals the fold of the change table: per key, the winning
   record by ``(epoch, offset, split_id)`` (rule 2); its key is present when that record is not a
   delete (rules 3, 4). The restart checks prove it (:mod:`splitkeeper.quality.checks`).

Pure Python (``sqlglot`` parses the predicate; :func:`winners` is pyarrow); no Spark, no delta-rs.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from splitkeeper.errors import UpsertError
from splitkeeper.records.spec import TOMBSTONE

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa

__all__ = [
    "ORDER_COLUMNS",
    "TOMBSTONE",
    "FOLD_RESULT_FILE",
    "VERDICT_COLUMNS",
    "FoldResult",
    "UpsertError",
    "UpsertSpec",
    "winners",
    "read_fold_result",
]

#: Rule 2's order, most significant first: the winner of a key has the greatest tuple.
ORDER_COLUMNS: tuple[str, ...] = ("epoch", "offset", "split_id")
#: The bookkeeping columns a key may name besides the data columns (a tombstone keeps them).
SOURCE_KEY_COLUMNS: frozenset[str] = frozenset({"key"})


@dataclass(frozen=True, slots=True)
class UpsertSpec:
    """An upsert sink's key and delete predicate (picklable; see the module doc)."""

    key: tuple[str, ...]
    delete_when: str | None = None

    @classmethod
    def of(
        cls, key: Sequence[str], delete_when: str | None, *, columns: Iterable[str] | None = None
    ) -> UpsertSpec:
        """Checked: a non-empty key of distinct names, a predicate that parses; with ``columns`` (the
        sink's column names) every key column and every column the predicate names is one of them.
        Raises :class:`UpsertError` naming what is wrong and what is allowed."""
        key = tuple(key)
        if not key:
            raise UpsertError("key", "a non-empty list of sink column names")
        if len(set(key)) != len(key):
            raise UpsertError("key", "distinct column names")
        spec = cls(key, delete_when or None)
        names = None if columns is None else list(columns)
        referenced = spec.predicate_columns()
        if names is not None:
            spec.check_columns(names)
        elif referenced is None:  # pragma: no cover - predicate_columns raises instead
            raise UpsertError("delete_when", "a SQL predicate")
        return spec

    def check_columns(self, columns: Iterable[str]) -> None:
        """Every key and predicate column is one of ``columns``; else :class:`UpsertError`."""
        names = list(columns)
        allowed = ", ".join(n for n in names if n != TOMBSTONE)
        for name in self.key:
            if name not in names or name == TOMBSTONE:
                raise UpsertError("key", f"names of the sink's columns: {allowed}; {name!r} is not one")
        for name in self.predicate_columns():
            if name not in names:
                raise UpsertError(
                    "delete_when",
                    f"a SQL predicate over the sink's columns ({allowed}); "
                    f"it names {name!r}, which is not one",
                )

    @property
    def keyed_tombstones(self) -> bool:
        """Whether a tombstone has its key (rule 4): every key column is a bookkeeping column it keeps."""
        return all(name in SOURCE_KEY_COLUMNS for name in self.key)

    # -- the predicate ----------------------------------------------------------------------

    def _parsed(self) -> Any:
        import sqlglot
        from sqlglot import exp
        from sqlglot.errors import ParseError

        assert self.delete_when is not None
        try:
            tree = sqlglot.parse_one(self.delete_when, read="spark")
        except ParseError as err:
            first = err.errors[0] if err.errors else {}
            where = f" at line {first.get('line')}, column {first.get('col')}" if first else ""
            what = re.sub(r" for <class '[^']*'>", "", first.get("description") or str(err).splitlines()[0])
            raise UpsertError(
                "delete_when",
                "a SQL predicate over the record's columns, e.g. \"op = 'd'\" "
                f"(it does not parse{where}: {what})",
            ) from None
        if isinstance(tree, exp.Query) or tree.find(exp.Select, exp.Subquery) is not None:
            raise UpsertError("delete_when", "a predicate over one record, not a query")
        if tree.find(exp.AggFunc, exp.Window) is not None:
            raise UpsertError("delete_when", "a predicate over one record (no aggregate or window)")
        return tree

    def predicate_columns(self) -> tuple[str, ...]:
        """The column names ``delete_when`` refers to (empty without one)."""
        if self.delete_when is None:
            return ()
        from sqlglot import exp

        return tuple(dict.fromkeys(c.name for c in self._parsed().find_all(exp.Column)))

    def delete_condition(self, alias: str | None = None, *, dialect: str = "") -> str:
        """Rule 3 as SQL: ``(tombstone OR COALESCE((delete_when), FALSE))``, each column qualified with
        ``alias`` when given; ``dialect`` is sqlglot's name of the engine ('spark', or '' for the
        generic SQL that DataFusion, delta-rs's engine, reads)."""
        from sqlglot import exp

        prefix = f"{alias}." if alias else ""
        tombstone = f"{prefix}{TOMBSTONE}"
        if self.delete_when is None:
            return f"(COALESCE({tombstone}, FALSE))"
        tree = self._parsed().copy()
        if alias:
            for column in tree.find_all(exp.Column):
                column.set("table", exp.to_identifier(alias))
        return f"(COALESCE({tombstone}, FALSE) OR COALESCE(({tree.sql(dialect=dialect or None)}), FALSE))"

    def key_match(self, target: str, source: str, *, dialect: str = "") -> str:
        """Rule 1 as SQL: the key columns of ``target`` and ``source`` compare null-safely."""
        from sqlglot import exp

        def column(table: str, name: str) -> str:
            return str(exp.column(name, table=table, quoted=True).sql(dialect=dialect or None))

        return " AND ".join(f"{column(target, k)} IS NOT DISTINCT FROM {column(source, k)}" for k in self.key)


def winners(rows: pa.Table, upsert: UpsertSpec) -> pa.Table:
    """An epoch's staged rows reduced to what a sink applies to its keyed table (the Delta MERGE, the
    Iceberg overwrite): keyless tombstones dropped (rule 4), then per key (null-safe) the row of the
    highest ``(offset, split_id)`` (rule 2; one epoch, so ``epoch`` ties). Vectorised with pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not upsert.keyed_tombstones and rows.num_rows:
        rows = rows.filter(pc.invert(pc.fill_null(rows.column(TOMBSTONE), False)))
    if rows.num_rows == 0:
        return rows
    row = "__splitkeeper_row"
    indexed = rows.append_column(row, pa.array(range(rows.num_rows), pa.int64()))
    ordered = indexed.sort_by([("offset", "descending"), ("split_id", "descending")])
    first = ordered.group_by(list(upsert.key), use_threads=False).aggregate([(row, "first")])
    picked = first.column(f"{row}_first").combine_chunks()
    return rows.take(picked.take(pc.sort_indices(picked)))  # in staged order


# --------------------------------------------------------------------------- the fold check's result

#: The verdict columns of the comparison frame, in the suite's order.
VERDICT_COLUMNS: tuple[str, ...] = ("missing_key", "extra_key", "stale_row", "duplicate_key")
#: The fold check's result, written beside the Data Docs ``index.html`` (the report reads it).
FOLD_RESULT_FILE = "upsert_fold.json"
#: How many offending keys a result names.
FIRST_KEYS = 5


@dataclass(frozen=True, slots=True)
class FoldResult:
    """What the fold check found: the key counts, the offenders per verdict and the first of them.

    ``first``: up to :data:`FIRST_KEYS` offending rows (by key), each ``{"key", "split_id",
    "offset", "verdict", "detail"}``. ``status``/``expectations`` are the GE suite's, filled by
    :func:`splitkeeper.quality.checks.run_restart_checks` (one line per expectation). Written by the
    checks beside their Data Docs, shown by the report: a value of both, so it lives here.
    """

    changes_path: str
    keyed_path: str
    key: tuple[str, ...]
    delete_when: str | None
    change_rows: int = 0
    deletes: int = 0
    keys_in_fold: int = 0
    keyed_rows: int = 0
    missing_key: int = 0
    extra_key: int = 0
    stale_row: int = 0
    duplicate_key: int = 0
    compared_columns: tuple[str, ...] = ()
    first: tuple[dict[str, Any], ...] = ()
    status: str = ""
    expectations: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def offenders(self) -> int:
        return self.missing_key + self.extra_key + self.stale_row + self.duplicate_key

    @property
    def success(self) -> bool:
        return self.offenders == 0

    @property
    def upserts(self) -> int:
        return self.change_rows - self.deletes

    @property
    def first_keys(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(r["key"]) for r in self.first))

    @property
    def split_ids(self) -> tuple[str, ...]:
        return tuple(sorted({str(r["split_id"]) for r in self.first if r.get("split_id") is not None}))

    def verdict(self) -> str:
        """One sentence: holds, or the counts and the first offending keys."""
        head = (
            f"the keyed table ({self.keyed_rows:,} row(s)) and the fold of the change table "
            f"({self.change_rows:,} record(s), {self.keys_in_fold:,} live key(s))"
        )
        if self.success:
            return f"{head} are equal"
        counts = ", ".join(
            f"{n} {name.replace('_', ' ')}" for name in VERDICT_COLUMNS if (n := getattr(self, name))
        )
        return f"{head} differ: {counts}; first keys: {', '.join(self.first_keys)}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["success"] = self.success
        out["upserts"] = self.upserts
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FoldResult:
        names = set(cls.__dataclass_fields__)
        kept = {k: v for k, v in data.items() if k in names}
        for name in ("key", "compared_columns", "first", "expectations", "notes"):
            kept[name] = tuple(kept.get(name) or ())
        return cls(**kept)

    def write(self, folder: str | os.PathLike[str]) -> Path:
        target = Path(folder) / FOLD_RESULT_FILE
        target.write_text(json.dumps(self.to_dict(), indent=2, default=str), encoding="utf-8")
        return target


def read_fold_result(folder: str | os.PathLike[str]) -> FoldResult | None:
    """The result the last fold check left in ``folder`` (the Data Docs folder), None when none."""
    path = Path(folder) / FOLD_RESULT_FILE
    if not path.is_file():
        return None
    return FoldResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
