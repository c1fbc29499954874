"""The run report in a real browser: headless Chromium renders it, shows the charts and tables.

Chromium is Debian's package (``apt-get install -y chromium``; ``scripts/setup.sh``
installs it). Each run gets a fresh profile and no network; the screenshot is decoded
with the standard library (zlib) to check that the page is not blank and that the
charts' colours were painted.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from splitkeeper.core.types import CheckpointKind, RegionOutcome
from splitkeeper.delta.history import TimelineEntry
from splitkeeper.report import render_html
from splitkeeper.report.charts import BLUE, GREEN, ORANGE, VERMILLION
from splitkeeper.report.data import AuditRow, CheckpointFacts, ReportData

pytestmark = pytest.mark.browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and Path("/usr/bin/chromium").exists():
        found = "/usr/bin/chromium"
    if found is None:
        pytest.fail(
            "headless Chromium is needed for the browser tests: install it with "
            "`apt-get install -y chromium` (scripts/setup.sh does), or deselect them with -m 'not browser'"
        )
    return found


def run_chromium(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"profile-{name}"
    profile.mkdir()
    return subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def sample_data() -> ReportData:
    """Twelve attempts of a 4-reader pipeline: backlog until 7, regional and aborted ones."""
    start = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    timeline = []
    checkpoints = []
    for cid in range(1, 13):
        outcomes = dict.fromkeys(range(4), RegionOutcome.ACK)
        refs: dict[int, int] = {}
        kind = CheckpointKind.GLOBAL
        if cid in (4, 5):
            outcomes[2] = RegionOutcome.DECLINE
            refs[2] = 3
            kind = CheckpointKind.REGIONAL
        if cid == 9:
            outcomes[1] = RegionOutcome.TIMEOUT
            kind = CheckpointKind.ABORTED
        at = start + timedelta(seconds=30 * cid)
        commit_ms = 400 + 37 * (cid % 5)
        timeline.append(
            TimelineEntry(
                cid, kind, outcomes, refs, at, None if kind is CheckpointKind.ABORTED else commit_ms
            )
        )
        if kind is not CheckpointKind.ABORTED:
            loads = {0: 5, 1: 1, 2: 1, 3: 1} if cid < 3 else {0: 2, 1: 2, 2: 2, 3: 2}
            checkpoints.append(
                CheckpointFacts(
                    cid, kind, 4, cid < 7, commit_ms, max(0, 8 - cid - 1) if cid < 7 else 0, loads
                )
            )
    audit = [AuditRow(1, i, f"orders-{i}", i % 4, "assigned", "") for i in range(8)]
    audit += [AuditRow(3, i, f"orders-{i + 1}", i + 1, "rebalanced", "from reader 0") for i in range(3)]
    audit += [AuditRow(5, 0, "orders-2", 2, "returned_region_fallback", "region 2 declined")]
    audit += [AuditRow(8, 0, "orders-7", 3, "quarantined", "reads failed 3 epochs in a row: not JSON")]
    return ReportData(
        pipeline="orders",
        state_root="/var/splitkeeper/orders/state",
        generated_at=start + timedelta(hours=1),
        timeline=tuple(timeline),
        checkpoints=tuple(checkpoints),
        audit=tuple(audit),
        sink_path="/var/splitkeeper/orders/sink",
        records={cid: {r: 1000 + 10 * r for r in range(4)} for cid in range(1, 13) if cid != 9},
        parked_positions={"orders-7": 4096},
    )


def png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels) of an 8-bit, non-interlaced RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color_type, _c, _f, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color_type in (2, 6) and interlace == 0, (depth, color_type, interlace)
    channels = 3 if color_type == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows: list[bytearray] = []
    previous = bytearray(stride)
    for y in range(height):
        filter_type = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if filter_type == 1:
                line[i] = (line[i] + left) & 0xFF
            elif filter_type == 2:
                line[i] = (line[i] + up) & 0xFF
            elif filter_type == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif filter_type == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        previous = line
    pixels = [(row[i], row[i + 1], row[i + 2]) for row in rows for i in range(0, stride, channels)]
    return width, height, pixels


def rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


def test_chromium_renders_the_report_with_its_charts_and_tables(tmp_path):
    report = tmp_path / "report.html"
    report.write_text(render_html(sample_data(), title="Orders run report"), encoding="utf-8")
    url = report.as_uri()

    dom = run_chromium(tmp_path, "dom", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    svgs = re.findall(r"<svg\b[^>]*\bid=\"(chart-[a-z]+)\"[^>]*>\s*<title[^>]*>([^<]+)</title>", html)
    assert dict(svgs) == {
        "chart-loads": "Per-reader load before and after rebalance",
        "chart-timeline": "Checkpoint timeline",
        "chart-refs": "Ref chain of checkpoint 5",
        "chart-lag": "Lag per split over checkpoints",
        "chart-backlog": "Backlog progress",
        "chart-decisions": "Recovery decisions",
        "chart-phases": "Checkpoint phase times",
        "chart-records": "Records committed per checkpoint",
    }
    tables = re.findall(r"<table id=\"([a-z-]+)\"><caption>([^<]+)</caption>", html)
    assert [t for t, _ in tables] == [
        "table-loads",
        "table-load-changes",
        "table-timeline",
        "table-failures",
        "table-refs",
        "table-lag",
        "table-backlog",
        "table-decision-counts",
        "table-audit",
        "table-parked",
        "table-phases",
        "table-records",
    ]
    assert html.count('class="mark"') == 12
    assert "Switched from backlog to the normal interval at checkpoint 7." in html

    shot = tmp_path / "report.png"
    run = run_chromium(tmp_path, "shot", f"--screenshot={shot}", "--window-size=1280,2600", url)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    width, height, pixels = png_pixels(shot.read_bytes())
    assert (width, height) == (1280, 2600)
    colours = set(pixels)
    assert len(colours) > 200, f"only {len(colours)} distinct colours: the page looks blank"
    non_white = sum(1 for p in pixels if p != (255, 255, 255))
    assert non_white / len(pixels) > 0.2
    for painted in (BLUE, GREEN, ORANGE):  # bars and marks of the charts were drawn
        assert rgb(painted) in colours, f"no pixel of {painted} in the screenshot"


#: Appended to a rendered page: where the browser laid out the latest checkpoint's mark and the
#: timeline chart, written into the DOM that --dump-dom prints (the report itself has no script).
PROBE = """<script>
const mark = document.querySelector('#chart-timeline g.mark[data-checkpoint="%d"]');
const box = mark ? mark.getBoundingClientRect() : null;
const chart = document.querySelector('#chart-timeline').getBoundingClientRect();
document.body.setAttribute('data-probe', JSON.stringify({
  mark: box && [box.left, box.top, box.width, box.height], chart: [chart.left, chart.right],
  view: [document.documentElement.clientWidth, document.documentElement.scrollWidth],
  marks: document.querySelectorAll('#chart-timeline g.mark').length}));
