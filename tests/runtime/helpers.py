"""Shared helpers of the end-to-end runtime tests (pipeline, crash, bad input).

- :func:`write_input`: tiny deterministic input files (``examples/make_files.py``, plain lines).
- :func:`pipeline_mapping` / :func:`write_config`: a file-source pipeline config (as a mapping
  for :func:`~splitkeeper.config.settings.config_from_mapping`, or a YAML file for the CLI).
- :func:`source_records`: the oracle, read from the input files independently of splitkeeper.
- :func:`assert_sink_equals_source`: the sink Delta table holds exactly the source: no
  duplicate ``(split_id, offset)``, the same ``(split_id, value)`` multiset, per split byte
  ranges contiguous from 0 to the file size (the core's ``check_sink_ranges``) and in file order.
- :func:`run_pipeline`: open (recover/restore), run and close a pipeline in this process, holding
  its lease (taken through :func:`splitkeeper.app.services.leased_pipeline`, as a run takes it).
- :func:`run_cli`: ``splitkeeper.cli.main`` in-process, returning (exit code, stdout, stderr).
- :func:`splitkeeper_subprocess`: ``splitkeeper ...`` in a child process with its own JVM.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from splitkeeper.core.invariants import check_sink_ranges
from splitkeeper.sinks.delta.read import read_sink

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / ".venv" / "bin" / "splitkeeper"
TOOLS_CLI = REPO / ".venv" / "bin" / "splitkeeper-tools"


def _make_files_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "splitkeeper_example_make_files", REPO / "examples" / "make_files.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_MAKE_FILES = _make_files_module()


def write_input(input_dir: Path, files: int = 3, lines: int = 120, first_file: int = 0) -> list[str]:
    """Write ``files`` plain-text files of ``lines`` lines (about 40 bytes each) into ``input_dir``."""
    return list(
        _MAKE_FILES.write_files(
            str(input_dir), files, lines, fmt="lines", line_bytes=40, seed=11, first_file=first_file
        )
    )


def source_records(input_dir: Path) -> dict[str, list[tuple[int, int, bytes]]]:
    """Per split id (file path relative to ``input_dir``): ``(offset, next_offset, line bytes)`` in file
    order (what the raw sink keeps).

    Computed from the bytes on disk without splitkeeper's reader: the test oracle.
    """
    out: dict[str, list[tuple[int, int, bytes]]] = {}
    for path in sorted(input_dir.rglob("*")):
        rel = path.relative_to(input_dir).as_posix()
        if not path.is_file() or any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        data = path.read_bytes()
        if not data:
            continue
        records = []
        pos = 0
        for raw in data.splitlines(keepends=True):
            records.append((pos, pos + len(raw), raw.rstrip(b"\r\n")))
            pos += len(raw)
        out[rel] = records
    return out


def pipeline_mapping(
    root: Path,
    name: str,
    input_dir: Path,
    *,
    parallelism: int = 3,
    epoch_records: int = 150,
    region_timeout_s: float = 15,
    max_consecutive_failures: int = 3,
    max_failure_ratio: float = 0.5,
    retain_checkpoints: int = 3,
) -> dict[str, Any]:
    """A file-source pipeline config mapping with state and sink under ``root``.

    ``epoch_records`` is the whole epoch's record budget (shared by the splits being read),
    so a few hundred lines take a few epochs.
    """
    return {
        "name": name,
        "parallelism": parallelism,
        "regions": "per_reader",
        "strategy": "least-loaded",
        "source": {"kind": "files", "path": str(input_dir), "format": "lines"},
        "checkpoint": {
            "max_consecutive_failures": max_consecutive_failures,
            "max_failure_ratio": max_failure_ratio,
            "region_timeout_s": region_timeout_s,
            "retain_checkpoints": retain_checkpoints,
        },
        "backlog": {"backlog_epoch_records": epoch_records, "normal_epoch_records": epoch_records},
        "state": {"path": str(root / "state")},
        "sink": {"path": str(root / "sink")},
    }


def iceberg_table(config: Any) -> Any:
    """The table of an Iceberg sink (``sink.kind: iceberg``) as pyiceberg reads it, through a catalog
    object of its own (not the sink's): the embedded SQL catalog, or the one ``sink.catalog`` names."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(config.sink.catalog_name, **config.sink.catalog_properties())
    return catalog.load_table(config.sink.table)


def write_config(path: Path, mapping: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(mapping), sort_keys=False), encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class SinkRow:
    split_id: str
    offset: int
    next_offset: int
    value: bytes | None
    epoch: int
    region: int


def sink_rows(sink_path: str | Path) -> list[SinkRow]:
    """Every record of the sink table (its current version, :func:`splitkeeper.sinks.delta.read.read_sink`);
    ``value`` as bytes (a raw sink's as stored, a text sink's strings as their UTF-8 bytes)."""
    columns = ["split_id", "offset", "next_offset", "value", "epoch", "region"]
    rows = read_sink(sink_path, columns).to_pylist()
    for row in rows:
        if isinstance(row["value"], str):
            row["value"] = row["value"].encode("utf-8")
    return [SinkRow(**row) for row in rows]


def assert_sink_equals_source(spark: Any, sink_path: str | Path, input_dir: Path) -> list[SinkRow]:
    """Assert the sink holds every input line exactly once, in per-split order; return its rows."""
    rows = sink_rows(sink_path)
    expected = source_records(input_dir)
    assert expected, f"no input under {input_dir}"

    keys = Counter((r.split_id, r.offset) for r in rows)
    duplicates = sorted(k for k, n in keys.items() if n > 1)
    assert not duplicates, (
        f"{len(duplicates)} (split_id, offset) pairs in the sink more than once: {duplicates[:5]}"
    )

    got_values = Counter((r.split_id, r.value) for r in rows)
    want_values = Counter((sid, value) for sid, recs in expected.items() for _o, _n, value in recs)
    missing = want_values - got_values
    extra = got_values - want_values
    assert not missing and not extra, (
        f"sink != source: {sum(missing.values())} records missing (e.g. {list(missing)[:3]}), "
        f"{sum(extra.values())} unexpected (e.g. {list(extra)[:3]})"
    )

    sizes = {sid: recs[-1][1] for sid, recs in expected.items()}
    violations = check_sink_ranges(
        ((r.split_id, r.offset, r.next_offset) for r in rows), dict.fromkeys(sizes, 0), sizes
    )
    assert violations == [], f"sink byte ranges are not exactly-once: {violations[:5]}"

    by_split: dict[str, list[tuple[int, int, bytes | None]]] = {}
    for r in sorted(rows, key=lambda r: (r.split_id, r.offset)):
        by_split.setdefault(r.split_id, []).append((r.offset, r.next_offset, r.value))
    for sid, recs in expected.items():
        assert by_split.get(sid) == recs, f"split {sid}: sink records differ from the file's lines in order"
    return rows


def run_pipeline(
    config: Any,
    spark: Any,
    epochs: int | None = None,
    faults: Iterable[str] = (),
    progress: Callable[[str], None] | None = None,
    *,
    until_caught_up: bool = False,
) -> Any:
    """Open (recover/restore), run and close a pipeline in this process; its ``RunSummary``.

    Used by the tests only: the lease is taken, and the pipeline assembled over it, by
    :func:`splitkeeper.app.services.leased_pipeline` (the services' own ``writer_lease``), on the
    tests' Spark session and without metrics; ``splitkeeper run`` is
    :func:`splitkeeper.app.services.run` (discovery, backlog reset, signals, a typed result)."""
    from splitkeeper.app.services import leased_pipeline

    with leased_pipeline(config, spark, faults=faults, progress=progress, metrics=False) as pipeline:
        pipeline.open()
        return pipeline.run(epochs, until_caught_up=until_caught_up)


def run_cli(argv: Sequence[str]) -> tuple[int, str, str]:
    """``splitkeeper <argv>`` in this process: (exit code, stdout, stderr)."""
    from splitkeeper.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of a child ``splitkeeper`` process: a small local Spark, no UI."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPLITKEEPER_CRASH_AT", "SPLITKEEPER_PAUSE_AT")}
    env.update(
        {
            "SPLITKEEPER_SPARK_MASTER": "local[2]",
            "SPLITKEEPER_SPARK_UI": "false",
            "SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS": "2",
            "SPLITKEEPER_SPARK_DRIVER_MEMORY": "768m",
            "PYSPARK_PYTHON": sys.executable,
        }
    )
    env.update(extra)
    return env


