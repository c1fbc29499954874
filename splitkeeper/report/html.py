"""The run report: one self-contained HTML file with inline SVG charts and tables.

:func:`render_report` is what the Airflow report task and ``splitkeeper`` commands call
after a run: it reads the state (:func:`splitkeeper.report.data.collect_report_data`)
and writes ``<out_dir>/report.html``. The file needs no network and no script: charts
are inline SVG generated here (:mod:`splitkeeper.report.charts`), each with a title, a
description, axis labels, a legend and a table of the same numbers beside it.
Rendering again overwrites the file (written to a temporary name, then renamed).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.errors import InvalidParameterError
from splitkeeper.report import charts
from splitkeeper.report.data import ReportData, collect_report_data

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.state.checkpoints import DeltaStateStore

REPORT_FILE = "report.html"
AUDIT_ROWS_SHOWN = 200

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
# small HTML helpers
# ---------------------------------------------------------------------------------------


def _table(
    table_id: str, caption: str, headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: set[int]
) -> str:
    num = ' class="num"'
    head = "".join(
        f'<th scope="col"{num if i in numeric else ""}>{escape(h)}</th>' for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = value if isinstance(value, _Raw) else escape("" if value is None else str(value))
            cells.append(f"<td{num if i in numeric else ''}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}">none</td></tr>')
    return (
        f'<div class="tablebox"><table id="{table_id}"><caption>{escape(caption)}</caption>'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
    )


class _Raw(str):
    """Pre-escaped HTML for a table cell."""


def _kind(kind: str) -> _Raw:
    return _Raw(f'<span class="kind-{escape(kind)}">{escape(kind)}</span>')


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _section(section_id: str, heading: str, lead: str, *parts: str) -> str:
    return (
        f'<section id="{section_id}" aria-labelledby="{section_id}-h">'
        f'<h2 id="{section_id}-h">{escape(heading)}</h2>'
        f'<p class="lead">{escape(lead)}</p><div class="pair">{"".join(parts)}</div></section>'
    )


# ---------------------------------------------------------------------------------------
# sections
# ---------------------------------------------------------------------------------------


def _loads_section(data: ReportData) -> str:
    comparison = data.load_comparison()
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
    svg = charts.bar_chart(
        "chart-loads",
        "Per-reader load before and after rebalance",
        f"Splits assigned per reader. {comparison.reason}. {words}.",
        [f"reader {r}" for r in readers],
        series,
        x_label="reader",
        y_label="splits assigned",
    )
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
    return _section(
        "loads",
        "Per-reader load before and after rebalance",
        comparison.reason + ".",
        _figure(svg, "Bars: splits each reader owns in the enumerator state of each checkpoint."),
        table,
    )


def _timeline_section(data: ReportData) -> str:
    marks = [
        charts.TimelineMark(
            checkpoint_id=e.checkpoint_id,
            kind=e.kind.value,
            outcomes={r: o.value for r, o in e.outcomes.items()},
            refs=dict(e.ref_checkpoint_ids),
        )
        for e in data.timeline
    ]
    counts = {k.value: sum(1 for e in data.timeline if e.kind is k) for k in CheckpointKind}
    desc = (
        f"{len(data.timeline)} checkpoint attempts: {counts['global']} global, "
        f"{counts['regional']} regional, {counts['aborted']} aborted. "
        + " ".join(
            f"Checkpoint {e.checkpoint_id} {e.kind.value}: failed "
            + ", ".join(
                f"region {r} ({e.outcomes[r].value}"
                + (f", ref {e.ref_checkpoint_ids[r]})" if r in e.ref_checkpoint_ids else ")")
                for r in e.failed_regions
            )
            + "."
            for e in data.timeline
            if e.failed_regions
        )
    )
    svg = charts.timeline_chart("chart-timeline", "Checkpoint timeline", desc, marks)
    rows = []
    for e in data.timeline:
        failed = ", ".join(f"{r} ({e.outcomes[r].value})" for r in e.failed_regions) or "-"
        refs = ", ".join(f"region {r} → {c}" for r, c in sorted(e.ref_checkpoint_ids.items())) or "-"
        rows.append(
            (
                e.checkpoint_id,
                _kind(e.kind.value),
                failed,
                refs,
                e.at.strftime("%Y-%m-%d %H:%M:%S"),
                e.reason or "-",
            )
        )
    table = _table(
        "table-timeline",
        "Checkpoint attempts",
        ["id", "kind", "failed regions", "refs", "at (UTC)", "reason"],
        rows,
        {0},
    )
    return _section(
        "timeline",
        "Checkpoint timeline",
        "One mark per checkpoint attempt (circle: global, diamond: regional, cross: aborted); below it, "
        "one cell per region: acknowledged, declined or timed out, with the checkpoint a failed region's "
        "state refers to (→ id).",
        _figure(svg, desc),
        table,
    )


def _backlog_section(data: ReportData) -> str:
    points = [(c.checkpoint_id, c.backlog_splits, c.processing_backlog) for c in data.checkpoints]
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
            + ", ".join(f"checkpoint {cid} → {'backlog' if b else 'normal'}" for cid, b in switches)
            + "."
        )
    svg = charts.backlog_chart(
        "chart-backlog",
        "Backlog progress",
        f"Splits still in backlog per checkpoint; shaded: checkpoints taken while processing backlog. {lead}",
        points,
        switch_at=switch_at,
    )
    table = _table(
        "table-backlog",
        "Backlog per checkpoint",
        ["checkpoint", "splits in backlog", "mode"],
        [(cid, n, "backlog" if b else "normal") for cid, n, b in points],
        {0, 1},
    )
    return _section("backlog", "Backlog progress", lead, _figure(svg, lead), table)


def _decisions_section(data: ReportData) -> str:
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


def _commit_section(data: ReportData) -> str:
    values = [c.commit_ms for c in data.checkpoints]
    median = statistics.median(values) if values else 0.0
    svg = charts.bar_chart(
        "chart-commit",
        "State commit time per checkpoint",
        f"Milliseconds to write each checkpoint's enumerator state and audit rows; median {median:.0f} ms"
        + (f", max {max(values)} ms." if values else "."),
        [str(c.checkpoint_id) for c in data.checkpoints],
        [charts.Series("state commit (ms)", tuple(float(v) for v in values), charts.GREEN)],
        x_label="checkpoint id",
        y_label="milliseconds",
        reference=(f"median {median:.0f} ms", float(median)) if values else None,
    )
    table = _table(
        "table-commit",
        "State commit time",
        ["checkpoint", "kind", "commit (ms)"],
        [(c.checkpoint_id, _kind(c.kind.value), c.commit_ms) for c in data.checkpoints],
        {0, 2},
    )
    return _section(
        "commit",
        "State commit time",
        "Time from the start of the state commit until the checkpoints row was written "
        "(enumerator state and audit rows).",
        _figure(svg, f"Dashed line: median {median:.0f} ms."),
        table,
    )


def _records_section(data: ReportData) -> str:
    assert data.records is not None
    epochs = sorted(data.records)
    totals = [sum(data.records[e].values()) for e in epochs]
    svg = charts.bar_chart(
        "chart-records",
        "Records committed per checkpoint",
        f"Sink records per epoch (= checkpoint id), {sum(totals):,} in all.",
        [str(e) for e in epochs],
        [charts.Series("records", tuple(float(t) for t in totals), charts.BLUE)],
        x_label="epoch (checkpoint id)",
        y_label="records",
    )
    table = _table(
        "table-records",
        "Records per epoch and region",
        ["epoch", "region", "records"],
        [(e, r, n) for e in epochs for r, n in sorted(data.records[e].items())],
        {0, 1, 2},
    )
    return _section(
        "records",
        "Records committed",
        f"The sink table at {data.sink_path}: only acknowledged regions' records are committed.",
        _figure(svg, "Bars: records in the sink per epoch."),
        table,
    )


def _summary(data: ReportData, data_docs_href: str | None) -> str:
    completed = [e for e in data.timeline if e.kind is not CheckpointKind.ABORTED]
    counts = {k: sum(1 for e in data.timeline if e.kind is k) for k in CheckpointKind}
    latest = data.checkpoints[-1] if data.checkpoints else None
    items = [
        ("Pipeline", escape(data.pipeline)),
        ("State", escape(data.state_root)),
        (
            "Checkpoint attempts",
            f"{len(data.timeline)} ({counts[CheckpointKind.GLOBAL]} global, "
            f"{counts[CheckpointKind.REGIONAL]} regional, {counts[CheckpointKind.ABORTED]} aborted)",
        ),
        (
            "Latest completed checkpoint",
            "none"
            if latest is None
            else f"{latest.checkpoint_id} ({escape(latest.kind.value)}, parallelism {latest.parallelism}, "
            f"{'processing backlog' if latest.processing_backlog else 'normal interval'})",
        ),
        (
            "Failed region outcomes",
            str(sum(1 for e in completed for o in e.outcomes.values() if o is not RegionOutcome.ACK)),
        ),
    ]
    if data.records is not None:
        total = sum(n for per in data.records.values() for n in per.values())
        items.append(("Records in the sink", f"{total:,} ({escape(str(data.sink_path))})"))
    docs = (
        f'<a id="data-docs-link" href="{escape(data_docs_href)}">Great Expectations Data Docs</a>'
        if data_docs_href
        else "not built for this report"
    )
    items.append(("Restart checks", docs))
    body = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items)
    return (
        '<section id="summary" aria-labelledby="summary-h"><h2 id="summary-h">Summary</h2>'
        f'<dl class="summary">{body}</dl></section>'
    )


def render_html(data: ReportData, *, title: str, data_docs_href: str | None = None) -> str:
    """The report page for ``data`` (no I/O). ``data_docs_href`` links the Data Docs index."""
    sections = [
        _summary(data, data_docs_href),
        _loads_section(data),
        _timeline_section(data),
        _backlog_section(data),
        _decisions_section(data),
        _commit_section(data),
    ]
    if data.records is not None:
        sections.append(_records_section(data))
    generated = data.generated_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<header><h1>{escape(title)}</h1><p>splitkeeper run report of pipeline "
        f"<strong>{escape(data.pipeline)}</strong>, generated {generated}</p></header>\n"
        f"<main>\n{chr(10).join(sections)}\n</main>\n</body>\n</html>\n"
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
    sink_path: str | os.PathLike[str] | None = None,
    title: str,
    data_docs_index: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the run report of ``state_store``'s pipeline to ``<out_dir>/report.html``; return its path.

    ``sink_path`` adds the records-per-epoch section; ``data_docs_index`` (the
    ``index.html`` of the restart checks' Data Docs) is linked relative to ``out_dir``.
    May be called any number of times; each call replaces the file.
    """
    if not isinstance(title, str) or not title.strip():
        raise InvalidParameterError("title", title, "a non-empty title")
    folder = Path(out_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    data = collect_report_data(state_store, sink_path)
    page = render_html(data, title=title, data_docs_href=_docs_href(data_docs_index, folder))
    target = folder / REPORT_FILE
    partial = folder / f".{REPORT_FILE}.tmp"
    partial.write_text(page, encoding="utf-8")
    os.replace(partial, target)
    return target
