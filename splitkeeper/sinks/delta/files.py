"""Moving staged files into a table's folder, where a commit then names them."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq

from splitkeeper.delta import storage
from splitkeeper.delta.schemas import STAGED_COLUMNS, STAGED_FILE_SCHEMA

__all__ = ["exists", "move", "rewrite_with_ingested_at", "uri_path"]


def uri_path(name: str) -> str:
    """A table-relative file name as a Delta log path (URI-encoded)."""
    return quote(name, safe="/=")


def exists(uri: str) -> bool:
    fs, inner = storage.filesystem(uri)
    return bool(fs.get_file_info(inner).type.name == "File")


def move(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` on one local file system; otherwise copy (the source stays)."""
    src_local, dst_local = storage.local_path(source), storage.local_path(target)
    if src_local is not None and dst_local is not None:
        os.makedirs(os.path.dirname(dst_local), exist_ok=True)  # a partition's folder
        try:
            os.replace(src_local, dst_local)
            # a rename keeps the staged file's time: maintain's untracked window counts from the move
            os.utime(dst_local)
            return
        except OSError as err:
            if err.errno != 18:  # EXDEV: another device; copy instead
                raise
        partial = f"{dst_local}.copying"
        shutil.copyfile(src_local, partial)
        os.replace(partial, dst_local)
        return
    import pyarrow.fs as pafs

    src_fs, src_inner = storage.filesystem(source)
    dst_fs, dst_inner = storage.filesystem(target)
    pafs.copy_files(src_inner, dst_inner, source_filesystem=src_fs, destination_filesystem=dst_fs)


def rewrite_with_ingested_at(source: str, target: str) -> None:
    """An older writer's staged file (record columns only), written into the table with
    ``ingested_at`` = now."""
    src_fs, src_inner = storage.filesystem(source)
    with src_fs.open_input_file(src_inner) as handle:
        data = pq.read_table(handle)
    now = pa.scalar(datetime.now(UTC), STAGED_FILE_SCHEMA.field("ingested_at").type)
    stamped = pa.schema(list(STAGED_FILE_SCHEMA)[: len(STAGED_COLUMNS) + 1])  # the metadata columns read NULL
    data = data.append_column(STAGED_FILE_SCHEMA.field("ingested_at"), pa.repeat(now, data.num_rows)).cast(
        stamped
    )
    dst_fs, dst_inner = storage.filesystem(target)
    with dst_fs.open_output_stream(dst_inner) as out:
        pq.write_table(data, out)
