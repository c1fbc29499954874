"""``splitkeeper-tools bench table``: run the README's speed benchmarks and regenerate its table.

One command regenerates the README's speed table: each row is one ``splitkeeper-tools bench ingest``
run (a fresh process, its progress on stderr as it goes), measured side by side against
Structured Streaming by the benchmark itself. The table says the machine's load during each
row (the 1-minute load average sampled every second, mean and max) and the cores, because the
figures of a shared machine only mean something with it. ``--write README.md`` replaces the
text between the ``bench-table`` markers; without it the table is printed.

Rows whose benchmark fails (its exactly-once checks, or the process) keep a row that says so,
and the command exits 1, so a table with a failed row is never taken for a good one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools.bench.ingest import LoadSampler

BEGIN = "<!-- bench-table:begin"
END = "<!-- bench-table:end -->"


@dataclass(frozen=True, slots=True)
class Row:
    """One benchmark of the table: ``splitkeeper-tools bench`` with ``argv`` (``tiny`` replaces sizes
    for a quick try, and for the test that runs the command)."""

    name: str
    argv: tuple[str, ...]
    what: str
    tiny: tuple[str, ...] = ()


ROWS: tuple[Row, ...] = (
    Row(
        "files",
        ("ingest", "--source", "files", "--limit", "--skip-restore"),
        "800k lines, 80.7 MB, 2 regions; the limit is plain Arrow reading and writing the same "
        "files as parquet, warm workers (one per core, started before the clock)",
        ("--files", "2", "--lines", "300", "--repeat", "1"),
    ),
    Row(
        "kafka",
        ("ingest", "--source", "kafka", "--stall-messages", "0", "--limit"),
        "400k messages of 100 bytes, 8 partitions, P=4; the limit is plain confluent-kafka batch "
        "consumes written as parquet by Arrow, warm workers (one per core, started before the clock)",
        ("--messages", "2000", "--repeat", "1"),
    ),
    Row(
        "files-long-lived",
        ("ingest", "--source", "files", "--readers", "long_lived", "--limit", "--skip-restore"),
        "the files row with our `readers: long_lived` (one Spark job serves both epochs; the "
        "pipeline default is `per_epoch`, a job per epoch)",
        ("--files", "2", "--lines", "300", "--repeat", "1"),
    ),
    Row(
        "kafka-long-lived",
        ("ingest", "--source", "kafka", "--readers", "long_lived", "--stall-messages", "0", "--limit"),
        "the Kafka row with our `readers: long_lived`",
        ("--messages", "2000", "--repeat", "1"),
    ),
    Row(
        "files-8x-long-lived",
        (
            "ingest",
            "--source",
            "files",
            "--lines",
            "800000",
            "--readers",
            "long_lived",
            "--limit",
            "--skip-restore",
        ),
        "the files-long-lived row with 8 times the input (6.4M lines, 646 MB): the fixed costs of a run "
        "(tables, lease, five Delta commits an epoch, the reader job's start) weigh 8 times less",
        ("--files", "2", "--lines", "300", "--repeat", "1"),
    ),
    Row(
        "files-json",
        ("ingest", "--source", "files", "--decode", "json", "--skip-restore"),
        "800k JSON lines decoded into typed columns (baseline `from_json`, same schema)",
        ("--files", "2", "--lines", "300", "--repeat", "1"),
    ),
    Row(
        "kafka-json",
        ("ingest", "--source", "kafka", "--decode", "json", "--stall-messages", "0"),
        "400k JSON messages, the same schema, 8 partitions, P=4",
        ("--messages", "2000", "--repeat", "1"),
    ),
    Row(
        "files-upsert",
        (
            "ingest",
            "--source",
            "files",
            "--sink",
            "upsert",
            "--files",
            "8",
            "--lines",
            "50000",
            "--skip-restore",
        ),
        "400k keyed change records (20% updates, 2% deletes) into `sink.mode: upsert`; baseline "
        "`foreachBatch` + Delta `MERGE`",
        ("--files", "2", "--lines", "300", "--repeat", "1"),
    ),
)


@dataclass(frozen=True, slots=True)
class Measured:
    """What one row's run gave: its JSON result (None when the process failed) and the load."""

    row: Row
    command: str
    result: dict[str, Any] | None
    load_mean: float
    load_max: float
    seconds: float
    error: str = ""


Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run_bench(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """``python -m splitkeeper-tools bench ARGV --json``: stdout captured (its last line is the JSON),
    stderr (the benchmark's progress) passed through to ours."""
    return subprocess.run(
        [sys.executable, "-m", "splitkeeper_tools", "bench", *argv, "--json"],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        check=False,
    )


def measure(rows: Sequence[Row], *, tiny: bool, out: str, runner: Runner = _run_bench) -> list[Measured]:
    measured = []
    for i, row in enumerate(rows, 1):
        argv = (*row.argv, *(row.tiny if tiny else ()), "--out", out)
        command = "bench " + " ".join(row.argv)
        print(f"[bench table {i}/{len(rows)}] splitkeeper-tools {command}", file=sys.stderr, flush=True)
        started = time.monotonic()
        with LoadSampler() as sampler:
            done = runner(argv)
        load = sampler.figure
        seconds = round(time.monotonic() - started, 1)
        result: dict[str, Any] | None = None
        error = ""
        lines = (done.stdout or "").strip().splitlines()
        try:
            result = json.loads(lines[-1]) if lines else None
        except ValueError:
            result = None
        if result is None:
            error = f"exit {done.returncode}, no JSON result"
        elif done.returncode != 0:  # the benchmark's own checks (exactly-once, content) failed
            error = f"exit {done.returncode}: its checks failed (see its lines above)"
        print(
            f"[bench table {i}/{len(rows)}] done in {seconds:.0f} s, {load.text()}"
            + (f": {error}" if error else ""),
            file=sys.stderr,
            flush=True,
        )
        measured.append(
            Measured(row, command, result, round(load.mean, 1), round(load.max, 1), seconds, error)
        )
    return measured


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f} s"


