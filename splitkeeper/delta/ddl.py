"""Where the table definitions are: the one lookup of a ``state/<table>.ddl`` file.

:func:`ddl_path` is the only function that locates a DDL file (package data through
:func:`splitkeeper.resources.state_schema_dir`, ``SPLITKEEPER_STATE_SCHEMA_DIR``
overrides); :func:`read_ddl` returns a file's column list without comments. Only the
standard library is imported, so an installed splitkeeper without its engine extras can
still read them; :mod:`splitkeeper.delta.tables` parses them into pyarrow schemas.
"""

from __future__ import annotations

from importlib.resources.abc import Traversable

from splitkeeper.errors import StateError
from splitkeeper.resources import STATE_SCHEMA_DIR_ENV, state_schema_dir

__all__ = ["SCHEMA_DIR_ENV", "ddl_path", "read_ddl", "schema_dir"]

#: Environment variable naming another folder of ``<table>.ddl`` files (deployments mount it).
SCHEMA_DIR_ENV = STATE_SCHEMA_DIR_ENV


def schema_dir() -> Traversable:
    """The folder of the ``<table>.ddl`` files (see :func:`splitkeeper.resources.state_schema_dir`)."""
    return state_schema_dir()


def ddl_path(table: str) -> Traversable:
    """Where the DDL of ``table`` is: the only lookup of a DDL file."""
    return schema_dir() / f"{table}.ddl"


def read_ddl(table: str) -> str:
    """The column list of ``table`` from its DDL file, ``--`` comments removed (lines kept)."""
    path = ddl_path(table)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise StateError(
            f"the schema file of table {table!r} is missing at {path}: the state/ folder of splitkeeper "
            f"holds one .ddl file per table (set {SCHEMA_DIR_ENV} if it lives elsewhere)",
            table=table,
            path=str(path),
        ) from err
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())
