"""``splitkeeper-tools bench table``: one command regenerates the README's speed table, with the load.

The cheap tests check what the command refuses before it measures anything, and how a failed
row shows; the slow variant runs the real command (a tiny files benchmark in a fresh process)
against a copy of the README and checks the table it wrote there.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from splitkeeper_tools import cli
from splitkeeper_tools.bench import table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_has_exactly_one_table_block_the_command_can_replace() -> None:
    text = README.read_text(encoding="utf-8")
    replaced = table.replace_table(text, "NEW TABLE")
    assert replaced.count("NEW TABLE") == 1 and table.BEGIN not in replaced
    before, after = text.split(table.BEGIN)[0], text.split(table.END)[1]
    assert replaced == before + "NEW TABLE" + after  # nothing else of the README changes


def test_a_file_without_the_markers_and_an_unknown_row_are_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "notes.md"
    plain.write_text("# notes\n", encoding="utf-8")
    assert cli.main(["bench", "table", "--write", str(plain)]) == 2
    err = capsys.readouterr().err
    assert "[INVALID_PARAMETER]" in err and "found 0" in err and str(plain) in err
    assert plain.read_text(encoding="utf-8") == "# notes\n"
    assert cli.main(["bench", "table", "--only", "files,parquet"]) == 2
    assert (
        "--only='files,parquet' is not allowed: comma-separated names of files, kafka"
        in capsys.readouterr().err
    )


def test_a_row_whose_benchmark_fails_says_so_and_the_command_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A benchmark process that exits 1 (its exactly-once checks failed) is a failed row, never a
    figure: the runner here is a real process that prints a result and exits 1."""

    def failing(argv: list[str]) -> subprocess.CompletedProcess[str]:
        result = "{'ours_s': 1.0, 'baseline_s': 2.0, 'ratio': 2.0}"
        code = f"import json; print(json.dumps({result})); raise SystemExit(1)"
        return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, check=False)

    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{table.BEGIN} -->\nold\n{table.END}\nafter\n", encoding="utf-8")
    parser = argparse.ArgumentParser()
    table.configure(parser)
    options = parser.parse_args(
        ["--only", "kafka", "--write", str(readme), "--out", str(tmp_path / "charts")]
    )
    assert table.run(options, runner=failing) == 1
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("before\n") and text.endswith("\nafter\n") and "old" not in text
    row = next(line for line in text.splitlines() if line.startswith("| `bench ingest --source kafka"))
    assert "failed: exit 1: its checks failed" in row and "2.00" not in row


@pytest.mark.spark
@pytest.mark.slow_variant
def test_the_command_runs_the_benchmark_and_writes_its_figures_and_load_into_the_readme(
    tmp_path: Path,
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README.read_text(encoding="utf-8"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "splitkeeper_tools", "bench", "table", "--only", "files", "--tiny",
         "--write", str(readme), "--out", str(tmp_path / "charts")],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[bench table 1/1] splitkeeper-tools bench ingest --source files --limit" in done.stderr
    block = readme.read_text(encoding="utf-8").split(table.BEGIN)[1].split(table.END)[0]
    rows = [line for line in block.splitlines() if line.startswith("| `bench")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    ours, baseline, ratio, per_core, limit, load = cells[1:]
    assert re.fullmatch(r"\d+\.\d\d s", ours) and re.fullmatch(r"\d+\.\d\d s", baseline)
    expected = float(baseline.split()[0]) / float(ours.split()[0])
    assert abs(float(ratio) - expected) <= 0.02 * expected + 0.01  # the rates' ratio: the seconds' inverse
    assert re.fullmatch(r"\d+\.\d\d \(limit \d+\.\d\d s\)", limit)
    # records per second per core: the tiny run's records over its seconds over the cores
    records = 2 * 300  # the files row's --tiny: --files 2 --lines 300
    want = records / float(ours.split()[0]) / (os.cpu_count() or 1)
    assert abs(float(per_core.replace(",", "")) - want) <= 0.02 * want + 1
    assert re.fullmatch(r"\d+\.\d, \d+\.\d", load)
    assert "--tiny" in block.splitlines()[0]