def splitkeeper_subprocess(
    argv: Sequence[str], *, timeout_s: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``splitkeeper <argv>`` in a child process (its own driver and JVM) and wait for it."""
    return subprocess.run(
        [str(CLI), *argv],
        env=subprocess_env(**env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def tools_subprocess(
    argv: Sequence[str], *, timeout_s: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``splitkeeper-tools <argv>`` (bench, chaos, ...) in a child process and wait for it."""
    return subprocess.run(
        [str(TOOLS_CLI), *argv],
        env=subprocess_env(**env),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def run_killed_at(config_path: Path, point: str, epoch: int) -> subprocess.CompletedProcess[str]:
    """``splitkeeper run`` in a child process that SIGKILLs itself at crash point ``point`` of
    ``epoch`` (``SPLITKEEPER_CRASH_AT``); asserts it died so, at that point, and returns it."""
    from splitkeeper.spark.faults import CRASH_ENV

    crashed = splitkeeper_subprocess(["run", "--config", str(config_path)], **{CRASH_ENV: f"{point}@{epoch}"})
    assert crashed.returncode == -9, f"expected SIGKILL, got {crashed.returncode}:\n{crashed.stderr[-3000:]}"
    assert f"crash injected at {point} of epoch {epoch}" in crashed.stderr
    return crashed
