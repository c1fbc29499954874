"""A bad split cannot hold the pipeline hostage (issue 19), through the CLI on real files and Delta.

- a file with a line that is not UTF-8 under ``decode.kind: text`` (a bad record): under the
  default ``on_split_failure`` (quarantine) a first run commits every other file; under
  ``stall`` a bounded run stops after ``max_consecutive_aborts`` aborted epochs in a row with
  a summary naming the split, and ``run --epochs N`` fails when none of its epochs completed;
- a partly read file deleted from the source is quarantined, and ``recover --drop`` forgets it
  (audited) with the restart checks green.

After each case the sink is checked against the input line by line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.report.page import parse

from .helpers import (
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    sink_rows,
    source_records,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark]

BAD_FILE = "part-00002.txt"


def _input_with_a_bad_line(input_dir: Path) -> str:
    """600 lines in 5 files; line 7 of one file is not UTF-8. Returns that file's split id."""
    names = write_input(input_dir, files=5, lines=120)
    assert len(names) == 5
    bad = input_dir / BAD_FILE
    lines = bad.read_bytes().split(b"\n")
    lines[7] = b"caf\xe9 latin-1, not utf-8"
    bad.write_bytes(b"\n".join(lines))
    return BAD_FILE


def _assert_sink(spark: Any, sink: Path, expected: dict[str, list[tuple[int, int, bytes]]]) -> None:
    """The sink holds exactly ``expected``: per split, these records (offset, next offset, line), in order."""
    got: dict[str, list[tuple[int, int, bytes | None]]] = {}
    for r in sorted(sink_rows(sink), key=lambda r: (r.split_id, r.offset)):
        got.setdefault(r.split_id, []).append((r.offset, r.next_offset, r.value))
    assert got == {sid: recs for sid, recs in expected.items() if recs}


