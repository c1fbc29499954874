"""The Airflow plugin: the run report inside the Airflow UI.

- **"Run report" extra link** on the ``report`` task of every splitkeeper DAG run: the
  task returns the report's path (its XCom); the link points at
  ``/splitkeeper/report/<dag_id>/<run_id>``.
- **A FastAPI app** mounted by Airflow's API server under ``/splitkeeper``: it reads that
  XCom from Airflow's metadata database and serves the report file, and
  ``/splitkeeper/pipelines`` serves the pipelines page of ``$SPLITKEEPER_REPORTS_DIR``.
- **A navigation entry** ("splitkeeper reports") to that page.

Registered through the ``airflow.plugins`` entry point of the package (pyproject.toml), so
an installed splitkeeper needs nothing in ``$AIRFLOW_HOME/plugins``. Only files a report
task returned (``report.html``, beside its ``summary.json``) are served: a path from the
URL is never opened.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse

#: The task of every ingest DAG that renders the run report and returns its path.
REPORT_TASK = "report"
URL_PREFIX = "/splitkeeper"


class RunReportLink(BaseOperatorLink):
    """The "Run report" button of a splitkeeper DAG's ``report`` task (empty on other tasks)."""

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        if ti_key.task_id != REPORT_TASK or not str(ti_key.dag_id).startswith("splitkeeper_"):
            return ""
        return f"{URL_PREFIX}/report/{quote(ti_key.dag_id, safe='')}/{quote(ti_key.run_id, safe='')}"


def report_path(dag_id: str, run_id: str) -> Path:
    """The report file the ``report`` task of that run returned; HTTPException 404 when none."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row: Any = session.execute(
            XComModel.get_many(
                run_id=run_id, key="return_value", task_ids=REPORT_TASK, dag_ids=dag_id, limit=1
            ).with_only_columns(XComModel.value)
        ).first()
    if row is None:
        raise HTTPException(404, f"no report for DAG {dag_id!r} run {run_id!r}: its report task has not run")
    value = XComModel.deserialize_value(row)
    path = Path(str(value))
    if path.name != "report.html" or not path.is_file():
        raise HTTPException(404, f"the report of DAG {dag_id!r} run {run_id!r} is gone ({path})")
    return path


app = FastAPI(title="splitkeeper reports", description="run reports of splitkeeper pipelines")


@app.get("/report/{dag_id}/{run_id}")
def report(dag_id: str, run_id: str) -> FileResponse:
    """The run report the ``report`` task of that DAG run wrote."""
    return FileResponse(report_path(dag_id, run_id), media_type="text/html")


@app.get("/pipelines")
def pipelines() -> FileResponse:
    """The pipelines page of ``$SPLITKEEPER_REPORTS_DIR`` (every pipeline reporting there)."""
    from splitkeeper.report.html import INDEX_FILE, render_index

    index = render_index(_reports_root())  # fresh: lists every pipeline reporting there now
    assert index.name == INDEX_FILE
    return FileResponse(index, media_type="text/html")


@app.get("/{pipeline}/report.html")
def pipeline_report(pipeline: str) -> FileResponse:
    """A pipeline's latest report in ``$SPLITKEEPER_REPORTS_DIR`` (the pipelines page links here)."""
    root = Path(_reports_root()).resolve()
    target = (root / pipeline / "report.html").resolve()
    if target.parent.parent != root or not target.is_file():
        raise HTTPException(404, f"no report of pipeline {pipeline!r} in {root}")
    return FileResponse(target, media_type="text/html")


def _reports_root() -> str:
    root = os.environ.get("SPLITKEEPER_REPORTS_DIR")
    if not root or not Path(root).is_dir():
        raise HTTPException(
            404,
            "set SPLITKEEPER_REPORTS_DIR for the API server to the folder the report tasks write to",
        )
    return root


class SplitkeeperPlugin(AirflowPlugin):
    name = "splitkeeper"
    global_operator_extra_links = [RunReportLink()]
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "splitkeeper reports"}]
    external_views = [
        {
            "name": "splitkeeper reports",
            "href": f"{URL_PREFIX}/pipelines",
            "url_route": "splitkeeper-reports",
            "destination": "nav",
            "category": "browse",
        }
    ]
