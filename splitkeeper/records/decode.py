"""Decoding a range's values into the sink's data columns, columnar, with bad records kept apart.

Contract of :func:`decode_values` ``(spec, values)``:

1. ``values`` is the range's record values as one binary array (a null is a Kafka null
   value); the result's ``table`` holds the good records only, in input order, with the
   columns of ``spec.data_columns()`` (plus, for ``on_new_fields: add_columns``, the new
   columns named in ``new_columns``, after them) and their Arrow types;
   ``kept`` is the input index of each row of ``table``.
2. Every input index is either in ``kept`` or in ``bad`` (with its stage, ``decode`` for
   bytes that do not parse or ``schema`` for a parsed record that does not fit the declared
   columns, the error class and a message); never both. Nothing is replaced silently.
3. ``on_new_fields: fail`` raises :class:`SchemaDriftError` naming the field and the input
   index of the first record that has it (the region task adds the split and offset).
4. The normal path has no Python step per record; a batch with bad records may be
   re-checked record by record to find them.

STUB (issue 21, being filled in): ``raw`` and ``text`` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from splitkeeper.errors import SplitkeeperError
from splitkeeper.records.spec import DecodeSpec

__all__ = ["STAGES", "BadRecords", "Decoded", "SchemaDriftError", "decode_values"]

#: Where a bad record failed: its bytes, the declared columns, or the user's transform.
STAGES = ("decode", "schema", "transform")


class SchemaDriftError(SplitkeeperError):
    """A record has a field the declared schema does not name, and ``on_new_fields`` is ``fail``."""

    code = "SCHEMA_DRIFT"


@dataclass(frozen=True, slots=True)
class BadRecords:
    """Bad records of a range: parallel lists, ``indices`` ascending (input positions)."""

    indices: list[int] = field(default_factory=list)
    stages: list[str] = field(default_factory=list)
    error_classes: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.indices)

    def add(self, index: int, stage: str, error: BaseException | str, error_class: str | None = None) -> None:
        self.indices.append(index)
        self.stages.append(stage)
        self.error_classes.append(error_class or type(error).__name__)
        self.messages.append(str(error))


@dataclass(frozen=True, slots=True)
class Decoded:
    table: pa.Table
    kept: pa.Array  # int64: the input index of each row of ``table``
    bad: BadRecords
    new_columns: tuple[str, ...] = ()


def _all_kept(table: pa.Table) -> Decoded:
    return Decoded(table, pa.array(range(table.num_rows), pa.int64()), BadRecords())


def decode_values(spec: DecodeSpec, values: pa.Array) -> Decoded:
    """The range's values decoded per ``spec`` (module doc)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if spec.kind == "raw":
        if values.type != pa.binary():
            values = values.cast(pa.binary())
        return _all_kept(pa.table({"value": values}))
    if spec.kind == "text":
        return _text(values)
    raise NotImplementedError(f"decode.kind {spec.kind!r} is not built yet")


def _text(values: pa.Array) -> Decoded:
    try:
        return _all_kept(pa.table({"value": values.cast(pa.string())}))
    except pa.ArrowInvalid:
        pass
    bad = BadRecords()
    kept: list[int] = []
    out: list[Any] = []
    for i, raw in enumerate(values.to_pylist()):  # only a batch with invalid UTF-8 comes here
        if raw is None:
            kept.append(i)
            out.append(None)
            continue
        try:
            out.append(raw.decode("utf-8"))
            kept.append(i)
        except UnicodeDecodeError as err:
            bad.add(i, "decode", f"not valid UTF-8: {err}", "UnicodeDecodeError")
    return Decoded(pa.table({"value": pa.array(out, pa.string())}), pa.array(kept, pa.int64()), bad)
