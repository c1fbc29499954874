"""``source.kind: files``: the section of the file source (a directory tree, or one file).

Keys: ``path`` (a directory, scanned recursively, or one file; resolved against the pipeline
file's folder; or an object-store prefix or object, :data:`OBJECT_SCHEMES`), ``format``
(:class:`FileFormat`), ``split_bytes`` (0 = one split per file, else byte ranges of about that
size), ``on_file_change`` (a known file grew, changed or moved: ``fail``, ``new_version`` or
``append``; :class:`~splitkeeper.core.types.SplitChangePolicy`).
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from splitkeeper.config.base import Location, SourceKind, SourceSection, Text, choice, is_uri, where_of
from splitkeeper.core import defaults
from splitkeeper.core.types import SplitChangePolicy

__all__ = ["OBJECT_SCHEMES", "FileFormat", "FilesSource"]

#: The URI schemes ``source.path`` may have besides a local path (``file://`` is one):
#: the object stores :mod:`splitkeeper.sources.files.fs` reads.
OBJECT_SCHEMES = ("s3", "s3a", "gs", "abfss")


class FileFormat(enum.Enum):
    """How a file's bytes become records.

    ``LINES``: one record per line, the value is the line without its line
    terminator. ``JSONL``: one JSON document per non-blank line; blank lines are
    not records (their bytes count towards the neighbouring record's offsets).
    """

    LINES = "lines"
    JSONL = "jsonl"


class FilesSource(SourceSection):
    """``source`` with ``kind: files``: files in a directory tree (or one file), read line by line."""

    kind: Literal[SourceKind.FILES]
    path: Text = Field(description="the directory (or file) to ingest")
    format: FileFormat = choice(FileFormat, FileFormat.LINES)
    split_bytes: int = Field(0, ge=0, description="an integer >= 0 (0: one split per file)")
    on_file_change: SplitChangePolicy = choice(SplitChangePolicy, defaults.ON_FILE_CHANGE)

    @model_validator(mode="after")
    def _resolved(self, info: ValidationInfo) -> FilesSource:
        """The path resolved against the pipeline file's folder (a URI as given); a URI of a scheme
        the source cannot read, or without a bucket, is refused."""
        where = where_of(info)
        if is_uri(self.path) and not self.path.lower().startswith("file:"):
            scheme, _, rest = self.path.partition("://")
            if scheme.lower() not in OBJECT_SCHEMES or not rest.split("/", 1)[0]:
                raise where.invalid(
                    "source.path",
                    self.path,
                    "a local path, or an object-store URI "
                    + ", ".join(f"{s}://<bucket>/<prefix>" for s in OBJECT_SCHEMES),
                    "write the folder of the files as one of these (e.g. s3://drops/in)",
                )
        resolved = where.path(self.path)
        return self if resolved == self.path else self.model_copy(update={"path": resolved})

    @property
    def split_change_policy(self) -> SplitChangePolicy:
        return self.on_file_change

    def locations(self) -> list[Location]:
        return [Location("source.path", self.path, "the pipeline would read what it writes there as input")]
