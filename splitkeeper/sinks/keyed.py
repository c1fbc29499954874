"""The upsert keys of every sink kind that can upsert, declared once and checked by one rule.

:class:`KeyedSinkSection`: the base of such a kind's section: ``key`` and ``delete_when`` (one
definition for the Delta and the Iceberg sink; the kind says which ``mode`` upserts,
:attr:`~KeyedSinkSection.upserting`, and what syntax its ``delete_when`` takes), and the
:attr:`~KeyedSinkSection.upsert` rule made of them.

:func:`check_upsert_keys`: an append sink names none of the upsert keys (``key``, ``delete_when``,
its change table's key); an upsert sink has a key of distinct sink columns and a delete predicate
that parses and names sink columns only (a Spark transform may change the columns: its key and
predicate are checked again against its output when the pipeline opens), and no
``decode.on_new_fields: add_columns`` (the keyed table's columns are fixed).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import Field

from splitkeeper.config.base import SinkSection, Text, Where
from splitkeeper.errors import UpsertError
from splitkeeper.records.upsert import UpsertSpec

__all__ = ["KeyedSinkSection", "check_upsert_keys"]


class KeyedSinkSection(SinkSection):
    """``sink`` of a kind that can upsert (``sink.mode: upsert``): its row key and delete predicate."""

    key: tuple[Text, ...] = Field(
        (),
        strict=False,
        description="a list of sink column names: the row key of an upsert sink (mode 'upsert')",
    )
    delete_when: Text | None = Field(
        None,
        description="a predicate over the record's columns that makes it a delete of its key, e.g. "
        "\"op = 'd'\" (mode 'upsert'; a null Kafka value deletes too); delta reads it as Spark SQL, "
        "iceberg as pyiceberg's row filter (comparisons, IN, IS NULL, LIKE 'prefix%', AND, OR, NOT)",
    )

    @property
    def upserting(self) -> bool:
        """True when ``sink.mode`` is the kind's upsert mode."""
        raise NotImplementedError

    @functools.cached_property
    def upsert(self) -> UpsertSpec | None:
        """The upsert rule (key and deletes) of an upsert sink; None for an append sink."""
        if not self.upserting:
            return None
        return UpsertSpec.of(self.key, self.delete_when)


def check_upsert_keys(
    section: KeyedSinkSection, file: Any, at: Where, *, keys: tuple[str, ...], why: str
) -> None:
    """The upsert keys of ``section`` against ``file`` (the module doc); ``keys``: the section's keys
    only an upsert sink may give; ``why``: why ``add_columns`` is refused, for the message. Raises the
    ConfigError of ``at`` naming the key."""
    from splitkeeper.config.models import NewFields, TransformKind

    if not section.upserting:
        for key in keys:
            if key in section.given():
                value = getattr(section, key)
                raise at.invalid(
                    f"sink.{key}",
                    list(value) if isinstance(value, tuple) else value,
                    "nothing unless sink.mode is 'upsert' (an append sink keeps every record)",
                    "set sink.mode: upsert",
                )
        return
    key_columns, delete_when = section.key, section.delete_when
    if not key_columns:
        raise at.missing("sink.key", "the list of sink columns that identify a row (sink.mode is 'upsert')")
    try:
        UpsertSpec.of(
            key_columns,
            delete_when,
            columns=None if file.transform_kind is TransformKind.SPARK else file.decode.sink_column_names(),
        )
    except UpsertError as err:
        value = list(key_columns) if err.key == "key" else delete_when
        raise at.invalid(f"sink.{err.key}", value, err.message) from None
    if file.decode.on_new_fields == NewFields.ADD_COLUMNS.value:
        raise at.invalid(
            "decode.on_new_fields",
            NewFields.ADD_COLUMNS.value,
            f"rescue or fail with sink.mode 'upsert' ({why})",
            "keep new fields in the _rescued column (rescue), or declare them in decode.schema",
        )
