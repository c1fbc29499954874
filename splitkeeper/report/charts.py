"""Inline SVG charts for the run report: pure functions from numbers to SVG text.

No plotting library and no network: every chart is a self-contained ``<svg>`` element
with ``role="img"``, a ``<title>`` and a ``<desc>`` (what the chart shows, in words),
axis labels and a legend; colours come from the Okabe-Ito palette (distinguishable
with colour-vision deficiencies) and kinds also differ by shape. The report puts a
table with the same numbers beside each chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito
BLUE = "#0072B2"
ORANGE = "#E69F00"
GREEN = "#009E73"
VERMILLION = "#D55E00"
SKY = "#56B4E9"
PURPLE = "#CC79A7"
GREY = "#8c8c8c"
INK = "#1f2328"
GRID = "#d0d7de"

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif"


@dataclass(frozen=True, slots=True)
class Series:
    """One named series of a bar chart: one value per category."""

    name: str
    values: tuple[float, ...]
    color: str


@dataclass(frozen=True, slots=True)
class TimelineMark:
    """One checkpoint attempt on the timeline: its kind and, per region, outcome and ref."""

    checkpoint_id: int
    kind: str  # "global" | "regional" | "aborted"
    outcomes: dict[int, str]  # region -> "ack" | "decline" | "timeout"
    refs: dict[int, int]  # failed region -> ref_checkpoint_id


KIND_COLORS = {"global": GREEN, "regional": ORANGE, "aborted": VERMILLION}
OUTCOME_COLORS = {"ack": "#cdeedd", "decline": ORANGE, "timeout": PURPLE}


def axis_scale(max_value: float, intervals: int = 4) -> tuple[float, float]:
    """(axis maximum, tick step) for data up to ``max_value``: the step is 1, 2 or 5 times a
    power of ten, chosen so that about ``intervals`` steps cover the data; (1, 1) for no data."""
    if max_value <= 0:
        return 1.0, 1.0
    raw = max_value / intervals
    exponent = math.floor(math.log10(raw))
    step = float(10 ** (exponent + 1))
    for factor in (1, 2, 5):
        candidate = factor * 10.0**exponent
        if candidate >= raw - 1e-12:
            step = candidate
            break
    return step * math.ceil(max_value / step - 1e-9), step


def _fmt(value: float) -> str:
    if abs(value - round(value)) < 1e-9:
        return f"{round(value):,}"
    return f"{value:,.1f}"


def _open(chart_id: str, width: int, height: int, title: str, desc: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{chart_id}" class="chart" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc" style="{FONT}">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(desc)}</desc>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="15" font-weight="600" '
        f'fill="{INK}">{escape(title)}</text>',
    ]


def _legend(items: Sequence[tuple[str, str, str]], x: float, y: float) -> list[str]:
    """A horizontal legend of (label, colour, shape) with shape in square|circle|diamond|cross."""
    out = ['<g class="legend">']
    cursor = x
    for label, color, shape in items:
        out.append(_marker(shape, cursor + 6, y - 4, 6, color))
        out.append(
            f'<text x="{cursor + 16:.0f}" y="{y:.0f}" font-size="12" fill="{INK}">{escape(label)}</text>'
        )
        cursor += 28 + 7 * len(label)
    out.append("</g>")
    return out


def _marker(shape: str, cx: float, cy: float, r: float, color: str, title: str = "") -> str:
    tip = f"<title>{escape(title)}</title>" if title else ""
    if shape == "circle":
        return f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="{r:.1f}" fill="{color}">{tip}</circle>'
    if shape == "diamond":
        points = f"{cx:.1f},{cy - r:.1f} {cx + r:.1f},{cy:.1f} {cx:.1f},{cy + r:.1f} {cx - r:.1f},{cy:.1f}"
        return f'<polygon points="{points}" fill="{color}">{tip}</polygon>'
    if shape == "cross":
        d = r * 0.8
        return (
            f'<path d="M{cx - d:.1f},{cy - d:.1f} L{cx + d:.1f},{cy + d:.1f} M{cx - d:.1f},{cy + d:.1f} '
            f'L{cx + d:.1f},{cy - d:.1f}" stroke="{color}" stroke-width="3" fill="none">{tip}</path>'
        )
    return (
        f'<rect x="{cx - r:.1f}" y="{cy - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" '
        f'fill="{color}">{tip}</rect>'
    )


def _y_axis(
    left: float, top: float, bottom: float, right: float, scale: tuple[float, float], label: str
) -> list[str]:
    y_max, step = scale
    out = []
    for i in range(round(y_max / step) + 1):
        value = step * i
        y = bottom - (bottom - top) * value / y_max
        out.append(f'<line x1="{left:.0f}" y1="{y:.1f}" x2="{right:.0f}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{left - 6:.0f}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="{INK}">{_fmt(value)}</text>'
        )
    mid = (top + bottom) / 2
    out.append(
        f'<text x="14" y="{mid:.0f}" font-size="12" text-anchor="middle" fill="{INK}" '
        f'transform="rotate(-90 14 {mid:.0f})" class="axis-label">{escape(label)}</text>'
    )
    out.append(f'<line x1="{left:.0f}" y1="{top:.0f}" x2="{left:.0f}" y2="{bottom:.0f}" stroke="{INK}"/>')
    out.append(f'<line x1="{left:.0f}" y1="{bottom:.0f}" x2="{right:.0f}" y2="{bottom:.0f}" stroke="{INK}"/>')
    return out


def _x_label(text: str, width: int, y: float) -> str:
    return (
        f'<text x="{width / 2:.0f}" y="{y:.0f}" font-size="12" text-anchor="middle" fill="{INK}" '
        f'class="axis-label">{escape(text)}</text>'
    )


def _labelled(i: int, n: int, every: int) -> bool:
    """Whether category ``i`` of ``n`` gets a label: every ``every``-th, and the last one when it is
    not too close to the one before (the latest checkpoint is always named where there is room)."""
    return i % every == 0 or (i == n - 1 and i % every >= every / 2 + 0.5)


def _every(n: int, room: int) -> int:
    """Label every k-th of ``n`` categories so that at most ``room`` labels are drawn."""
    return max(1, math.ceil(n / max(1, room)))


def bar_chart(
    chart_id: str,
    title: str,
    desc: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    width: int = 560,
    height: int = 300,
    reference: tuple[str, float] | None = None,
) -> str:
    """A grouped bar chart; ``reference`` = (label, value) draws a dashed horizontal line."""
    left, right, top, bottom = 64, width - 16, 58, height - 46
    values = [v for s in series for v in s.values]
    scale = axis_scale(max([*values, reference[1] if reference else 0.0, 0.0]))
    y_max = scale[0]
    out = _open(chart_id, width, height, title, desc)
    out += _legend([(s.name, s.color, "square") for s in series], left, 42)
    out += _y_axis(left, top, bottom, right, scale, y_label)
    n = max(1, len(categories))
    slot = (right - left) / n
    group = slot * 0.8
    bar = group / max(1, len(series))
    every = _every(len(categories), int((right - left) / 34))
    for i, category in enumerate(categories):
        x0 = left + slot * i + (slot - group) / 2
        for j, s in enumerate(series):
            value = s.values[i] if i < len(s.values) else 0.0
            h = (bottom - top) * value / y_max
            out.append(
                f'<rect class="bar" x="{x0 + bar * j:.1f}" y="{bottom - h:.1f}" '
                f'width="{max(bar - 1, 1):.1f}" '
                f'height="{h:.1f}" fill="{s.color}"><title>{escape(s.name)}, {escape(category)}: '
                f"{_fmt(value)}</title></rect>"
            )
        if i % every == 0:
            out.append(
                f'<text x="{left + slot * (i + 0.5):.1f}" y="{bottom + 15:.0f}" font-size="11" '
                f'text-anchor="middle" fill="{INK}">{escape(category)}</text>'
            )
    if reference is not None:
        label, value = reference
        y = bottom - (bottom - top) * value / y_max
        out.append(
            f'<line class="reference" x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="{INK}" '
            'stroke-dasharray="5 4"/>'
        )
        out.append(
            f'<text x="{right - 4}" y="{y - 5:.1f}" font-size="11" text-anchor="end" fill="{INK}">'
            f"{escape(label)}</text>"
        )
    out.append(_x_label(x_label, width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


def hbar_chart(
    chart_id: str,
    title: str,
    desc: str,
    items: Sequence[tuple[str, float]],
    *,
    x_label: str,
    y_label: str,
    color: str = BLUE,
    width: int = 560,
) -> str:
    """Horizontal bars, one per (label, value), in the order given."""
    row = 24
    left, right, top = 230, width - 50, 44
    height = top + row * max(1, len(items)) + 46
    bottom = height - 46
    x_max, step = axis_scale(max([v for _, v in items] + [0.0]))
    out = _open(chart_id, width, height, title, desc)
    for i in range(round(x_max / step) + 1):
        x = left + (right - left) * step * i / x_max
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{GRID}"/>')
        out.append(
            f'<text x="{x:.1f}" y="{bottom + 15}" font-size="11" text-anchor="middle" fill="{INK}">'
            f"{_fmt(step * i)}</text>"
        )
    for i, (label, value) in enumerate(items):
        y = top + row * i
        w = (right - left) * value / x_max
        out.append(
            f'<text x="{left - 8}" y="{y + row / 2 + 4:.1f}" font-size="12" text-anchor="end" fill="{INK}">'
            f"{escape(label)}</text>"
        )
        out.append(
            f'<rect class="bar" x="{left}" y="{y + 4:.1f}" width="{w:.1f}" height="{row - 8}" fill="{color}">'
            f"<title>{escape(label)}: {_fmt(value)}</title></rect>"
        )
        out.append(
            f'<text x="{left + w + 5:.1f}" y="{y + row / 2 + 4:.1f}" font-size="11" fill="{INK}">'
            f"{_fmt(value)}</text>"
        )
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="{INK}"/>')
    out.append(
        f'<text x="14" y="{(top + bottom) / 2:.0f}" font-size="12" text-anchor="middle" fill="{INK}" '
        f'transform="rotate(-90 14 {(top + bottom) / 2:.0f})" class="axis-label">{escape(y_label)}</text>'
    )
    out.append(_x_label(x_label, width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


KIND_SHAPES = {"global": "circle", "regional": "diamond", "aborted": "cross"}


@dataclass(frozen=True, slots=True)
class TimelineBucket:
    """Checkpoint attempts ``first``..``last`` older than the drawn window, counted by kind."""

    first: int
    last: int
    counts: dict[str, int]  # kind -> attempts ("global" | "regional" | "aborted")


#: The timeline's width in pixels; the older attempts' strip takes OLDER_WIDTH of it.
TIMELINE_WIDTH = 1180
OLDER_WIDTH = 260


def timeline_chart(
    chart_id: str,
    title: str,
    desc: str,
    marks: Sequence[TimelineMark],
    *,
    older: Sequence[TimelineBucket] = (),
    width: int = TIMELINE_WIDTH,
) -> str:
    """One column per checkpoint attempt of the window ``marks``: a kind mark on top, then one cell per
    region; to their left, when ``older`` is given, the older attempts as stacked bars per bucket.

    A region's cell is coloured by its outcome; a failed region's cell shows the id of the
    checkpoint its state refers to (``→ref``) and, when that checkpoint is in the window, an
    arrow to it. The size of the SVG depends on the window and the buckets, not on the history.
    """
    regions = sorted({r for m in marks for r in m.outcomes})
    left, top = 92, 78
    row = 26
    body_bottom = top + 30 + row * max(1, len(regions))
    height = int(body_bottom + 52)
    strip = OLDER_WIDTH if older else 0
    x0 = left + strip + (24 if older else 0)
    n = max(1, len(marks))
    cell = max(8.0, min(56.0, (width - x0 - 16) / n))
    out = _open(chart_id, width, height, title, desc)
    out.append(_arrow_defs(chart_id, 6))
    out += _legend(
        [(k, c, KIND_SHAPES[k]) for k, c in KIND_COLORS.items()]
        + [
            ("ack", OUTCOME_COLORS["ack"], "square"),
            ("decline", ORANGE, "square"),
            ("timeout", PURPLE, "square"),
        ],
        left,
        44,
    )
    out.append(
        f'<text x="{left - 8}" y="{top + 4}" font-size="12" text-anchor="end" fill="{INK}">checkpoint</text>'
    )
    for j, region in enumerate(regions):
        y = top + 30 + row * j
        out.append(
            f'<text x="{left - 8}" y="{y + row / 2 + 4:.1f}" font-size="12" text-anchor="end" '
            f'fill="{INK}">region {region}</text>'
        )
    if older:
        out += _older_strip(older, left, top - 10, strip, body_bottom, height)
    column = {mark.checkpoint_id: i for i, mark in enumerate(marks)}
    every = _every(len(marks), int((width - x0) / 34))
    for i, mark in enumerate(marks):
        cx = x0 + cell * (i + 0.5)
        failed = {r: o for r, o in mark.outcomes.items() if o != "ack"}
        tip = f"checkpoint {mark.checkpoint_id}: {mark.kind}"
        if failed:
            tip += "; failed " + ", ".join(
                f"region {r} ({o}{', ref ' + str(mark.refs[r]) if r in mark.refs else ''})"
                for r, o in sorted(failed.items())
            )
        out.append(f'<g class="mark" data-checkpoint="{mark.checkpoint_id}" data-kind="{mark.kind}">')
        out.append(
            _marker(
                KIND_SHAPES.get(mark.kind, "square"),
                cx,
                top,
                min(8.0, cell / 2.5),
                KIND_COLORS.get(mark.kind, GREY),
                tip,
            )
        )
        for j, region in enumerate(regions):
            y = top + 30 + row * j
            outcome = mark.outcomes.get(region)
            if outcome is None:
                continue
            fill = OUTCOME_COLORS.get(outcome, GREY)
            out.append(
                f'<rect x="{cx - cell / 2 + 1:.1f}" y="{y + 2}" width="{cell - 2:.1f}" height="{row - 4}" '
                f'fill="{fill}" stroke="#ffffff"><title>checkpoint {mark.checkpoint_id}, region {region}: '
                f"{escape(outcome)}{', ref ' + str(mark.refs[region]) if region in mark.refs else ''}"
                "</title></rect>"
            )
            if region in mark.refs and cell >= 22:
                out.append(
                    f'<text x="{cx:.1f}" y="{y + row / 2 + 4:.1f}" font-size="10" text-anchor="middle" '
                    f'fill="{INK}">→{mark.refs[region]}</text>'
                )
        out.append("</g>")
        for j, region in enumerate(regions):
            ref = mark.refs.get(region)
            if ref is None or ref not in column or column[ref] == i:
                continue
            y = top + 30 + row * j + 4
            rx = x0 + cell * (column[ref] + 0.5)
            out.append(
                f'<path class="ref" d="M{cx:.1f},{y:.1f} Q{(cx + rx) / 2:.1f},{y - 14:.1f} {rx:.1f},{y:.1f}" '
                f'stroke="{INK}" stroke-width="1.2" fill="none" marker-end="url(#{chart_id}-arrow)">'
                f"<title>checkpoint {mark.checkpoint_id}, region {region}: state of checkpoint {ref}</title>"
                "</path>"
            )
        if _labelled(i, len(marks), every):
            out.append(
                f'<text x="{cx:.1f}" y="{body_bottom + 16:.0f}" font-size="11" '
                f'text-anchor="middle" fill="{INK}">{mark.checkpoint_id}</text>'
            )
    out.append(_x_label("checkpoint attempt id", width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


def _arrow_defs(chart_id: str, size: int) -> str:
    """An arrowhead marker, ``url(#<chart_id>-arrow)``."""
    return (
        f'<defs><marker id="{chart_id}-arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="{size}" '
        f'markerHeight="{size}" orient="auto-start-reverse"><path d="M0,0 L8,4 L0,8 z" fill="{INK}"/>'
        "</marker></defs>"
    )


def _older_strip(
    buckets: Sequence[TimelineBucket], left: float, top: float, width: float, bottom: float, height: float
) -> list[str]:
    """The attempts before the window: one stacked bar (global, regional, aborted) per bucket."""
    out = ['<g class="older">']
    peak = max((sum(b.counts.values()) for b in buckets), default=1) or 1
    slot = width / max(1, len(buckets))
    first, last = buckets[0].first, buckets[-1].last
    for i, bucket in enumerate(buckets):
        y = bottom
        x = left + slot * i
        for kind in ("global", "regional", "aborted"):
            count = bucket.counts.get(kind, 0)
            if not count:
                continue
            h = (bottom - top) * count / peak
            y -= h
            out.append(
                f'<rect class="bucket" x="{x:.1f}" y="{y:.1f}" width="{max(slot - 1, 1):.1f}" '
                f'height="{h:.1f}" '
                f'fill="{KIND_COLORS[kind]}"><title>checkpoints {bucket.first}-{bucket.last}: '
                + ", ".join(f"{n} {k}" for k, n in bucket.counts.items() if n)
                + "</title></rect>"
            )
    out.append(
        f'<text x="{left:.0f}" y="{bottom + 16:.0f}" font-size="11" fill="{INK}">{first}</text>'
        f'<text x="{left + width:.0f}" y="{bottom + 16:.0f}" font-size="11" text-anchor="end" '
        f'fill="{INK}">{last}</text>'
        f'<text x="{left + width / 2:.0f}" y="{bottom + 30:.0f}" font-size="11" text-anchor="middle" '
        f'fill="{INK}">earlier attempts, counted per bucket</text>'
    )
    out.append(
        f'<line x1="{left + width + 12:.0f}" y1="{top:.0f}" x2="{left + width + 12:.0f}" '
        f'y2="{height - 26:.0f}" '
        f'stroke="{GRID}" stroke-dasharray="4 3"/>'
    )
    out.append("</g>")
    return out


def line_chart(
    chart_id: str,
    title: str,
    desc: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    width: int = 720,
    height: int = 320,
) -> str:
    """One line per series over ``categories`` (NaN: no point there), each with its own marker shape."""
    left, right, top, bottom = 72, width - 16, 58, height - 46
    values = [v for s in series for v in s.values if not math.isnan(v)]
    scale = axis_scale(max([*values, 0.0]))
    y_max = scale[0]
    out = _open(chart_id, width, height, title, desc)
    shapes = ("circle", "square", "diamond", "cross")
    out += _legend([(s.name, s.color, shapes[i % len(shapes)]) for i, s in enumerate(series)], left, 42)
    out += _y_axis(left, top, bottom, right, scale, y_label)
    n = max(1, len(categories))
    slot = (right - left) / n
    for k, s in enumerate(series):
        path: list[str] = []
        points: list[str] = []
        for i, value in enumerate(s.values):
            if math.isnan(value):
                continue
            x = left + slot * (i + 0.5)
            y = bottom - (bottom - top) * value / y_max
            path.append(f"{'M' if not path else 'L'}{x:.1f},{y:.1f}")
            if n <= 80:
                points.append(
                    _marker(
                        shapes[k % len(shapes)],
                        x,
                        y,
                        3.0,
                        s.color,
                        f"{s.name}, {categories[i]}: {_fmt(value)}",
                    )
                )
        if path:
            out.append(
                f'<path class="line" d="{" ".join(path)}" stroke="{s.color}" stroke-width="2" fill="none">'
                f"<title>{escape(s.name)}</title></path>"
            )
        out += points
    every = _every(len(categories), int((right - left) / 40))
    for i, category in enumerate(categories):
        if _labelled(i, len(categories), every):
            out.append(
                f'<text x="{left + slot * (i + 0.5):.1f}" y="{bottom + 15:.0f}" font-size="11" '
                f'text-anchor="middle" fill="{INK}">{escape(category)}</text>'
            )
    out.append(_x_label(x_label, width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


def stacked_bar_chart(
    chart_id: str,
    title: str,
    desc: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    width: int = 720,
    height: int = 320,
) -> str:
    """One bar per category, the series stacked in order from the bottom."""
    left, right, top, bottom = 72, width - 16, 58, height - 46
    totals = [sum(s.values[i] for s in series if i < len(s.values)) for i in range(len(categories))]
    scale = axis_scale(max([*totals, 0.0]))
    y_max = scale[0]
    out = _open(chart_id, width, height, title, desc)
    out += _legend([(s.name, s.color, "square") for s in series], left, 42)
    out += _y_axis(left, top, bottom, right, scale, y_label)
    n = max(1, len(categories))
    slot = (right - left) / n
    bar = max(slot * 0.8, 1.0)
    for i, category in enumerate(categories):
        x = left + slot * i + (slot - bar) / 2
        y = float(bottom)
        for s in series:
            value = s.values[i] if i < len(s.values) else 0.0
            if value <= 0:
                continue
            h = (bottom - top) * value / y_max
            y -= h
            out.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{s.color}">'
                f"<title>{escape(category)}: {escape(s.name)} {_fmt(value)}</title></rect>"
            )
    every = _every(len(categories), int((right - left) / 40))
    for i, category in enumerate(categories):
        if _labelled(i, len(categories), every):
            out.append(
                f'<text x="{left + slot * (i + 0.5):.1f}" y="{bottom + 15:.0f}" font-size="11" '
                f'text-anchor="middle" fill="{INK}">{escape(category)}</text>'
            )
    out.append(_x_label(x_label, width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


def ref_chain_chart(
    chart_id: str, title: str, desc: str, chains: Mapping[int, Sequence[int]], *, width: int = 720
) -> str:
    """Per region, the checkpoints its state passes through: the latest checkpoint, then each
    checkpoint a failed region's state refers to (an arrow per hop, right to left)."""
    ids = sorted({c for chain in chains.values() for c in chain})
    regions = sorted(chains)
    left, top, row = 92, 70, 34
    height = top + row * max(1, len(regions)) + 50
    right = width - 30
    slot = (right - left) / max(1, len(ids))
    x_of = {cid: left + slot * (i + 0.5) for i, cid in enumerate(ids)}
    out = _open(chart_id, width, height, title, desc)
    out.append(_arrow_defs(chart_id, 7))
    out += _legend(
        [("acknowledged here", GREEN, "circle"), ("state of an earlier checkpoint", ORANGE, "circle")],
        left,
        42,
    )
    for j, region in enumerate(regions):
        y = top + row * j + row / 2
        chain = list(chains[region])
        out.append(
            f'<text x="{left - 8}" y="{y + 4:.1f}" font-size="12" text-anchor="end" fill="{INK}">'
            f"region {region}</text>"
        )
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="{GRID}"/>')
        for a, b in zip(chain, chain[1:], strict=False):
            out.append(
                f'<path class="ref" d="M{x_of[a] - 6:.1f},{y:.1f} L{x_of[b] + 8:.1f},{y:.1f}" stroke="{INK}" '
                f'stroke-width="1.5" marker-end="url(#{chart_id}-arrow)"><title>region {region}: '
                f"checkpoint {a} "
                f"holds the state of checkpoint {b}</title></path>"
            )
        for k, cid in enumerate(chain):
            color = GREEN if k == len(chain) - 1 else ORANGE
            out.append(_marker("circle", x_of[cid], y, 6, color, f"region {region}, checkpoint {cid}"))
    for cid in ids:
        out.append(
            f'<text x="{x_of[cid]:.1f}" y="{height - 30}" font-size="11" text-anchor="middle" '
            f'fill="{INK}">{cid}</text>'
        )
    out.append(_x_label("checkpoint id", width, height - 10))
    out.append("</svg>")
    return "\n".join(out)


def backlog_chart(
    chart_id: str,
    title: str,
    desc: str,
    points: Sequence[tuple[int, int, bool]],
    *,
    switch_at: int | None,
    width: int = 560,
    height: int = 300,
) -> str:
    """Splits in backlog per checkpoint (a step line), checkpoints processing backlog shaded,
    and a vertical marker where the pipeline switched to the normal interval."""
    left, right, top, bottom = 64, width - 16, 58, height - 46
    scale = axis_scale(max([p[1] for p in points] + [0]))
    y_max = scale[0]
    out = _open(chart_id, width, height, title, desc)
    out += _legend(
        [("splits in backlog", BLUE, "square"), ("processing backlog", "#dbeaf7", "square")]
        + ([("switch to normal interval", INK, "square")] if switch_at is not None else []),
        left,
        42,
    )
    n = max(1, len(points))
    slot = (right - left) / n

    def x_of(i: int) -> float:
        return left + slot * (i + 0.5)

    for i, (_cid, _count, backlog) in enumerate(points):
        if backlog:
            out.append(
                f'<rect class="backlog-band" x="{left + slot * i:.1f}" y="{top}" width="{slot:.1f}" '
                f'height="{bottom - top}" fill="#dbeaf7"/>'
            )
    out += _y_axis(left, top, bottom, right, scale, "splits in backlog")
    if points:
        path = []
        for i, (_cid, count, _b) in enumerate(points):
            y = bottom - (bottom - top) * count / y_max
            path.append(f"{'M' if i == 0 else 'L'}{x_of(i):.1f},{y:.1f}")
        out.append(f'<path d="{" ".join(path)}" stroke="{BLUE}" stroke-width="2.5" fill="none"/>')
        for i, (cid, count, backlog) in enumerate(points):
            y = bottom - (bottom - top) * count / y_max
            state = "processing backlog" if backlog else "normal interval"
            out.append(
                f'<circle cx="{x_of(i):.1f}" cy="{y:.1f}" r="3.5" fill="{BLUE}"><title>checkpoint {cid}: '
                f"{count} split(s) in backlog, {state}</title></circle>"
            )
    every = _every(len(points), int((right - left) / 30))
    for i, (cid, _count, _b) in enumerate(points):
        if i % every == 0:
            out.append(
                f'<text x="{x_of(i):.1f}" y="{bottom + 15}" font-size="11" text-anchor="middle" '
                f'fill="{INK}">{cid}</text>'
            )
    if switch_at is not None:
        index = next((i for i, p in enumerate(points) if p[0] == switch_at), None)
        if index is not None:
            x = left + slot * index
            out.append(
                f'<line class="switch" x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="{INK}" '
                f'stroke-width="2" stroke-dasharray="6 3"/>'
            )
            out.append(
                f'<text x="{x + 4:.1f}" y="{top + 12}" font-size="11" fill="{INK}">'
                f"normal from {switch_at}</text>"
            )
    out.append(_x_label("checkpoint id", width, height - 10))
    out.append("</svg>")
    return "\n".join(out)
