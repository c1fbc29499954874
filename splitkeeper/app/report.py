"""The ``report`` use case: the pipeline's run report."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from splitkeeper.app.assembly import _named, _state_store, reports_dir
from splitkeeper.config.settings import PipelineConfig

if TYPE_CHECKING:
    pass

log = logging.getLogger("splitkeeper.app")


@_named
def report(config: PipelineConfig, title: str | None = None) -> Path:
    """Render the pipeline's run report (HTML with charts); returns its path."""
    from splitkeeper.app.sink import sink_reader
    from splitkeeper.report.html import render_report

    out = reports_dir(config)
    docs = out / "data_docs" / "index.html"
    return render_report(
        _state_store(config),
        out,
        sink=sink_reader(config),
        title=title or f"splitkeeper run report: {config.name}",
        data_docs_index=docs if docs.exists() else None,
    )
