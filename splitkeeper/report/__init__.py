"""The run report: a self-contained HTML page with inline SVG charts and tables.

:func:`render_report` reads a pipeline's Delta state (and optionally its sink) and
writes ``report.html``; :func:`render_html` renders already-collected data.
"""

from splitkeeper.report.html import REPORT_FILE, render_html, render_report

__all__ = ["REPORT_FILE", "render_html", "render_report"]
