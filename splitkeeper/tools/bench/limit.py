"""The Arrow limit of ``bench ingest --limit``: what reading the same files and writing the same
parquet costs with nothing but Arrow, as a floor for any ingest tool on this machine.

One process per region (``--parallelism``, as the pipeline runs its regions), started for the
measurement (process start is part of the figure, as a pipeline's own start is part of ours).
Each takes its share of the files (round robin, as the even-split assignment gives them), reads
each file with Arrow's multithreaded CSV reader as one binary column (``raw``: a line is a
record, its bytes unchanged) or with Arrow's JSON reader and the benchmark's declared schema
(``json``), adds the ``split_id`` and ``offset`` columns our sink has (offset: the line's first
byte), and writes one parquet file per input file. No protocol, no Spark, no Delta log, no
exactly-once: that difference is what ``ours_over_limit`` shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

__all__ = ["LimitRun", "arrow_limit", "read_and_write"]

#: A byte no generated line holds: the CSV reader's delimiter, so a line is one field.
_NO_DELIMITER = "\x1f"


@dataclass(frozen=True, slots=True)
class LimitRun:
    """One measurement: wall seconds (processes started to every file written), the rows written
    per file and the load average while it ran (``load`` is the benchmark's ``LoadFigure``)."""

    seconds: float
    rows: dict[str, int]
    processes: int
    load: Any


def _read_raw(path: str) -> Any:
    import pyarrow as pa
    from pyarrow import csv

    return csv.read_csv(
        path,
        read_options=csv.ReadOptions(column_names=["value"]),
        parse_options=csv.ParseOptions(delimiter=_NO_DELIMITER, quote_char=False, escape_char=False),
        convert_options=csv.ConvertOptions(column_types={"value": pa.binary()}),
    )


def _read_json(path: str, schema_ddl: str) -> Any:
    from pyarrow import json

    from splitkeeper.records.ddl import arrow_schema, parse_ddl

    schema = arrow_schema(parse_ddl(schema_ddl))
    return json.read_json(path, parse_options=json.ParseOptions(explicit_schema=schema))


def read_and_write(paths: Sequence[str], out_dir: str, schema_ddl: str | None = None) -> dict[str, int]:
    """Read ``paths`` and write each as ``<out_dir>/<file name>.parquet``; file name -> rows.

    ``schema_ddl`` None reads raw lines (one binary ``value`` column and its byte ``offset``);
    a DDL reads JSON lines into its typed columns (and the row number as ``offset``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    rows: dict[str, int] = {}
    for path in paths:
        name = os.path.basename(path)
        if schema_ddl is None:
            table = _read_raw(path)
            sizes = pc.add(pc.binary_length(table.column("value")), 1).cast(pa.int64())
            offsets = pc.subtract(pc.cumulative_sum(sizes), sizes)
        else:
            table = _read_json(path, schema_ddl)
            offsets = pa.array(range(table.num_rows), pa.int64())
        table = table.append_column("offset", offsets).append_column(
            "split_id", pa.array([name] * table.num_rows, pa.string())
        )
        pq.write_table(table, os.path.join(out_dir, f"{name}.parquet"))
        rows[name] = table.num_rows
    return rows


def arrow_limit(
    input_dir: str, out_dir: str, processes: int, schema_ddl: str | None, load_sampler: Any
) -> LimitRun:
    """Time :func:`read_and_write` over every file of ``input_dir`` in ``processes`` fresh
    processes (spawned: nothing inherited from a process running a JVM)."""
    files = sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir))
    shares = [files[i::processes] for i in range(processes)]
    shares = [s for s in shares if s]
    os.makedirs(out_dir, exist_ok=True)
    rows: dict[str, int] = {}
    with load_sampler as sampler:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=len(shares), mp_context=get_context("spawn")) as pool:
            for done in pool.map(read_and_write, shares, [out_dir] * len(shares), [schema_ddl] * len(shares)):
                rows.update(done)
        seconds = time.perf_counter() - t0
    return LimitRun(round(seconds, 3), rows, len(shares), sampler.figure)
