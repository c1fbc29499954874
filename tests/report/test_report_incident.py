"""The report for an incident review (issue 23), from a real Delta state written without Spark:
lag per split, phase times, why each failed region failed, the ref chain, one report per run."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.report import REPORT_FILE, render_report
from splitkeeper.report.html import RUN_FILE, RUNS_DIR, RUNS_INDEX_FILE, run_folder_name, run_report

from .page import parse
from .states import DECLINE, PIPELINE, TIMEOUT, incident_state, phases_of


def test_report_shows_lag_phases_causes_and_ref_chain_and_keeps_one_report_per_run(tmp_path):
    end = 1000
    # run ids that sort opposite to their start: kept reports must still be ordered by start
    # time, even for two runs started within one second (as here)
    store = incident_state(tmp_path, checkpoints=10, end=end, regional_at=4, aborted_at=6, run_id="run-z")
    out = tmp_path / "reports" / PIPELINE

    first = render_report(store, out, title="Incident")
    first_run = run_report(first)  # what the Airflow report task returns: the page kept for this run

    page = parse(first.read_text(encoding="utf-8"))
    # lag: 9 completed checkpoints, region 1 (splits 1, 4, 7) declined at 4: 8 steps, the others 9
    expected = {f"orders-{i}": max(0, end - 10 * (i + 1) * (8 if i % 3 == 1 else 9)) for i in range(9)}
    live = {sid: lag for sid, lag in expected.items() if lag > 0}
    lag_rows = page.rows("table-lag")
    assert [r[0] for r in lag_rows] == sorted(live, key=lambda s: (-live[s], s))
    assert {r[0]: (int(r[2]) + int(r[4]), int(r[4]), r[5]) for r in lag_rows} == {
        sid: (end, lag, "yes") for sid, lag in live.items()
    }
    assert "chart-lag" in [a["id"] for a in page.all("svg")]
    # why regions failed: class, split, offset, first line; newest first
    assert page.rows("table-failures") == [
        ["6", "aborted", "2", "timeout", "Timeout", "-", "-", "no result within 12s"],
        ["4", "regional", "1", "decline", "SplitReadError", "orders-1", "120", "ValueError: not JSON"],
    ]
    timeline = {r[0]: r for r in page.rows("table-timeline")}
    assert timeline["4"][5] == DECLINE.line() and timeline["6"][5] == TIMEOUT.line()
    assert [r[0] for r in page.rows("table-timeline")] == [str(c) for c in range(10, 0, -1)]
    # phase times per checkpoint (the state commit measured by the store)
    phases = {r[0]: r for r in page.rows("table-phases")}
    assert phases["10"][2:5] == [str(phases_of(10)[p]) for p in ("plan", "read", "sink")]
    assert int(phases["10"][5]) >= 0 and "6" not in phases
    # the ref chain: checkpoint 10 is global, so the latest with a failed region is drawn
    assert page.rows("table-refs") == [["0", "4", "0"], ["1", "3", "1"], ["2", "4", "0"]]
    assert "Ref chain of checkpoint 4" in page.svg_titles

    # a second run adds a checkpoint: a second kept report, the first one stays
    latest = store.latest_checkpoint()
    assert latest is not None and latest.enumerator is not None
    second_run = DeltaStateStore(tmp_path / "state", PIPELINE, "files:/orders", run_id="run-a")
    nxt = replace(latest, checkpoint_id=11, enumerator=replace(latest.enumerator, checkpoint_id=11))
    second_run.commit_checkpoint(decision_for(nxt), phases_ms=phases_of(11))
    latest_page = render_report(second_run, out, title="Incident")

    runs = sorted((out / RUNS_DIR).iterdir())
    assert len(runs) == 2 and all((r / REPORT_FILE).is_file() for r in runs)
    assert first_run == runs[0] / REPORT_FILE and run_report(latest_page) == runs[1] / REPORT_FILE
    assert [json.loads((r / RUN_FILE).read_text())["run_id"] for r in runs] == [
        store.run_id,
        second_run.run_id,
    ]
    assert json.loads((runs[0] / RUN_FILE).read_text())["checkpoint_id"] == 10
    assert ">11<" not in (runs[0] / REPORT_FILE).read_text(encoding="utf-8").split("table-timeline")[1][:400]
    index = parse((out / RUNS_INDEX_FILE).read_text(encoding="utf-8"))
    rows = index.rows("table-runs")
    assert [r[1] for r in rows] == [second_run.run_id, store.run_id]  # newest first
    assert [(r[2], r[4]) for r in rows] == [("1", "11"), ("10", "10")]
    hrefs = [a["href"] for a in index.all("a") if a["href"].startswith(RUNS_DIR)]
    assert hrefs == [f"{RUNS_DIR}/{runs[1].name}/{REPORT_FILE}", f"{RUNS_DIR}/{runs[0].name}/{REPORT_FILE}"]
    assert parse((out / REPORT_FILE).read_text(encoding="utf-8")).rows("table-timeline")[0][0] == "11"

    render_report(second_run, out, title="Incident", keep_runs=1)  # bounded: the oldest goes
    assert [r.name for r in sorted((out / RUNS_DIR).iterdir())] == [runs[1].name]


def test_kept_run_folders_sort_by_start_even_within_one_second():
    """Two runs started 1 ms apart whose ids sort the other way: the folder names (which order the
    runs index and decide what pruning removes) follow the start times."""
    first = datetime(2026, 11, 27, 17, 35, 22, 100_000, tzinfo=UTC)
    names = [run_folder_name("run-z", first), run_folder_name("run-a", first + timedelta(milliseconds=1))]
    assert sorted(names) == names
    assert run_folder_name("a/b c", first) == "20261127T173522.100000Z-a_b_c"
