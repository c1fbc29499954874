"""The main job (``bash scripts/run.sh`` runs ``python -m splitkeeper_tools.demo``) tells its story.

The demo itself runs end to end in a fresh process (real Airflow DAG runs on SQLite, local
Spark and Delta, its own Kafka broker), with small data: by default its output is the
narrative only, under 120 lines, and its last line is ``report: <path>``; everything else
is in ``<workspace>/demo.log``. The live progress display is checked on a pseudo-terminal
stand-in; off a terminal the story lines carry no escape codes.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitkeeper_tools import demo


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_story_is_plain_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    story = demo._Narrative()
    story.out = io.StringIO()
    with story.working("DAG run splitkeeper_ingest"):
        story.say("checkpoint 3 regional, failed regions [1]")
    text = story.out.getvalue()
    assert "\x1b" not in text
    assert text.endswith("] checkpoint 3 regional, failed regions [1]\n") and text.count("\n") == 1


def test_on_a_terminal_a_live_spinner_counts_seconds_and_story_lines_print_above_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    story = demo._Narrative()
    story.out = _Terminal()
    with story.working("DAG run splitkeeper_ingest"):
        story.say("checkpoint 1 global")
        time.sleep(1.2)
    text = story.out.getvalue()
    assert "DAG run splitkeeper_ingest (1s)" in text  # the elapsed seconds tick
    assert "checkpoint 1 global\n" in text
    assert text.index("checkpoint 1 global") < text.rindex("(1s)")  # the display stays below the story
    assert story.console is None  # story lines are plain again after the step


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.airflow
def test_the_demo_prints_only_its_story_and_ends_with_the_report_line(tmp_path: Path) -> None:
    workspace = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("AIRFLOW_HOME", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "splitkeeper_tools.demo",
            "--workspace",
            str(workspace),
            "--lines",
            "200",
            "--messages",
            "400",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        check=False,
    )
    log = workspace / "demo.log"
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:], log.read_text()[-5000:])
    lines = (run.stdout + run.stderr).splitlines()
    assert len(lines) < 120, "\n".join(lines)
    last = run.stdout.splitlines()[-1]
    assert last.startswith("report: ") and Path(last.removeprefix("report: ")).is_file()
    story = run.stdout
    assert "failed regions [1]" in story  # the injected fault, one line
    assert "splitkeeper_recover" in story and "restart checks passed" in story
    assert "  split " in story  # the rescale's per-split recovery decisions, a few lines
    assert "rewind plan to checkpoint 1:" in story and "(dry run: nothing written)" in story
    assert "rewound: state and sink are checkpoint 1's again" in story
    assert "Traceback" not in story + run.stderr  # tracebacks of injected faults stay in the log
    # the stream's change events are decoded into typed columns, transformed on Spark and upserted
    # into a keyed table; its 5 malformed messages are the dead letters
    assert "decoded into typed columns (id BIGINT, op STRING, seq BIGINT" in story
    assert "transformed on Spark (splitkeeper.transforms:amount_cents)" in story
    assert "5 dead letters, 0 lost, 0 duplicated" in story
    keyed = re.search(r"keyed table \S+: (\d+) orders from (\d+) upserts .* and (\d+) deletes", story)
    assert keyed is not None, story
    orders, upserts, deletes = (int(g) for g in keyed.groups())
    assert 0 < orders < upserts and deletes > 0
    assert "it equals the latest event of every order" in story
    assert (
        f"dead letters: 5 malformed messages (errors.tolerance all) are in the Delta table {workspace}"
        in story
    )
    assert "stage decode" in story
    assert log.is_file() and log.stat().st_size > 10 * len(story)  # Airflow, Spark: in the log