def test_a_first_run_with_an_undecodable_file_commits_every_other_file_by_default(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 19: with the old default (stall) this run aborted every epoch: 0 of 600 records."""
    input_dir = tmp_path / "in"
    bad = _input_with_a_bad_line(input_dir)
    good = {sid: recs for sid, recs in source_records_lenient(input_dir).items() if sid != bad}
    mapping = pipeline_mapping(tmp_path, "firstrun", input_dir, parallelism=2)
    mapping["decode"] = {"kind": "text"}  # the raw default keeps the bytes; text makes them a bad record
    config = write_config(tmp_path / "p.yaml", mapping)

    code, out, err = run_cli(["run", "--config", str(config), "--epochs", "12", "--json"])
    assert code == 0, err
    result = json.loads(out)
    assert result["finished"] and result["quarantined"] == [bad]
    assert result["committed_records"] == 480
    assert f"split {bad} quarantined: reads failed 3 epochs in a row" in err
    _assert_sink(spark, tmp_path / "sink", good)  # every other file, line by line; nothing of the bad one

    # the operator takes the file out of the drop folder and drops its split: audited, checks green
    shutil.move(input_dir / bad, tmp_path / bad)
    code, out, err = run_cli(["recover", "--config", str(config), "--drop", bad, "--json"])
    assert code == 0, err
    assert json.loads(out)["dropped"] == [[bad, 0]]
    code, out, err = run_cli(["status", "--config", str(config), "--json"])
    assert code == 0 and json.loads(out)["latest_checkpoint"]["quarantined"] == {}, err
    code, out, err = run_cli(["validate", "--config", str(config)])
    assert code == 0, out + err
    assert_sink_equals_source(spark, tmp_path / "sink", input_dir)


def source_records_lenient(input_dir: Path) -> dict[str, list[tuple[int, int, bytes]]]:
    """:func:`source_records` of an input whose bad file is not UTF-8 (the lines' bytes)."""
    out: dict[str, list[tuple[int, int, bytes]]] = {}
    for path in sorted(input_dir.iterdir()):
        records, pos = [], 0
        for raw in path.read_bytes().splitlines(keepends=True):
            records.append((pos, pos + len(raw), raw.rstrip(b"\r\n")))
            pos += len(raw)
        out[path.name] = records
    return out


def test_under_stall_a_bounded_run_stops_with_a_summary_instead_of_looping(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 19: ``run`` looped through aborted epochs (107 in 120 s); ``--epochs 6`` exited 0."""
    input_dir = tmp_path / "in"
    bad = _input_with_a_bad_line(input_dir)
    mapping = pipeline_mapping(tmp_path, "stalled", input_dir, parallelism=2)
    mapping["decode"] = {"kind": "text"}
    mapping["checkpoint"]["on_split_failure"] = "stall"
    config = write_config(tmp_path / "p.yaml", mapping)

    code, out, err = run_cli(["run", "--config", str(config), "--epochs", "3"])
    assert code == 2 and out == "", out
    assert "[RUN_STALLED] pipeline 'stalled': none of the 3 epoch(s) this run was asked for completed" in err

    code, out, err = run_cli(["run", "--config", str(config), "--epochs", "20"])
    assert code == 2 and out == "", out
    (summary,) = [line for line in err.splitlines() if "[RUN_STALLED]" in line]  # one paragraph, one line
    assert "5 epochs in a row were aborted (epochs 4-8; checkpoint.max_consecutive_aborts=5)" in summary
    assert f"split '{bad}' (reads failed 5 epoch(s) in a row:" in summary
    assert "no checkpoint has completed yet" in summary
    assert "set checkpoint.on_split_failure: quarantine" in summary
    assert not (tmp_path / "sink" / "_delta_log").exists() or sink_rows(tmp_path / "sink") == []

    shutil.move(input_dir / bad, tmp_path / bad)  # the fix the summary asks for: the file goes
    code, out, err = run_cli(["run", "--config", str(config)])
    assert code == 0, err
    assert_sink_equals_source(spark, tmp_path / "sink", input_dir)


def test_a_partly_read_file_deleted_from_the_source_is_quarantined_then_dropped(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 19: ``[SOURCE_ERROR] ... does not exist any more`` on every run, no way to drop the split."""
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=120)
    before = source_records(input_dir)
    config = write_config(
        tmp_path / "p.yaml", pipeline_mapping(tmp_path, "deleted", input_dir, parallelism=2, epoch_records=60)
    )
    code, _out, err = run_cli(["run", "--config", str(config), "--epochs", "2"])
    assert code == 0, err
    gone = "part-00001.txt"
    read = [r for r in sink_rows(tmp_path / "sink") if r.split_id == gone]
    assert 0 < len(read) < len(before[gone])  # partly read
    (input_dir / gone).unlink()

    code, out, err = run_cli(["run", "--config", str(config), "--json"])
    assert code == 0, err
    result = json.loads(out)
    assert result["finished"] and result["quarantined"] == [gone]
    assert "does not exist any more" in err

    code, out, err = run_cli(["recover", "--config", str(config), "--release", gone, "--drop", gone])
    assert code == 2 and "a split not also given to --release" in err, err  # one or the other
    code, out, err = run_cli(["recover", "--config", str(config), "--drop", gone])
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("dropped:")]
    position = int(line.split(" at position ")[1].split()[0])
    assert position == max(r.next_offset for r in read)  # where its committed records end
    code, out, err = run_cli(["validate", "--config", str(config)])
    assert code == 0, out + err

    kept = [rec for rec in before[gone] if rec[1] <= position]  # what was read before the file went
    _assert_sink(spark, tmp_path / "sink", {**{s: r for s, r in before.items() if s != gone}, gone: kept})
    code, out, err = run_cli(["run", "--config", str(config), "--json"])  # nothing left, nothing re-read
    assert code == 0 and json.loads(out)["committed_records"] == 0, err
    code, out, err = run_cli(["report", "--config", str(config)])  # the report says it was dropped
    assert code == 0, err
    page = Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text(encoding="utf-8")
    (row,) = parse(page).rows("table-parked")
    assert row[0] == gone and row[4] == "-" and row[5].endswith(" (dropped)"), row