</script></body>"""


@pytest.mark.parametrize("attempts", [10, 10_000])
def test_the_report_at_10_and_10000_checkpoints_stays_small_and_shows_the_latest_checkpoint(
    tmp_path, attempts
):
    """Issue 23: 1,000 checkpoints drew cells out to x=8085 in an 880-wide view in a 1.2 MB SVG. The
    timeline now draws the latest attempts and counts the older ones: the page stays small and the
    latest checkpoint is laid out inside the chart and the window."""
    import json

    from .states import synthetic_report_data

    html = render_html(synthetic_report_data(attempts), title=f"{attempts} checkpoints")
    size = len(html.encode("utf-8"))
    svgs = re.findall(r"<svg\b.*?</svg>", html, re.S)
    assert size < 450_000, f"{size:,} bytes for {attempts} attempts"
    assert max(len(s.encode("utf-8")) for s in svgs) < 90_000
    [timeline] = [s for s in svgs if 'id="chart-timeline"' in s]
    widths = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="[0-9.]+" width="([0-9.]+)"', timeline)]
    xs = [float(x) for x in re.findall(r'<(?:rect|circle)[^>]* (?:x|cx)="([0-9.]+)"', timeline)]
    assert max(xs) <= 1180 and min(widths) >= 8 - 2  # every cell inside the 1180-wide view, >= 6 px

    page = tmp_path / "report.html"
    page.write_text(html.replace("</body>", PROBE % attempts), encoding="utf-8")
    dom = run_chromium(tmp_path, "probe", "--window-size=1280,1000", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    probe = json.loads(re.search(r'data-probe="([^"]*)"', dom.stdout).group(1).replace("&quot;", '"'))
    left, _top, width, height = probe["mark"]
    assert width > 0 and height > 0, probe
    assert probe["chart"][0] <= left and left + width <= probe["chart"][1], probe  # inside the chart
    assert left + width <= probe["view"][0] and probe["view"][1] <= probe["view"][0], probe  # no side scroll
    assert probe["marks"] == min(attempts, 60)

    shot = tmp_path / "report.png"
    run = run_chromium(tmp_path, "shot", f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    _w, _h, pixels = png_pixels(shot.read_bytes())
    colours = set(pixels)
    for painted in (GREEN, ORANGE, VERMILLION):  # global, regional and aborted marks/bars were drawn
        assert rgb(painted) in colours, f"no pixel of {painted} in the screenshot"
