"""The run report: one self-contained HTML file with inline SVG charts and tables.

The page is a Jinja2 template (``templates/report.html.j2``, autoescaped); this module
prepares what it shows: sections of figures and tables.

:func:`render_report` is what the Airflow report task and ``splitkeeper`` commands call
after a run: it reads the state (:func:`splitkeeper.report.data.collect_report_data`)
and writes ``<out_dir>/report.html``. The file needs no network and no script: charts
are inline SVG generated here (:mod:`splitkeeper.report.charts`), each with a title, a
description, axis labels, a legend and a table of the same numbers beside it.
Rendering again overwrites the file (written to a temporary name, then renamed).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from splitkeeper.core.failures import PHASES
from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.delta.history import TimelineEntry
from splitkeeper.errors import InvalidParameterError
from splitkeeper.report import charts
from splitkeeper.report.data import (
    CheckpointFacts,
    LoadComparison,
    ParkedSplit,
    ReportData,
    collect_report_data,
)

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sinks.port import SinkReader

_T = TypeVar("_T")

REPORT_FILE = "report.html"
SUMMARY_FILE = "summary.json"  # beside each report: what the pipelines page lists
INDEX_FILE = "pipelines.html"  # in the reports folder: every pipeline reporting there
RUNS_DIR = (
    "runs"  # beside report.html: runs/<run start, UTC, to the µs>-<run id>/report.html, one per run, kept
)
RUN_FILE = "run.json"  # beside each kept run report: what the runs index lists
RUNS_INDEX_FILE = "index.html"  # beside report.html: the kept run reports, newest first
#: Run reports kept per pipeline; rendering one more removes the oldest.
KEEP_RUN_REPORTS = 100
AUDIT_ROWS_SHOWN = 200
#: Bounds that keep the page small however long the history (10,000 checkpoints: see the tests):
#: the timeline draws the latest TIMELINE_WINDOW attempts cell by cell and counts the older ones in at
#: most TIMELINE_BUCKETS buckets; per-checkpoint charts draw the latest CHART_WINDOW checkpoints;
#: per-checkpoint tables list the latest TABLE_ROWS rows (each caption says "latest N of M").
TIMELINE_WINDOW = 60
TIMELINE_BUCKETS = 40
CHART_WINDOW = 60
TABLE_ROWS = 200
#: Splits drawn in the lag chart (those with most lag at the latest checkpoint).
LAG_SPLITS_DRAWN = 6

_CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, 'Segoe UI', Roboto, 'DejaVu Sans', sans-serif;
       margin: 0; color: #1f2328; background: #f6f8fa; line-height: 1.45; }
header { background: #0b3d63; color: #fff; padding: 18px 28px; }
header h1 { margin: 0 0 4px 0; font-size: 24px; }
header p { margin: 0; opacity: .9; }
header a { color: #fff; }
main { padding: 8px 28px 40px; max-width: 1500px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; margin: 18px 0;
          padding: 6px 20px 16px; }
h2 { font-size: 19px; margin: 12px 0 4px; }
p.lead { margin: 2px 0 12px; color: #424a53; }
.pair { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
figure { margin: 0; }
figcaption { font-size: 13px; color: #424a53; max-width: 560px; }
.tablebox { max-height: 340px; overflow: auto; border: 1px solid #d0d7de; border-radius: 6px; }
table { border-collapse: collapse; font-size: 13px; min-width: 260px; }
caption { text-align: left; font-weight: 600; padding: 6px 8px; background: #f6f8fa; }
th, td { border-bottom: 1px solid #eaeef2; padding: 4px 10px; text-align: left; }
th { background: #f6f8fa; position: sticky; top: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
dl.summary { display: grid; grid-template-columns: max-content auto; gap: 4px 16px; margin: 10px 0; }
dl.summary dt { font-weight: 600; }
dl.summary dd { margin: 0; }
.kind-global { color: #006b4f; font-weight: 600; }
.kind-regional { color: #8a5a00; font-weight: 600; }
.kind-aborted { color: #a33f00; font-weight: 600; }
"""


# ---------------------------------------------------------------------------------------
# the pieces a template renders (templates/report.html.j2)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Table:
    id: str
    caption: str
    headers: Sequence[str]
    rows: list[Sequence[object]]
    numeric: set[int]


@dataclass(frozen=True, slots=True)
class _Figure:
    svg: Markup
    caption: str


@dataclass(frozen=True, slots=True)
class _Section:
    id: str
    heading: str
    lead: str
    figures: tuple[_Figure, ...] = ()
    tables: tuple[_Table, ...] = ()


def _table(
    table_id: str, caption: str, headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: set[int]
) -> _Table:
    return _Table(table_id, caption, headers, list(rows), numeric)


def _kind(kind: str) -> Markup:
    return Markup('<span class="kind-{0}">{0}</span>').format(kind)


def _figure(svg: str, caption: str) -> _Figure:
    return _Figure(Markup(svg), caption)  # the charts module builds the SVG and escapes its text


def _section(section_id: str, heading: str, lead: str, *parts: _Figure | _Table) -> _Section:
    return _Section(
        section_id,
        heading,
        lead,
        tuple(p for p in parts if isinstance(p, _Figure)),
        tuple(p for p in parts if isinstance(p, _Table)),
    )


