"""The HTML run report: structure of a report rendered from a real small Delta state."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from splitkeeper.core.types import (
    AuditRecord,
    BacklogSnapshot,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.errors import InvalidParameterError
from splitkeeper.report import REPORT_FILE, render_html, render_report
from splitkeeper.report.charts import axis_scale
from splitkeeper.report.data import AuditRow, CheckpointFacts, ReportData
from splitkeeper.report.html import INDEX_FILE, RUNS_DIR, RUNS_INDEX_FILE, SUMMARY_FILE, render_index
from splitkeeper.sinks.delta.read import DeltaSinkReader

from .page import parse

SPLITS = [f"events-{i}" for i in range(6)]
SINK_SCHEMA = "split_id STRING, offset BIGINT, next_offset BIGINT, value STRING, epoch BIGINT, region INT"


def _split(i: int, position: int) -> Split:
    return Split(SPLITS[i], "events", position, backlog_end=100)


def _checkpoint(
    cid: int,
    readers: dict[int, tuple[int, ...]],
    position: int,
    *,
    backlog_done: int,
    failed: dict[int, int] | None = None,
) -> CompletedCheckpoint:
    failed = failed or {}
    assignments = {r: tuple(_split(i, position) for i in ids) for r, ids in readers.items()}
    regions = {}
    for r, splits in assignments.items():
        if r in failed:
            regions[r] = RegionState(r, splits, (f"r{r}",), failed[r], RegionOutcome.DECLINE, 1)
        else:
            regions[r] = RegionState(r, splits, (f"r{r}@{cid}",))
    backlog = BacklogSnapshot(
        boundaries=dict.fromkeys(SPLITS, 100), finished=frozenset(SPLITS[:backlog_done])
    )
    return CompletedCheckpoint(
        checkpoint_id=cid,
        kind=CheckpointKind.REGIONAL if failed else CheckpointKind.GLOBAL,
        parallelism=len(readers),
        regions=regions,
        enumerator=EnumeratorSnapshot(
            cid, len(readers), (), assignments, frozenset(), frozenset({"events"}), backlog
        ),
        consecutive_regional=1 if failed else 0,
        processing_backlog=backlog_done < len(SPLITS),
    )


@pytest.fixture(scope="module")
def small_state(spark, tmp_path_factory):
    """Five checkpoint attempts of a 3-reader pipeline: a skewed start, a rebalance, a regional
    checkpoint (region 2 declined), an aborted attempt, then global ones; backlog done at 5."""
    from pyspark.sql import functions as F

    from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for

    root = tmp_path_factory.mktemp("report-state")
    store = DeltaStateStore(root / "state", "events-pipeline", "files:/events")
    skewed = {0: (0, 1, 2, 3), 1: (4,), 2: (5,)}
    balanced = {0: (0, 1), 1: (4, 2), 2: (5, 3)}
    store.commit_checkpoint(
        decision_for(
            _checkpoint(1, skewed, 10, backlog_done=0),
            [
                AuditRecord(SPLITS[i], r, RecoveryDecision.ASSIGNED, 1)
                for r, ids in skewed.items()
                for i in ids
            ],
        )
    )
    store.commit_checkpoint(
        decision_for(
            _checkpoint(2, balanced, 20, backlog_done=2),
            [
                AuditRecord(SPLITS[2], 1, RecoveryDecision.REBALANCED, 2, "from reader 0"),
                AuditRecord(SPLITS[3], 2, RecoveryDecision.REBALANCED, 2, "from reader 0"),
            ],
        )
    )
    store.commit_checkpoint(
        decision_for(
            _checkpoint(3, balanced, 30, backlog_done=4, failed={2: 2}),
            [AuditRecord(SPLITS[5], 2, RecoveryDecision.RETURNED_PARTIAL_FAILOVER, 3, "region 2 declined")],
        )
    )
    store.log_attempt(
        4, {0: RegionOutcome.ACK, 1: RegionOutcome.TIMEOUT, 2: RegionOutcome.ACK}, "forced global failed"
    )
    store.commit_checkpoint(decision_for(_checkpoint(5, balanced, 40, backlog_done=6)))
    sink = str(root / "sink")
    rows = [
        (SPLITS[i], o, o + 1, "x", epoch, r)
        for epoch, readers in ((1, skewed), (2, balanced), (3, balanced), (5, balanced))
        for r, ids in readers.items()
        if not (epoch == 3 and r == 2)
        for i in ids
        for o in range(epoch * 10 - 10, epoch * 10)
    ]
    spark.createDataFrame(rows, SINK_SCHEMA).withColumn("ingested_at", F.current_timestamp()).write.format(
        "delta"
    ).save(sink)
    return store, sink, root


@pytest.mark.spark
def test_report_from_a_small_state_has_every_chart_with_a_table_beside_it(small_state, tmp_path):
    store, sink, root = small_state
    docs = root / "docs" / "index.html"
    docs.parent.mkdir(exist_ok=True)
    docs.write_text("<html>data docs</html>")

    path = render_report(
        store,
        tmp_path / "out",
        sink=DeltaSinkReader(str(sink), store.pipeline_name),
        title="Events run report",
        data_docs_index=docs,
    )

    assert path == (tmp_path / "out" / REPORT_FILE).resolve()
    html = path.read_text(encoding="utf-8")
    page = parse(html)
    svg_ids = [a["id"] for a in page.all("svg")]
    assert svg_ids == [
        "chart-loads",
        "chart-timeline",
        "chart-refs",
        "chart-lag",
        "chart-backlog",
        "chart-decisions",
        "chart-phases",
        "chart-records",
    ]
    for a in page.all("svg"):
        assert a["role"] == "img" and a["aria-labelledby"] == f"{a['id']}-title {a['id']}-desc"
    assert page.svg_titles[:1] == ["Per-reader load before and after rebalance"]
    for title in (
        "Checkpoint timeline",
        "Backlog progress",
        "Recovery decisions",
        "Checkpoint phase times",
        "Records committed per checkpoint",
        "Ref chain of checkpoint 3",
        "Lag per split over checkpoints",
    ):
        assert title in page.svg_titles
    assert len(page.all("figure")) == 8 and len(page.all("figcaption")) == 8
    assert html.count('class="axis-label"') >= 10  # x and y axis of every chart with axes

    # loads: before = checkpoint 1 (skewed), after = checkpoint 2 (the rebalance)
    assert page.rows("table-loads") == [["0", "4", "2", "-2"], ["1", "1", "2", "1"], ["2", "1", "2", "1"]]
    assert "2 split move(s) recorded with checkpoint 2" in html

    # timeline: one mark per attempt, kinds and the failed region with its ref
    marks = page.all("g", **{"class": "mark"})
    assert [(m["data-checkpoint"], m["data-kind"]) for m in marks] == [
        ("1", "global"),
        ("2", "global"),
        ("3", "regional"),
        ("4", "aborted"),
        ("5", "global"),
    ]
    timeline = page.rows("table-timeline")[::-1]  # newest first
    assert timeline[2][:4] == ["3", "regional", "2 (decline)", "region 2 → 2"]
    assert timeline[3][:3] == ["4", "aborted", "1 (timeout)"]
    assert timeline[3][5] == "forced global failed"  # no cause recorded: the attempt's reason
    assert "→2" in html

    # backlog: 6, 4, 2, 0 splits in backlog; switch to normal at checkpoint 5
    assert page.rows("table-backlog") == [
        ["1", "6", "backlog"],
        ["2", "4", "backlog"],
        ["3", "2", "backlog"],
        ["5", "0", "normal"],
    ]
    assert "Switched from backlog to the normal interval at checkpoint 5." in html
    assert len(page.all("line", **{"class": "switch"})) == 1

    # decisions: counts and the trail
    assert page.rows("table-decision-counts") == [
        ["assigned", "6"],
        ["rebalanced", "2"],
        ["returned_partial_failover", "1"],
    ]
    assert len(page.rows("table-audit")) == 9

    # commit time per completed checkpoint, records per epoch (region 2 of epoch 3 not committed)
    assert [r[0] for r in page.rows("table-phases")] == ["5", "3", "2", "1"]  # newest first
    records = {(r[0], r[1]): r[2] for r in page.rows("table-records")}
    assert records[("1", "0")] == "40" and ("3", "2") not in records and records[("5", "2")] == "20"

    # link to the Data Docs, relative to the report; nothing fetched from the network
    [link] = page.all("a", id="data-docs-link")
    assert link["href"] == "../../docs/index.html" or (path.parent / link["href"]).resolve() == docs.resolve()
    assert (path.parent / link["href"]).resolve() == docs.resolve()
    assert "<script" not in html and "<link" not in html
    assert all(not a.get("src", "").startswith("http") for _, a in page.elements)
    assert {a.get("lang") for a in page.all("html")} == {"en"}
    assert "Events run report" in page.captions or "Events run report" in html


@pytest.mark.spark
def test_rendering_twice_replaces_the_report_and_without_sink_omits_the_records_section(
    small_state, tmp_path
):
    store, _sink, _root = small_state
    out = tmp_path / "orders"
    first = render_report(store, out, title="first")
    second = render_report(store, out, title="second")

    assert first == second
    html = second.read_text(encoding="utf-8")
    assert "<title>second</title>" in html
    assert 'id="chart-records"' not in html
    assert "not built for this report" in html
    assert sorted(p.name for p in out.iterdir()) == [RUNS_INDEX_FILE, REPORT_FILE, RUNS_DIR, SUMMARY_FILE]
    assert len(list((out / RUNS_DIR).iterdir())) == 1  # one run wrote the state: one kept report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["orders", INDEX_FILE]


@pytest.mark.spark
def test_the_pipelines_page_lists_every_pipeline_reporting_into_the_folder_escaped(small_state, tmp_path):
    store, _sink, _root = small_state
    report = render_report(store, tmp_path / "orders", title="orders")
    other = tmp_path / "clicks"
    other.mkdir()
    (other / SUMMARY_FILE).write_text(
        json.dumps({"name": "<b>clicks</b>", "state": "/s/clicks", "checkpoint_id": None, "kind": None,
                    "parallelism": None, "generated_at": "2026-01-01T00:00:00+00:00"}),
        encoding="utf-8",
    )  # fmt: skip

    page = render_index(tmp_path).read_text(encoding="utf-8")

    parsed = parse(page)
    rows = parsed.rows("table-pipelines")
    summary = json.loads((report.parent / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert rows == [
        ["<b>clicks</b>", "/s/clicks", "-", "-", "-", "-"],
        [summary["name"], summary["state"], str(summary["checkpoint_id"]), summary["kind"],
         str(summary["parallelism"]), "report"],
    ]  # fmt: skip
    assert "&lt;b&gt;clicks&lt;/b&gt;" in page and "<b>clicks</b>" not in page  # autoescaped
    assert 'href="orders/report.html"' in page


def test_an_empty_pipeline_renders_with_explanations_instead_of_charts_of_nothing():
    data = ReportData(
        pipeline="fresh",
        state_root="/state",
        generated_at=datetime(2025, 1, 1, tzinfo=UTC),
        timeline=(),
        checkpoints=(),
        audit=(),
    )
    page = parse(render_html(data, title="Fresh"))

    assert len(page.all("svg")) == 6  # loads, timeline, lag, backlog, decisions, phases (no ref chain)
    assert "no completed checkpoint yet" in "".join(page.text)
    assert page.rows("table-decision-counts") == [["none"]]


def test_title_must_not_be_empty(tmp_path):
    with pytest.raises(InvalidParameterError, match="title"):
        render_report(None, tmp_path, title=" ")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, (1.0, 1.0)),
        (4, (4.0, 1.0)),
        (6, (6.0, 2.0)),
        (9, (10.0, 5.0)),
        (220, (300.0, 100.0)),
        (4550, (6000.0, 2000.0)),
    ],
)
def test_axis_ticks_are_round_steps_covering_the_data(value, expected):
    assert axis_scale(value) == expected


def _facts(cid: int, loads: dict[int, int]) -> CheckpointFacts:
    return CheckpointFacts(cid, CheckpointKind.GLOBAL, len(loads), False, 30, 0, loads)


def test_every_rescale_and_rebalance_gets_its_before_and_after_loads():
    checkpoints = (
        _facts(1, {0: 6, 1: 0, 2: 0, 3: 0}),
        _facts(2, {0: 2, 1: 2, 2: 1, 3: 1}),  # rebalance: 4 moves
        _facts(3, {0: 2, 1: 2, 2: 1, 3: 1}),
        _facts(4, {0: 3, 1: 3}),  # rescale 4 -> 2 (recover --parallelism 2)
        _facts(5, {0: 3, 1: 3}),
    )
    audit = tuple(AuditRow(2, i, SPLITS[i], 1 + i % 3, "rebalanced", "from reader 0") for i in range(4))
    audit += tuple(AuditRow(4, i, SPLITS[i], i % 2, "redistributed_global_restore", "") for i in range(6))
    data = ReportData(
        pipeline="p",
        state_root="/s",
        generated_at=datetime(2025, 1, 1, tzinfo=UTC),
        timeline=(),
        checkpoints=checkpoints,
        audit=audit,
    )

    changes = data.load_changes()
    assert [(c.before.checkpoint_id, c.after.checkpoint_id) for c in changes] == [(1, 2), (3, 4)]
    assert changes[1].reason == (
        "rescale from parallelism 4 to 2 and 6 split move(s) recorded with checkpoint 4"
    )
    page = parse(render_html(data, title="t"))
    # the latest change first (the rescale), then the earlier rebalance
    assert [a["id"] for a in page.all("svg")][:2] == ["chart-loads", "chart-loads-at-2"]
    assert page.rows("table-loads") == [
        ["0", "2", "3", "1"],
        ["1", "2", "3", "1"],
        ["2", "1", "0", "-1"],
        ["3", "1", "0", "-1"],
    ]
    assert page.rows("table-load-changes") == [
        ["2", "4 split move(s)", "0-6 over 4", "1-2 over 4"],
        ["4", "rescale from parallelism 4 to 2 and 6 split move(s)", "1-2 over 4", "3-3 over 2"],
    ]


def test_quarantined_splits_get_a_section_with_error_position_and_release():
    audit = (
        AuditRow(3, 0, "orders-1", 1, "quarantined", "reads failed 2 epochs in a row: bad json at 120"),
        AuditRow(6, 0, "orders-1", None, "released", "put back by recover --release"),
        AuditRow(7, 0, "orders-4", 0, "quarantined", "reads failed 2 epochs in a row: file vanished"),
    )
    data = ReportData(
        pipeline="p",
        state_root="/s",
        generated_at=datetime(2025, 1, 1, tzinfo=UTC),
        timeline=(),
        checkpoints=(_facts(7, {0: 1, 1: 2}),),
        audit=audit,
        parked_positions={"orders-4": 96},
    )
    page = parse(render_html(data, title="t"))
    assert page.rows("table-parked") == [
        ["orders-1", "3", "1", "reads failed 2 epochs in a row: bad json at 120", "-", "6"],
        ["orders-4", "7", "0", "reads failed 2 epochs in a row: file vanished", "96", "-"],
    ]
    assert "1 split(s) parked now" in "".join(page.text)
    # no quarantine in the history: no section
    plain = ReportData("p", "/s", datetime(2025, 1, 1, tzinfo=UTC), (), (_facts(1, {0: 1}),), ())
    assert "table-parked" not in render_html(plain, title="t")


def test_dead_letters_get_a_section_per_split_and_stage_with_the_first_errors(tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    from splitkeeper.delta.schemas import DEAD_LETTER_SCHEMA
    from splitkeeper.report.data import read_dead_letter_facts

    now = datetime(2025, 1, 1, tzinfo=UTC)
    bad = [("b", 9, "decode", 2), ("a", 4, "schema", 1), ("a", 1, "decode", 1), ("a", 7, "transform", 2)]
    rows = [
        {
            "split_id": sid,
            "offset": o,
            "next_offset": o + 1,
            "value": b"\xff",
            "stage": stage,
            "error_class": "ValueError",
            "error_message": f"bad <{o}>",
            "epoch": epoch,
            "region": 0,
            "attempt_id": "a",
            "failed_at": now,
        }
        for sid, o, stage, epoch in bad
    ]
    write_deltalake(str(tmp_path / "dead"), pa.Table.from_pylist(rows, DEAD_LETTER_SCHEMA))
    facts = read_dead_letter_facts(_dead_letters(tmp_path / "dead"), first=3)
    assert (facts.total, facts.per_split) == (4, (("a", 3), ("b", 1)))
    assert facts.per_stage == (("decode", 2), ("schema", 1), ("transform", 1))
    assert [f[:3] for f in facts.first] == [("a", 1, "decode"), ("a", 4, "schema"), ("a", 7, "transform")]
    data = ReportData(
        pipeline="p",
        state_root="/state",
        generated_at=now,
        timeline=(),
        checkpoints=(),
        audit=(),
        dead_letters=facts,
    )
    html = render_html(data, title="P")
    page = parse(html)
    assert "chart-dead-letters" in [a["id"] for a in page.all("svg")]
    assert page.rows("table-dead-stages") == [["decode", "2"], ["schema", "1"], ["transform", "1"]]
    assert page.rows("table-dead-splits") == [["a", "3"], ["b", "1"]]
    assert page.rows("table-dead-first")[0] == ["a", "1", "decode", "ValueError", "bad <1>"]
    assert "bad &lt;1&gt;" in html  # escaped
    empty = read_dead_letter_facts(_dead_letters(tmp_path / "none"))
    assert (empty.total, empty.first) == (0, ())


def _dead_letters(path: Any) -> DeltaSinkReader:
    """The reader of a sink whose dead letters are at ``path`` (what the report reads them through)."""
    return DeltaSinkReader(str(path.parent / "sink"), "p", dead_letter_path=str(path))
