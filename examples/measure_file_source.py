"""Measure FileSource read and read+stage throughput on one core.

Generates (once, deterministically) a ~200 MB file of 2M JSON lines with
``make_files.py``, pins the process to one CPU, and times:

1. reading every line through ``FileRegionReader.read_range`` (format lines),
2. the same with format jsonl (each line validated as JSON),
3. ``run_region_task`` with the identity transform (read + parquet staging),
4. ``run_region_task`` over 4 line-aligned byte-range splits of the file.

    python examples/measure_file_source.py [--dir /tmp/sk-measure] [--lines 2000000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_files import write_files  # noqa: E402
from splitkeeper.spark.sources import FileSource  # noqa: E402

from splitkeeper.spark.task import run_region_task  # noqa: E402
from splitkeeper.transforms import identity  # noqa: E402


def timed(label: str, records_bytes: int, fn: Callable[[], int]) -> None:
    started, cpu_started = time.perf_counter(), time.process_time()
    records = fn()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    print(
        f"{label:<42} {records:>9} rec  wall {elapsed:6.2f} s {records / elapsed:>10,.0f} rec/s "
        f"{records_bytes / elapsed / 1e6:6.1f} MB/s | cpu {cpu:6.2f} s {records / cpu:>10,.0f} rec/cpu-s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/sk-measure")
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--line-bytes", type=int, default=100)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    data = Path(args.dir) / "data"
    if not data.exists():
        write_files(str(data), files=1, lines=args.lines, line_bytes=args.line_bytes)
    (path,) = sorted(data.iterdir())
    size = path.stat().st_size
    print(
        f"input {path}: {size / 1e6:.1f} MB, cpus {sorted(os.sched_getaffinity(0))}, "
        f"load avg {os.getloadavg()[0]:.1f}"
    )

    def read(fmt: str) -> int:
        source = FileSource(data, format=fmt)
        (split,) = source.discover_splits()
        count = 0
        for _ in source.reader().read_range(split, 0, split.end or 0):
            count += 1
        return count

    def stage(split_bytes: int) -> int:
        staging = Path(args.dir) / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        source = FileSource(data, split_bytes=split_bytes)
        plan = [(s, s.position, s.end or 0) for s in source.discover_splits()]
        result = run_region_task(plan, source.reader(), identity, str(staging), epoch=1, region=0)
        print(f"    staged {result.staged_bytes / 1e6:.1f} MB parquet in {len(plan)} split(s)")
        return result.records

    timed("read, format lines", size, lambda: read("lines"))
    timed("read, format jsonl (JSON-validated)", size, lambda: read("jsonl"))
    timed("read + stage (run_region_task, identity)", size, lambda: stage(0))
    timed("read + stage, 4 byte-range splits", size, lambda: stage(size // 4 + 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