@functools.cache
def _templates() -> Environment:
    """The report templates (package data), autoescaped."""
    return Environment(
        loader=PackageLoader("splitkeeper.report", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )


# ---------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------


#: Earlier rescales/rebalances drawn as their own chart below the latest one (the table lists all).
LOAD_CHANGES_DRAWN = 5


def _loads_chart(chart_id: str, comparison: LoadComparison) -> tuple[str, list[int]]:
    before, after = comparison.before, comparison.after
    readers = sorted(set(before.loads if before else {}) | set(after.loads if after else {}))
    series = []
    if before is not None:
        series.append(
            charts.Series(
                f"before (checkpoint {before.checkpoint_id})",
                tuple(float(before.loads.get(r, 0)) for r in readers),
                charts.SKY,
            )
        )
    if after is not None:
        series.append(
            charts.Series(
                f"after (checkpoint {after.checkpoint_id})",
                tuple(float(after.loads.get(r, 0)) for r in readers),
                charts.BLUE,
            )
        )
    words = "; ".join(
        f"reader {r}: {before.loads.get(r, 0) if before else '-'} before, "
        f"{after.loads.get(r, 0) if after else '-'} after"
        for r in readers
    )
    title = "Per-reader load before and after rebalance"
    if chart_id != "chart-loads" and after is not None:
        title = f"Per-reader load around checkpoint {after.checkpoint_id}"
    svg = charts.bar_chart(
        chart_id,
        title,
        f"Splits assigned per reader. {comparison.reason}. {words}.",
        [f"reader {r}" for r in readers],
        series,
        x_label="reader",
        y_label="splits assigned",
    )
    return svg, readers


def _spread(facts: CheckpointFacts | None) -> str:
    if facts is None or not facts.loads:
        return "-"
    return f"{min(facts.loads.values())}-{max(facts.loads.values())} over {len(facts.loads)}"


def _loads_section(data: ReportData) -> _Section:
    changes = data.load_changes()
    comparison = data.load_comparison()  # the latest change (or first vs latest without one)
    before, after = comparison.before, comparison.after
    svg, readers = _loads_chart("chart-loads", comparison)
    table = _table(
        "table-loads",
        "Splits assigned per reader",
        ["reader", "before", "after", "change"],
        [
            (
                r,
                before.loads.get(r, 0) if before else "-",
                after.loads.get(r, 0) if after else "-",
                (after.loads.get(r, 0) - before.loads.get(r, 0)) if before and after else "-",
            )
            for r in readers
        ],
        {1, 2, 3},
    )
    parts: list[_Figure | _Table] = [
        _figure(svg, "Bars: splits each reader owns in the enumerator state of each checkpoint."),
        table,
    ]
    earlier = changes[:-1][-LOAD_CHANGES_DRAWN:]
    for change in reversed(earlier):  # newest first, below the latest
        assert change.after is not None
        cid = change.after.checkpoint_id
        chart, _ = _loads_chart(f"chart-loads-at-{cid}", change)
        parts.append(_figure(chart, f"Checkpoint {cid}: {change.reason}."))
    if changes:
        parts.append(
            _table(
                "table-load-changes",
                "Every rescale and rebalance (splits per reader: least-most over readers)",
                ["checkpoint", "change", "before", "after"],
                [
                    (
                        c.after.checkpoint_id if c.after else "-",
                        c.reason.split(" recorded with")[0],
                        _spread(c.before),
                        _spread(c.after),
                    )
                    for c in changes[-TABLE_ROWS:]
                ],
                {0},
            )
        )
    lead = comparison.reason + "."
    if len(changes) > 1:
        lead += f" {len(changes)} rescales/rebalances in the history; the latest first, each below."
    return _section("loads", "Per-reader load before and after rebalance", lead, *parts)


def _latest(rows: Sequence[_T], n: int) -> tuple[list[_T], str]:
    """The latest ``n`` of ``rows`` and a caption suffix saying so when rows were left out."""
    shown = list(rows[-n:]) if n else []
    return shown, (f" (latest {len(shown):,} of {len(rows):,})" if len(shown) < len(rows) else "")


def _buckets(entries: Sequence[TimelineEntry], most: int) -> list[charts.TimelineBucket]:
    """``entries`` in at most ``most`` buckets of consecutive attempts, counted by kind."""
    if not entries:
        return []
    size = -(-len(entries) // most)
    out = []
    for i in range(0, len(entries), size):
        part = entries[i : i + size]
        counts = {k.value: 0 for k in CheckpointKind}
        for e in part:
            counts[e.kind.value] += 1
        out.append(charts.TimelineBucket(part[0].checkpoint_id, part[-1].checkpoint_id, counts))
    return out


def _why(e: TimelineEntry) -> str:
    """Why an attempt was not global: each failed region's cause (recorded since issue 23), else the
    attempt's reason (an aborted one's), else '-'."""
    if e.failures:
        return "; ".join(f.line() for f in e.failures)
    return e.reason or "-"


def _timeline_section(data: ReportData) -> _Section:
    window = data.timeline[-TIMELINE_WINDOW:]
    older = data.timeline[: len(data.timeline) - len(window)]
    marks = [
        charts.TimelineMark(
            checkpoint_id=e.checkpoint_id,
            kind=e.kind.value,
            outcomes={r: o.value for r, o in e.outcomes.items()},
            refs=dict(e.ref_checkpoint_ids),
        )
        for e in window
    ]
    counts = {k.value: sum(1 for e in data.timeline if e.kind is k) for k in CheckpointKind}
    failed = [e for e in window if e.failed_regions][-20:]
    desc = (
        f"{len(data.timeline)} checkpoint attempts: {counts['global']} global, "
        f"{counts['regional']} regional, {counts['aborted']} aborted."
        + (
            f" The latest {len(window)} are drawn one by one, the {len(older)} before them counted "
            "per bucket."
            if older
            else ""
        )
        + " "
        + " ".join(
            f"Checkpoint {e.checkpoint_id} {e.kind.value}: failed "
            + ", ".join(
                f"region {r} ({e.outcomes[r].value}"
                + (f", ref {e.ref_checkpoint_ids[r]})" if r in e.ref_checkpoint_ids else ")")
                for r in e.failed_regions
            )
            + "."
            for e in failed
        )
    )
    buckets = _buckets(older, TIMELINE_BUCKETS)
    svg = charts.timeline_chart("chart-timeline", "Checkpoint timeline", desc.strip(), marks, older=buckets)
    shown, more = _latest(data.timeline, TABLE_ROWS)
    rows = []
    for e in reversed(shown):  # newest first: what an incident review reads first
        failed_text = ", ".join(f"{r} ({e.outcomes[r].value})" for r in e.failed_regions) or "-"
        refs = ", ".join(f"region {r} → {c}" for r, c in sorted(e.ref_checkpoint_ids.items())) or "-"
        rows.append(
            (
                e.checkpoint_id,
                _kind(e.kind.value),
                failed_text,
                refs,
                e.at.strftime("%Y-%m-%d %H:%M:%S"),
                _why(e),
            )
        )
    parts: list[_Figure | _Table] = [
        _figure(svg, desc.strip()),
        _table(
            "table-timeline",
            "Checkpoint attempts, newest first" + more,
            ["id", "kind", "failed regions", "refs", "at (UTC)", "why (failed regions' causes)"],
            rows,
            {0},
        ),
    ]
    if buckets:
        parts.append(
            _table(
                "table-timeline-buckets",
                "Earlier attempts per bucket",
                ["checkpoints", "global", "regional", "aborted"],
                [
                    (f"{b.first}-{b.last}", b.counts["global"], b.counts["regional"], b.counts["aborted"])
                    for b in buckets
                ],
                {1, 2, 3},
            )
        )
    return _section(
        "timeline",
        "Checkpoint timeline",
        "One mark per checkpoint attempt (circle: global, diamond: regional, cross: aborted); below it, "
        "one cell per region: acknowledged, declined or timed out, with the checkpoint a failed region's "
        "state refers to (→ id, and an arrow when it is drawn)."
        + (
            f" The latest {len(window)} attempts are drawn; the earlier ones are counted on the left."
            if older
            else ""
        ),
        *parts,
    )


def _failures_section(data: ReportData) -> _Section:
    """Every failed region of the history with its cause: error class, split, offset, first line."""
    rows = [(e, f) for e in data.timeline for f in e.failures]
    unexplained = sum(
        1 for e in data.timeline if e.failed_regions and not e.failures
    )  # state written before causes were recorded
    shown, more = _latest(rows, TABLE_ROWS)
    table = _table(
        "table-failures",
        "Failed regions and why, newest first" + more,
        ["checkpoint", "kind", "region", "outcome", "error", "split", "offset", "message"],
        [
            (
                e.checkpoint_id,
                _kind(e.kind.value),
                f.region_id,
                f.outcome,
                f.error_class or "-",
                "-" if f.split_id is None else f.split_id,
                "-" if f.offset is None else f.offset,
                f.message,
            )
            for e, f in reversed(shown)
        ],
        {0, 2, 6},
    )
    by_class = Counter(f.error_class or f.outcome for _e, f in rows)
    lead = (
        f"{len(rows):,} failed region outcome(s) with their cause"
        + (": " + ", ".join(f"{c} {n:,}" for c, n in by_class.most_common(5)) if by_class else "")
        + "."
        + (f" {unexplained} attempt(s) with failed regions predate recorded causes." if unexplained else "")
    )
    return _section("failures", "Why regions failed", lead, table)


def _ref_chains(data: ReportData) -> tuple[int, dict[int, list[int]]] | None:
    """(checkpoint, region -> the checkpoints its state passes through) of the latest completed
    checkpoint with a failed region, else of the latest completed one; None without any."""
    completed = {e.checkpoint_id: e for e in data.timeline if e.kind is not CheckpointKind.ABORTED}
    if not completed:
        return None
    with_refs = [cid for cid, e in completed.items() if e.ref_checkpoint_ids]
    latest = max(completed)
    start = latest if completed[latest].ref_checkpoint_ids or not with_refs else max(with_refs)
    chains: dict[int, list[int]] = {}
    for region in sorted(completed[start].outcomes):
        chain = [start]
        while len(chain) < 50:
            entry = completed.get(chain[-1])
            ref = None if entry is None else entry.ref_checkpoint_ids.get(region)
            if ref is None or ref in chain:
                break
            chain.append(ref)
        chains[region] = chain
    return start, chains


def _refs_section(data: ReportData) -> _Section | None:
    found = _ref_chains(data)
    if found is None:
        return None
    start, chains = found
    latest = max(e.checkpoint_id for e in data.timeline if e.kind is not CheckpointKind.ABORTED)
    words = "; ".join(
        f"region {r}: "
        + (" → ".join(str(c) for c in chain) if len(chain) > 1 else f"acknowledged {chain[0]}")
        for r, chain in chains.items()
    )
    which = (
        f"the latest checkpoint, {start}"
        if start == latest
        else f"checkpoint {start}, the latest with a failed region (checkpoint {latest} is global)"
    )
    svg = charts.ref_chain_chart(
        "chart-refs",
        f"Ref chain of checkpoint {start}",
        f"Which checkpoint each region's state of {which} references: {words}.",
        chains,
    )
    table = _table(
        "table-refs",
        f"Region states of checkpoint {start}",
        ["region", "state of checkpoint", "hops"],
        [(r, chain[-1], len(chain) - 1) for r, chain in chains.items()],
        {0, 1, 2},
    )
    return _section(
        "refs",
        "Ref chain",
        f"Which checkpoint each region's state references in {which} (FLIP-600 ref_checkpoint_id): a "
        "restore reads a failed region's state from there.",
        _figure(svg, words),
        table,
    )


def _lag_section(data: ReportData) -> _Section:
    ids = sorted(data.lags)[-CHART_WINDOW:]
    top = [s.split_id for s in data.splits if s.lag is not None][:LAG_SPLITS_DRAWN]
    palette = (charts.BLUE, charts.VERMILLION, charts.GREEN, charts.PURPLE, charts.ORANGE, charts.SKY)
    series = [
        charts.Series(
            sid, tuple(float(data.lags[c].get(sid, float("nan"))) for c in ids), palette[i % len(palette)]
        )
        for i, sid in enumerate(top)
    ]
    total = sum(s.lag or 0 for s in data.splits)
    lead = (
        f"{len(data.splits)} live split(s) at the latest checkpoint, {total:,} offsets behind in all "
        "(lag: offsets to a split's end, or to its backlog boundary while in backlog)."
        if data.splits
        else "No live split at the latest checkpoint (all finished, or no checkpoint yet)."
    )
    svg = charts.line_chart(
        "chart-lag",
        "Lag per split over checkpoints",
        f"Lag of the {len(top)} split(s) with most lag at the latest checkpoint, over the latest {len(ids)} "
        f"kept checkpoints. "
        + ", ".join(f"{s.split_id}: {s.lag:,}" for s in data.splits[: len(top)] if s.lag is not None)
        + ".",
        [str(c) for c in ids],
        series,
        x_label="checkpoint id",
        y_label="offsets behind",
    )
    shown = data.splits[:TABLE_ROWS]
    more = (
        f" (the {len(shown)} with most lag of {len(data.splits):,})" if len(shown) < len(data.splits) else ""
    )
    table = _table(
        "table-lag",
        "Splits at the latest checkpoint, most lag first" + more,
        ["split", "owner", "position", "end", "lag", "backlog"],
        [
            (
                s.split_id,
                s.owner if s.owner is not None else s.status,
                s.position,
                "-" if s.end is None else s.end,
                "?" if s.lag is None else s.lag,
                "yes" if s.in_backlog else "no",
            )
            for s in shown
        ],
        {2, 3, 4},
    )
    return _section(
        "lag", "Lag per split", lead, _figure(svg, "Lines: offsets behind per checkpoint."), table
    )


def _backlog_section(data: ReportData) -> _Section:
    every_point = [(c.checkpoint_id, c.backlog_splits, c.processing_backlog) for c in data.checkpoints]
    points = every_point[-CHART_WINDOW:]
    switches = data.backlog_switches()
    to_normal = [cid for cid, backlog in switches if not backlog]
    switch_at = to_normal[-1] if to_normal else None
    if switch_at is not None:
        lead = f"Switched from backlog to the normal interval at checkpoint {switch_at}."
    elif data.checkpoints and data.checkpoints[-1].processing_backlog:
        lead = "Still processing backlog at the latest checkpoint (backlog interval and epoch size)."
    elif any(c.processing_backlog for c in data.checkpoints):
        lead = "Processed backlog in these checkpoints."
    else:
        lead = "Not processing backlog in any checkpoint (normal interval throughout)."
    if len(switches) > 1:
        lead += (
            " Mode changes: "
            + ", ".join(f"checkpoint {cid} → {'backlog' if b else 'normal'}" for cid, b in switches[-20:])
            + (f" (the latest 20 of {len(switches)})" if len(switches) > 20 else "")
            + "."
        )
    svg = charts.backlog_chart(
        "chart-backlog",
        "Backlog progress",
        f"Splits still in backlog per checkpoint; shaded: checkpoints taken while processing backlog. {lead}",
        points,
        switch_at=switch_at,
    )
    shown, more = _latest(every_point, TABLE_ROWS)
    table = _table(
        "table-backlog",
        "Backlog per checkpoint" + more,
        ["checkpoint", "splits in backlog", "mode"],
        [(cid, n, "backlog" if b else "normal") for cid, n, b in shown],
        {0, 1},
    )
    return _section("backlog", "Backlog progress", lead, _figure(svg, lead), table)


def _decisions_section(data: ReportData) -> _Section:
    counts = data.decision_counts()
    desc = ", ".join(f"{d}: {n}" for d, n in counts) or "no decisions recorded"
    svg = charts.hbar_chart(
        "chart-decisions",
        "Recovery decisions",
        f"Audit records per decision in the kept checkpoints: {desc}.",
        [(d, float(n)) for d, n in counts],
        x_label="audit records",
        y_label="decision",
        color=charts.PURPLE,
    )
    count_table = _table("table-decision-counts", "Decisions", ["decision", "count"], counts, {1})
    shown = data.audit[-AUDIT_ROWS_SHOWN:]
    caption = "Audit trail" + (
        f" (latest {len(shown)} of {len(data.audit)})" if len(shown) < len(data.audit) else ""
    )
    trail = _table(
        "table-audit",
        caption,
        ["checkpoint", "seq", "split", "reader", "decision", "detail"],
        [
            (
                a.checkpoint_id,
                a.seq,
                a.split_id,
                "-" if a.reader_id is None else a.reader_id,
                a.decision,
                a.detail,
            )
            for a in shown
        ],
        {0, 1},
    )
    return _section(
        "decisions",
        "Recovery decisions",
        f"{len(data.audit)} audit records in the kept checkpoints: the rule the enumerator applied to "
        "each split.",
        _figure(svg, "Bars: how often each decision was taken."),
        count_table,
        trail,
    )


def _released(p: ParkedSplit) -> object:
    if p.released_at is None:
        return "-"
    return f"{p.released_at} (dropped)" if p.dropped else p.released_at


def _parked_section(parked: list[ParkedSplit]) -> _Section:
    now = [p for p in parked if p.released_at is None]
    table = _table(
        "table-parked",
        "Quarantined splits",
        ["split", "quarantined at", "reader", "error", "parked at position", "released (or dropped) at"],
        [
            (
                p.split_id,
                "-" if p.quarantined_at < 0 else p.quarantined_at,
                "-" if p.reader_id is None else p.reader_id,
                p.error,
                "-" if p.position is None else p.position,
                _released(p),
            )
            for p in parked
        ],
        {1, 4, 5},
    )
    lead = (
        f"{len(now)} split(s) parked now, read by nobody until 'splitkeeper recover --release SPLIT' "
        "(checkpoint.on_split_failure: quarantine); the other splits checkpoint globally. "
        "The restart checks count a parked split as neither lost nor duplicated."
        if now
        else "Every quarantined split was released (read again from its position) or dropped (its file "
        "gone: 'recover --drop')."
    )
    return _section("parked", "Quarantined splits", lead, table)


#: The decisions an operator's command made (rewind, offsets reset, release, drop), shown on their own.
OPERATOR_DECISIONS = (
    "rewound",
    "reset_by_operator",
    "skipped_by_operator",
    "released",
    "dropped_by_operator",
)


def _operator_section(data: ReportData) -> _Section | None:
    """What operators did (``recover --rewind``, ``offsets reset``, ``--release``, ``--drop``), newest
    first, with who and why from each record's detail; None when nobody did anything."""
    done = [a for a in data.audit if a.decision in OPERATOR_DECISIONS]
    if not done:
        return None
    skipped = sum(1 for a in done if a.decision == "skipped_by_operator")
    table = _table(
        "table-operator",
        "Operator actions",
        ["checkpoint", "split", "decision", "detail"],
        [(a.checkpoint_id, a.split_id, a.decision, a.detail) for a in reversed(done[-TABLE_ROWS:])],
        {0},
    )
    lead = (
        f"{len(done)} split decision(s) made by an operator's command in the kept checkpoints"
        + (
            f"; {skipped} offset range(s) skipped by hand, which the restart checks accept as gaps"
            if skipped
            else ""
        )
        + "."
    )
    return _section("operator", "Operator actions", lead, table)


#: The phases of a checkpoint as the report names them, with their colours.
PHASE_NAMES = {"plan": "plan", "read": "read", "sink": "sink commit", "commit": "state commit"}
PHASE_COLORS = {"plan": charts.SKY, "read": charts.BLUE, "sink": charts.ORANGE, "commit": charts.GREEN}


def _phases_section(data: ReportData) -> _Section:
    window = data.checkpoints[-CHART_WINDOW:]
    series = [
        charts.Series(PHASE_NAMES[p], tuple(float(c.phases_ms.get(p, 0)) for c in window), PHASE_COLORS[p])
        for p in PHASES
    ]
    commits = [c.commit_ms for c in data.checkpoints]
    median = statistics.median(commits) if commits else 0.0
    totals = [sum(c.phases_ms.values()) for c in window]
    slowest = max(window, key=lambda c: sum(c.phases_ms.values()), default=None)
    desc = (
        f"Milliseconds per phase of the latest {len(window)} checkpoints: plan, read (every region's task), "
        f"sink commit, state commit (median {median:.0f} ms)."
        + (
            f" Slowest: checkpoint {slowest.checkpoint_id}, "
            + ", ".join(f"{PHASE_NAMES[p]} {ms} ms" for p, ms in slowest.phases_ms.items())
            + "."
            if slowest is not None and totals and max(totals) > 0
            else ""
        )
    )
    svg = charts.stacked_bar_chart(
        "chart-phases",
        "Checkpoint phase times",
        desc,
        [str(c.checkpoint_id) for c in window],
        series,
        x_label="checkpoint id",
        y_label="milliseconds",
    )
    shown, more = _latest(data.checkpoints, TABLE_ROWS)
    table = _table(
        "table-phases",
        "Phase times (ms), newest first" + more,
        ["checkpoint", "kind", *(PHASE_NAMES[p] for p in PHASES), "total"],
        [
            (
                c.checkpoint_id,
                _kind(c.kind.value),
                *(c.phases_ms.get(p, "-") for p in PHASES),
                sum(c.phases_ms.values()),
            )
            for c in reversed(shown)
        ],
        {0, 2, 3, 4, 5, 6},
    )
    return _section(
        "phases",
        "Checkpoint phase times",
        "Per checkpoint: planning the epoch, reading it (the regions' tasks), committing the sink, and "
        "committing the state (enumerator state and audit rows, then the checkpoints row). Phases not "
        "recorded (state written before they were, a checkpoint a restart redid) show as '-'.",
        _figure(svg, f"Stacked bars; the state commit's median is {median:.0f} ms."),
        table,
    )


def _records_section(data: ReportData) -> _Section:
    assert data.records is not None
    every_epoch = sorted(data.records)
    epochs = every_epoch[-CHART_WINDOW:]
    totals = [sum(data.records[e].values()) for e in epochs]
    everything = sum(n for per in data.records.values() for n in per.values())
    svg = charts.bar_chart(
        "chart-records",
        "Records committed per checkpoint",
        f"Sink records per epoch (= checkpoint id), {everything:,} in all"
        + (f"; the latest {len(epochs)} epochs drawn." if len(epochs) < len(every_epoch) else "."),
        [str(e) for e in epochs],
        [charts.Series("records", tuple(float(t) for t in totals), charts.BLUE)],
        x_label="epoch (checkpoint id)",
        y_label="records",
    )
    shown, more = _latest(
        [(e, r, n) for e in every_epoch for r, n in sorted(data.records[e].items())], TABLE_ROWS
    )
    table = _table(
        "table-records",
        "Records per epoch and region" + more,
        ["epoch", "region", "records"],
        shown,
        {0, 1, 2},
    )
    return _section(
        "records",
        "Records committed",
        (
            f"The change table at {data.upsert.changes_path} (the upsert sink's records; its keyed table is "
            f"{data.sink_path}): only acknowledged regions' records are committed."
            if data.upsert is not None
            else f"The sink table at {data.sink_path}: only acknowledged regions' records are committed."
        ),
        _figure(svg, "Bars: records in the sink per epoch."),
        table,
    )


def _dead_letters_section(data: ReportData) -> _Section:
    facts = data.dead_letters
    assert facts is not None
    parts: list[_Figure | _Table] = []
    if facts.per_split:
        shown = facts.per_split[:20]
        svg = charts.hbar_chart(
            "chart-dead-letters",
            "Dead letters per split",
            f"Bad records per split in the dead-letter table, {facts.total:,} in all"
            + (f" (the {len(shown)} splits with most)." if len(shown) < len(facts.per_split) else "."),
            [(sid, float(n)) for sid, n in shown],
            x_label="dead letters",
            y_label="split",
            color=charts.VERMILLION,
        )
        parts.append(_figure(svg, "Bars: dead letters per split."))
    parts.append(
        _table(
            "table-dead-stages",
            "Dead letters per stage",
            ["stage", "dead letters"],
            [(stage, n) for stage, n in facts.per_stage],
            {1},
        )
    )
    parts.append(
        _table(
            "table-dead-splits",
            "Dead letters per split",
            ["split", "dead letters"],
            list(facts.per_split),
            {1},
        )
    )
    parts.append(
        _table(
            "table-dead-first",
            f"The first {len(facts.first)} dead letters",
            ["split", "offset", "stage", "error", "message"],
            list(facts.first),
            {1},
        )
    )
    lead = (
        f"The dead-letter table at {facts.path} holds {facts.total:,} bad record(s) (errors.tolerance: all): "
        "each with its raw key and value bytes, the stage that failed and the error, committed with its "
        "epoch. The sink and this table together hold every offset once (the restart checks prove it)."
        if facts.total
        else f"The dead-letter table at {facts.path} is empty: no bad record so far."
    )
    return _section("dead-letters", "Dead letters", lead, *parts)


def _upsert_section(data: ReportData) -> _Section:
    facts = data.upsert
    assert facts is not None
    parts: list[_Figure | _Table] = [
        _table(
            "table-upsert-counts",
            "Keys, upserts and deletes",
            ["keys (keyed table rows)", "change records", "upserts", "deletes"],
            [(facts.keys, facts.changes, facts.upserts, facts.deletes)],
            {0, 1, 2, 3},
        )
    ]
    fold = facts.fold
    if fold is None:
        verdict = "not run yet (splitkeeper validate, or the Airflow validate task, runs it)"
    else:
        verdict = f"{'PASSED' if fold.success else 'FAILED'}: {fold.verdict()}"
        parts.append(
            _table(
                "table-upsert-fold",
                "The fold check (Great Expectations suite upsert_fold, on Spark)",
                ["expectation", "result"],
                [(line.split(":", 1)[0], line.split(":", 1)[1].strip()) for line in fold.expectations],
                set(),
            )
        )
        if fold.first:
            parts.append(
                _table(
                    "table-upsert-offenders",
                    f"The first {len(fold.first)} differing keys",
                    ["key", "split", "offset", "verdict", "detail"],
                    [(r["key"], r["split_id"], r["offset"], r["verdict"], r["detail"]) for r in fold.first],
                    {2},
                )
            )
    deletes = "a tombstone (null value)" + (f" or {facts.delete_when}" if facts.delete_when else "")
    lead = (
        f"The keyed table at {facts.keyed_path} holds the latest record per key ({', '.join(facts.key)}); "
        f"each epoch is one MERGE, and every record is also appended to the change table at "
        f"{facts.changes_path}. A delete is {deletes}. Fold check: {verdict}."
    )
    return _section("upsert", "Upsert sink", lead, *parts)


def _filtered_section(data: ReportData) -> _Section:
    facts = data.filtered
    assert facts is not None
    table = _table(
        "table-filtered",
        "Filtered offsets per function",
        ["function", "ranges", "offsets"],
        list(facts.per_function),
        {1, 2},
    )
    lead = (
        f"The Spark transform filtered {facts.offsets:,} offset(s) out, recorded as {facts.ranges:,} "
        f"range(s) in {facts.path}: the records, the dead letters and these ranges hold every offset once "
        "(the restart checks prove it)."
    )
    return _section("filtered", "Filtered offsets", lead, table)


def _restart_checks_summary(data: ReportData) -> str:
    """The verdict of the latest run of the restart checks and a count of the in-run checks."""
    latest = data.checkpoints[-1].checkpoint_id if data.checkpoints else None
    validated = data.latest_validation
    if validated is None:
        head = "not run yet (splitkeeper validate, the validate task)"
    else:
        head = f"{validated.verdict.upper()} on checkpoint {validated.checkpoint_id}"
        if validated.verdict == "failed":
            head += f" ({', '.join(k for k, v in validated.suites.items() if v == 'failed')})"
        if latest is not None and validated.checkpoint_id != latest:
            head += f"; checkpoint {latest} not validated yet"
    in_run = [c for c in data.restart_checks if c.in_run]
    failed = sum(1 for c in in_run if c.verdict == "failed")
    if in_run:
        head += (
            f"; in-run checks: {len(in_run) - failed} passed, {failed} FAILED"
            if failed
            else (f"; in-run checks: {len(in_run)} passed")
        )
    return head


def _restart_checks_section(data: ReportData) -> _Section:
    """Every recorded verdict of the restart checks, newest first: validate runs and in-run checks."""
    rows = list(data.restart_checks)
    table = _table(
        "table-restart-checks",
        "Restart checks, newest first",
        ["when", "check", "checkpoint", "readers", "before epoch", "verdict", "rules or suites", "detail"],
        [
            (
                c.at.strftime("%Y-%m-%d %H:%M:%S"),
                "validate" if c.restore is None else c.restore.replace("_", " "),
                c.checkpoint_id,
                ", ".join(map(str, c.readers)) or "-",
                "-" if c.epoch is None else c.epoch,
                c.verdict.upper(),
                ", ".join(f"{k} {v}" for k, v in c.suites.items()),
                c.detail or "-",
            )
            for c in rows
        ],
        {2, 4},
    )
    lead = (
        "Every restore inside a run is proven before the run reads on (protocol section 6 but the "
        "sink's 6.4: global restores, rescales, partial failovers, regions falling back), and the "
        "validate task proves the latest checkpoint and the sink. "
        + f"Latest verdict: {_restart_checks_summary(data)}."
    )
    return _section("restart-checks", "Restart checks", lead, table)


def _summary(data: ReportData) -> list[tuple[str, str]]:
    completed = [e for e in data.timeline if e.kind is not CheckpointKind.ABORTED]
    counts = {k: sum(1 for e in data.timeline if e.kind is k) for k in CheckpointKind}
    latest = data.checkpoints[-1] if data.checkpoints else None
    items = [
        ("Pipeline", data.pipeline),
        ("State", data.state_root),
        (
            "Checkpoint attempts",
            f"{len(data.timeline)} ({counts[CheckpointKind.GLOBAL]} global, "
            f"{counts[CheckpointKind.REGIONAL]} regional, {counts[CheckpointKind.ABORTED]} aborted)",
        ),
        (
            "Latest completed checkpoint",
            "none"
            if latest is None
            else f"{latest.checkpoint_id} ({latest.kind.value}, parallelism {latest.parallelism}, "
            f"{'processing backlog' if latest.processing_backlog else 'normal interval'})",
        ),
        ("Restart checks", _restart_checks_summary(data)),
        (
            "Failed region outcomes",
            str(sum(1 for e in completed for o in e.outcomes.values() if o is not RegionOutcome.ACK)),
        ),
    ]
    if data.parked_positions:
        items.append(
            (
                "Quarantined splits",
                ", ".join(f"{sid} at {pos}" for sid, pos in sorted(data.parked_positions.items())),
            )
        )
    if data.records is not None:
        total = sum(n for per in data.records.values() for n in per.values())
        if data.upsert is not None:
            items.append(("Records in the change table", f"{total:,} ({data.upsert.changes_path})"))
        else:
            items.append(("Records in the sink", f"{total:,} ({data.sink_path})"))
    if data.dead_letters is not None:
        items.append(("Dead letters", f"{data.dead_letters.total:,} ({data.dead_letters.path})"))
    if data.upsert is not None:
        up, fold = data.upsert, data.upsert.fold
        items.append(
            (
                "Upsert sink",
                f"{up.keys:,} keys, {up.upserts:,} upserts, {up.deletes:,} deletes; "
                f"fold check {'not run' if fold is None else ('PASSED' if fold.success else 'FAILED')}",
            )
        )
    if data.filtered is not None:
        items.append(("Filtered offsets", f"{data.filtered.offsets:,} in {data.filtered.ranges:,} range(s)"))
    return items


def render_html(
    data: ReportData, *, title: str, data_docs_href: str | None = None, runs_href: str | None = None
) -> str:
    """The report page for ``data`` (no I/O). ``data_docs_href`` links the Data Docs index,
    ``runs_href`` the index of every run's report."""
    sections = [
        _loads_section(data),
        _timeline_section(data),
        _failures_section(data),
        _lag_section(data),
        _backlog_section(data),
        _decisions_section(data),
        _phases_section(data),
    ]
    refs = _refs_section(data)
    if refs is not None:
        sections.insert(3, refs)
    parked = data.parked_splits()
    if parked:
        sections.insert(len(sections) - 1, _parked_section(parked))
    operator = _operator_section(data)
    if operator is not None:
        sections.insert(len(sections) - 1, operator)
    if data.records is not None:
        sections.append(_records_section(data))
    if data.dead_letters is not None:
        sections.append(_dead_letters_section(data))
    if data.upsert is not None:
        sections.append(_upsert_section(data))
    if data.filtered is not None:
        sections.append(_filtered_section(data))
    if data.restart_checks:  # first: whether every restart was proven is what a reader looks for first
        sections.insert(0, _restart_checks_section(data))
    return (
        _templates()
        .get_template("report.html.j2")
        .render(
            title=title,
            css=Markup(_CSS),
            pipeline=data.pipeline,
            generated=data.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC"),
            summary=_summary(data),
            data_docs_href=data_docs_href,
            runs_href=runs_href,
            sections=sections,
        )
    )


def _docs_href(data_docs_index: str | os.PathLike[str] | None, out_dir: Path) -> str | None:
    if data_docs_index is None:
        return None
    target = Path(data_docs_index).resolve()
    try:
        return Path(os.path.relpath(target, out_dir)).as_posix()
    except ValueError:  # another drive (Windows)
        return target.as_uri()


def render_report(
    state_store: DeltaStateStore,
    out_dir: str | os.PathLike[str],
    *,
    sink: SinkReader | None = None,
    title: str,
    data_docs_index: str | os.PathLike[str] | None = None,
    keep_runs: int = KEEP_RUN_REPORTS,
) -> Path:
    """Write the run report of ``state_store``'s pipeline to ``<out_dir>/report.html``; return its path.

    The same page is kept per run: ``<out_dir>/runs/<run start>-<run id>/report.html`` (the run that
    wrote the latest checkpoint attempt; rendering again during or after that run replaces it), listed
    newest first by ``<out_dir>/index.html``; the oldest beyond ``keep_runs`` are removed.

    ``sink`` (the sink's reader, :class:`~splitkeeper.sinks.port.SinkReader`) adds the
    records-per-epoch section, and those of what the sink has: the dead letters (per split and
    stage, the first errors), an upsert sink's keys, upserts, deletes and fold check's verdict (read
    beside ``data_docs_index``), a Spark transform's filtered offsets. ``data_docs_index`` (the
    ``index.html`` of the restart checks' Data Docs) is linked relative to ``out_dir``.
    May be called any number of times; each call replaces the file.
    """
    if not isinstance(title, str) or not title.strip():
        raise InvalidParameterError("title", title, "a non-empty title")
    folder = Path(out_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data = collect_report_data(
        state_store,
        sink,
        fold_dir=None if data_docs_index is None else Path(data_docs_index).parent,
    )
    page = render_html(
        data, title=title, data_docs_href=_docs_href(data_docs_index, folder), runs_href=RUNS_INDEX_FILE
    )
    target = folder / REPORT_FILE
    _write(target, page)
    latest = data.checkpoints[-1] if data.checkpoints else None
    summary = {
        "name": data.pipeline,
        "state": data.state_root,
        "checkpoint_id": None if latest is None else latest.checkpoint_id,
        "kind": None if latest is None else latest.kind.value,
        "parallelism": None if latest is None else latest.parallelism,
        "generated_at": data.generated_at.isoformat(),
    }
    run = _run_of(data)
    run_dir = None
    if run is not None:
        run_id, started = run
        run_dir = folder / RUNS_DIR / run_folder_name(run_id, started)
        summary["run_report"] = (run_dir / REPORT_FILE).relative_to(folder).as_posix()
    _write(folder / SUMMARY_FILE, json.dumps(summary))
    if run is not None and run_dir is not None:
        run_id, started = run
        run_dir.mkdir(parents=True, exist_ok=True)
        kept = render_html(
            data,
            title=title,
            data_docs_href=_docs_href(data_docs_index, run_dir),
            runs_href=f"../../{RUNS_INDEX_FILE}",
        )
        _write(run_dir / REPORT_FILE, kept)
        of_run = [e for e in data.timeline if e.run_id == run_id]
        _write(
            run_dir / RUN_FILE,
            json.dumps(
                {
                    "run_id": run_id,
                    "started": started.strftime("%Y-%m-%d %H:%M:%S"),
                    "attempts": len(of_run),
                    "failed_regions": sum(len(e.failed_regions) for e in of_run),
                    "checkpoint_id": of_run[-1].checkpoint_id,
                    "kind": of_run[-1].kind.value,
                    "generated": data.generated_at.strftime("%Y-%m-%d %H:%M:%S"),
                }
            ),
        )
        _prune_runs(folder / RUNS_DIR, keep_runs)
    render_runs_index(folder, data.pipeline, keep_runs)
    render_index(folder.parent)
    return target


def run_report(report: str | os.PathLike[str]) -> Path:
    """The kept page of the run that ``report`` (a ``report.html`` :func:`render_report` returned)
    was rendered for: ``runs/<run start>-<run id>/report.html`` beside it, named by its
    ``summary.json``; ``report`` itself when no run wrote the state yet (or the page is gone)."""
    latest = Path(report)
    try:
        kept = json.loads((latest.parent / SUMMARY_FILE).read_text(encoding="utf-8")).get("run_report")
    except (OSError, ValueError):
        return latest
    page = latest.parent / str(kept) if kept else latest
    return page if page.is_file() else latest


def _run_of(data: ReportData) -> tuple[str, datetime] | None:
    """(run id, its first attempt's time) of the run that wrote the latest attempt; None before any."""
    latest = next((e for e in reversed(data.timeline) if e.run_id), None)
    if latest is None:
        return None
    return latest.run_id, min(e.at for e in data.timeline if e.run_id == latest.run_id)


def run_folder_name(run_id: str, started: datetime) -> str:
    """``<start, UTC, to the microsecond>-<run id>``: folders sort (and are pruned) by start time,
    even for two runs started within one second, whose random run ids would order them by chance."""
    return f"{started.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}-{_safe(run_id)}"


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)[:80] or "run"


def _prune_runs(runs: Path, keep: int) -> None:
    """Remove the oldest run folders (by name: run start time first) beyond ``keep``."""
    import shutil

    folders = sorted(p for p in runs.iterdir() if p.is_dir() and (p / RUN_FILE).is_file())
    for old in folders[: max(0, len(folders) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def render_runs_index(out_dir: str | os.PathLike[str], pipeline: str, keep: int = KEEP_RUN_REPORTS) -> Path:
    """Write ``<out_dir>/index.html``: the kept run reports under ``<out_dir>/runs``, newest first."""
    folder = Path(out_dir).resolve()
    runs = []
    base = folder / RUNS_DIR
    for run_file in sorted(base.glob(f"*/{RUN_FILE}"), reverse=True) if base.is_dir() else []:
        try:
            run = json.loads(run_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced, or not ours
        runs.append({**run, "report": (run_file.parent / REPORT_FILE).relative_to(folder).as_posix()})
    page = (
        _templates()
        .get_template("runs.html.j2")
        .render(
            title=f"splitkeeper run reports: {pipeline}",
            css=Markup(_CSS),
            pipeline=pipeline,
            keep=keep,
            latest=REPORT_FILE,
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            runs=runs,
        )
    )
    target = folder / RUNS_INDEX_FILE
    _write(target, page)
    return target


def _write(target: Path, text: str) -> None:
    partial = target.with_name(f".{target.name}.tmp")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, target)


def render_index(reports_dir: str | os.PathLike[str]) -> Path:
    """Write ``<reports_dir>/pipelines.html``: every pipeline whose report is in a subfolder of
    ``reports_dir`` (its ``summary.json``), with its state, latest checkpoint and a link; return
    its path. Pipelines whose state shares a parent folder share the default reports folder."""
    target = Path(reports_dir).resolve() / INDEX_FILE
    _write(target, index_html(reports_dir))
    return target


def index_html(reports_dir: str | os.PathLike[str]) -> str:
    """The page :func:`render_index` writes, without writing it (the Airflow plugin serves it)."""
    base = Path(reports_dir).resolve()
    pipelines = []
    for summary_path in sorted(base.glob(f"*/{SUMMARY_FILE}")):
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being replaced, or not ours
        report = summary_path.parent / REPORT_FILE
        pipelines.append(
            {
                **summary,
                "report": report.relative_to(base).as_posix() if report.exists() else None,
            }
        )
    page = (
        _templates()
        .get_template("index.html.j2")
        .render(
            title="splitkeeper pipelines",
            css=Markup(_CSS),
            root=str(base),
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            pipelines=pipelines,
        )
    )
    return page
