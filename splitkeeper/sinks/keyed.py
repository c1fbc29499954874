"""What every sink kind's ``sink.mode: upsert`` section checks against the rest of the pipeline file
(:meth:`~splitkeeper.config.base.SinkSection.checked`): one rule for the Delta and the Iceberg sink.

:func:`check_upsert_keys`: an append sink names none of the upsert keys (``key``, ``delete_when``,
its change table's key); an upsert sink has a key of distinct sink columns and a delete predicate
that parses and names sink columns only (a Spark transform may change the columns: its key and
predicate are checked again against its output when the pipeline opens), and no
``decode.on_new_fields: add_columns`` (the keyed table's columns are fixed).
"""

from __future__ import annotations

from typing import Any

from splitkeeper.config.base import SinkSection, Where
from splitkeeper.errors import UpsertError
from splitkeeper.records.upsert import UpsertSpec

__all__ = ["check_upsert_keys"]


def check_upsert_keys(
    section: SinkSection, file: Any, at: Where, *, upsert: bool, keys: tuple[str, ...], why: str
) -> None:
    """The upsert keys of ``section`` against ``file`` (the module doc); ``keys``: the section's keys
    only an upsert sink may give; ``why``: why ``add_columns`` is refused, for the message. Raises the
    ConfigError of ``at`` naming the key."""
    from splitkeeper.config.models import NewFields, TransformKind

    if not upsert:
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
    key_columns: tuple[str, ...] = section.key  # type: ignore[attr-defined]
    delete_when: str | None = section.delete_when  # type: ignore[attr-defined]
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