def _per_core(result: dict[str, Any], cores: int) -> str:
    """Our records (messages) per second per core of this machine: the run's records over its
    median seconds, over the cores (every core is the run's: Spark's local[*] takes them all)."""
    records = result.get("records") or result.get("messages")
    seconds = result.get("ours_s")
    if not records or not seconds or cores < 1:
        return "-"
    return f"{float(records) / float(seconds) / cores:,.0f}"


def render(measured: Sequence[Measured], *, tiny: bool, when: datetime | None = None) -> str:
    """The table, between its markers (the first line says how and when it was made)."""
    when = when or datetime.now(UTC)
    cores = os.cpu_count() or 0
    sizes = " --tiny" if tiny else ""
    lines = [
        f"{BEGIN}: `splitkeeper-tools bench table{sizes} --write README.md`, {when:%Y-%m-%d}, {cores} cores; "
        "edits by hand are overwritten -->",
        "| benchmark | splitkeeper | Structured Streaming | ratio | ours, records/s per core "
        "| ours / Arrow limit | load (mean, max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in measured:
        r = m.result or {}
        label = f"`{m.command}`: {m.row.what}"
        if m.error:
            lines.append(f"| {label} | failed: {m.error} | | | | | {m.load_mean}, {m.load_max} |")
            continue
        limit = (
            f"{r['ours_over_limit']:.2f} (limit {_seconds(r.get('limit_s'))})"
            if "ours_over_limit" in r
            else ""
        )
        lines.append(
            f"| {label} | {_seconds(r.get('ours_s'))} | {_seconds(r.get('baseline_s'))} | "
            f"{float(r.get('ratio', 0)):.2f} | {_per_core(r, cores)} | {limit} | "
            f"{m.load_mean}, {m.load_max} |"
        )
    lines.append(END)
    return "\n".join(lines)


def replace_table(text: str, table: str, where: str = "README.md") -> str:
    """``text`` with the part between the markers (markers included) replaced by ``table``."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    found = pattern.findall(text)
    if len(found) != 1:
        raise InvalidParameterError(
            "--write",
            where,
            f"a file with exactly one '{BEGIN} ... {END}' block",
            hint=f"found {len(found)}; put the two marker lines where the table belongs",
        )
    return pattern.sub(lambda _: table, text)


def configure(parser: argparse.ArgumentParser) -> None:
    names = ",".join(r.name for r in ROWS)
    parser.add_argument("--only", default=None, help=f"comma-separated rows to run (default all: {names})")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, one repetition: a quick try")
    parser.add_argument("--write", default=None, help="replace the table between the markers in this file")
    parser.add_argument("--out", default="var/bench", help="where the benchmarks write their charts")


def _selected(only: str | None) -> list[Row]:
    if only is None:
        return list(ROWS)
    by_name: Mapping[str, Row] = {r.name: r for r in ROWS}
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise InvalidParameterError("--only", only, "comma-separated names of " + ", ".join(by_name))
    return [by_name[n] for n in names]


def run(args: argparse.Namespace, runner: Runner = _run_bench) -> int:
    rows = _selected(args.only)
    target = Path(args.write) if args.write else None
    if target is not None:  # refuse a file without its markers before measuring for minutes
        replace_table(target.read_text(encoding="utf-8"), "", str(target))
    measured = measure(rows, tiny=args.tiny, out=args.out, runner=runner)
    table = render(measured, tiny=args.tiny)
    if target is None:
        print(table)
    else:
        target.write_text(
            replace_table(target.read_text(encoding="utf-8"), table, str(target)), encoding="utf-8"
        )
        print(f"table of {len(measured)} rows written to {target}", file=sys.stderr)
    return 1 if any(m.error for m in measured) else 0
