"""The Airflow plugin: the run reports inside the Airflow UI, behind Airflow's auth manager.

- **"Run report" extra link** on the tasks of splitkeeper's operators whose result is a run report
  (the ingest DAG's ``report``, the recovery DAG's ``resume``, ...): such a task returns the path
  of the page kept for its run (:func:`splitkeeper.airflow.tasks.report`), and the link
  opens that page. On any other task (another DAG's, or one that returned something else) the
  link is empty.
- **A FastAPI app** mounted by Airflow's API server under ``/splitkeeper``:

  - ``/report/<dag_id>/<run_id>?task_id=<task>``: the report that task of that DAG run returned
    (what the link opens) redirects to
    ``/dags/<dag_id>/runs/<run start>-<run id>/report.html``;
  - ``/dags/<dag_id>/<file>``: the files of the reports folder of that DAG's pipeline (the folder
    its report tasks returned a page of): the latest ``report.html``, ``index.html`` (every kept
    run), ``runs/*/report.html`` and the Great Expectations Data Docs under ``data_docs/``; the
    relative links of the pages resolve there;
  - ``/pipelines`` and ``/<pipeline>/...``: the pipelines page of ``$SPLITKEEPER_REPORTS_DIR``
    and the folders it links.

  Every page needs a valid Airflow token (the UI's cookie, or ``Authorization: Bearer``, as the
  REST API): none gets 401. The pages of a DAG need the auth manager's read access to that DAG
  (``is_authorized_dag``, GET), else 403; the pipelines pages, which cover every pipeline of the
  folder, need read access to all DAGs. A GET writes nothing.
- **A navigation entry** ("splitkeeper reports") to the pipelines page.

Registered through the ``airflow.plugins`` entry point of the package (pyproject.toml), so an
installed splitkeeper needs nothing in ``$AIRFLOW_HOME/plugins``. Files are served only from a
folder a report task returned a page of (or ``$SPLITKEEPER_REPORTS_DIR``), never outside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

URL_PREFIX = "/splitkeeper"
# splitkeeper.report.html's names, not imported: every Airflow process (each task too) imports
# the plugins, and the report package brings pyarrow and jinja2
REPORT_FILE = "report.html"
RUNS_DIR = "runs"
SUMMARY_FILE = "summary.json"
#: The XComs looked at for a DAG's reports folder: its latest report tasks' results.
_RECENT_RESULTS = 50


def report_folder(value: Any) -> Path | None:
    """The reports folder of a pipeline when ``value`` (a task's result) is the path of one of
    its report pages (``report.html`` beside ``summary.json``, or ``runs/<run>/report.html``
    under it); else None."""
    if not isinstance(value, str) or not value.endswith(REPORT_FILE):
        return None
    page = Path(value)
    if page.name != REPORT_FILE or not page.is_absolute():
        return None
    folder = page.parent.parent.parent if page.parent.parent.name == RUNS_DIR else page.parent
    return folder if (folder / SUMMARY_FILE).is_file() else None


def _results(dag_id: str, run_id: str | None = None, task_id: str | None = None) -> Iterable[Any]:
    """The ``return_value`` XComs of a DAG's tasks (of one run / task when given), newest first."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    query: Any = select(XComModel.value).where(XComModel.dag_id == dag_id, XComModel.key == "return_value")
    if run_id is not None:
        query = query.where(XComModel.run_id == run_id)
    if task_id is not None:
        query = query.where(XComModel.task_id == task_id)
    query = query.order_by(XComModel.timestamp.desc()).limit(_RECENT_RESULTS)
    with create_session() as session:
        rows = session.execute(query).all()
    return [XComModel.deserialize_value(row) for row in rows]


def run_report_path(dag_id: str, run_id: str, task_id: str | None = None) -> Path:
    """The report page a task of that DAG run returned; HTTPException 404 when none."""
    for value in _results(dag_id, run_id, task_id):
        if report_folder(value) is not None:
            page = Path(value)
            if not page.is_file():
                raise HTTPException(404, f"the report of DAG {dag_id!r} run {run_id!r} is gone ({page})")
            return page
    raise HTTPException(404, f"no report for DAG {dag_id!r} run {run_id!r}: its report task has not run")


def dag_report_folder(dag_id: str) -> Path:
    """The reports folder of the pipeline of ``dag_id``: where its latest report page is."""
    for value in _results(dag_id):
        folder = report_folder(value)
        if folder is not None:
            return folder
    raise HTTPException(404, f"no report of DAG {dag_id!r}: none of its report tasks has run")


def _operators() -> list[type[Any]]:
    """The operator classes the splitkeeper DAGs' report-producing tasks use: ``@task`` functions
    (the standard provider's decorated Python operator) and splitkeeper's own operators
    (``splitkeeper.airflow.operators``, when installed)."""
    classes: list[type[Any]] = []
    try:
        from airflow.providers.standard.decorators.python import _PythonDecoratedOperator

        classes.append(_PythonDecoratedOperator)
    except ImportError:  # pragma: no cover - the standard provider comes with Airflow 3
        pass
    try:
        from airflow.sdk import BaseOperator

        from splitkeeper.airflow import operators as own  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return classes
    for value in vars(own).values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseOperator)
            and value.__module__.startswith("splitkeeper.")
        ):
            classes.append(value)
    return classes


class RunReportLink(BaseOperatorLink):
    """The "Run report" button of a task whose result is a splitkeeper run report (empty on others)."""

    name = "Run report"
    operators = _operators()

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        values = _results(str(ti_key.dag_id), str(ti_key.run_id), str(ti_key.task_id))
        if not any(report_folder(v) is not None for v in values):
            return ""
        dag_id, run_id, task_id = (
            quote(str(v), safe="") for v in (ti_key.dag_id, ti_key.run_id, ti_key.task_id)
        )
        return f"{URL_PREFIX}/report/{dag_id}/{run_id}?task_id={task_id}"


def _file_in(folder: Path, relative: str) -> Path:
    """``folder/relative`` when it is a file inside ``folder`` (no ``..``, no hidden file)."""
    root = folder.resolve()
    target = (root / relative).resolve()
    if (
        not target.is_relative_to(root)
        or any(part.startswith(".") for part in target.relative_to(root).parts)
        or not target.is_file()
    ):
        raise HTTPException(404, f"no file {relative!r} in {root}")
    return target


async def read_access(request: Request) -> None:
    """Airflow's own check of the REST API's DAG routes (``requires_access_dag("GET")`` with the
    user of ``get_user``: the token from the ``Authorization`` header or the UI's cookie): 401
    without a valid token, 403 unless the auth manager lets the user read the DAG of the path
    (``{dag_id}``), or every DAG where the path names none. Imported on the first request: the
    API server's security module takes a second to import, and every Airflow process (each task
    too) imports the plugins."""
    from airflow.api_fastapi.core_api.security import (
        bearer_scheme,
        get_user,
        oauth2_scheme,
        requires_access_dag,
    )
    from starlette.concurrency import run_in_threadpool

    user = await get_user(request, await oauth2_scheme(request), await bearer_scheme(request))
    await run_in_threadpool(requires_access_dag("GET"), request, user)


app = FastAPI(title="splitkeeper reports", description="run reports of splitkeeper pipelines")
_READ_DAG = Depends(read_access)


@app.get("/report/{dag_id}/{run_id}", dependencies=[_READ_DAG])
def report(dag_id: str, run_id: str, task_id: str | None = None) -> RedirectResponse:
    """The report of that DAG run (the one ``task_id`` returned, when given): a redirect to its
    page under ``/dags/<dag_id>/`` (relative, so it works wherever the API server mounts the app)."""
    page = run_report_path(dag_id, run_id, task_id)
    folder = report_folder(str(page))
    assert folder is not None  # run_report_path returns report pages only
    relative = page.relative_to(folder).as_posix()
    return RedirectResponse(f"../../dags/{quote(dag_id, safe='')}/{relative}", status_code=307)


@app.get("/dags/{dag_id}/{relative:path}", dependencies=[_READ_DAG])
def dag_file(dag_id: str, relative: str) -> FileResponse:
    """A file of the reports folder of the DAG's pipeline (pages, run pages, Data Docs)."""
    return FileResponse(_file_in(dag_report_folder(dag_id), relative or REPORT_FILE))


@app.get("/pipelines", dependencies=[_READ_DAG])
def pipelines() -> HTMLResponse:
    """The pipelines page of ``$SPLITKEEPER_REPORTS_DIR`` (every pipeline reporting there now),
    rendered for this request: nothing is written."""
    from splitkeeper.report.html import index_html

    return HTMLResponse(index_html(_reports_root()))


@app.get("/{pipeline}/{relative:path}", dependencies=[_READ_DAG])
def pipeline_file(pipeline: str, relative: str) -> FileResponse:
    """A file of a pipeline's folder in ``$SPLITKEEPER_REPORTS_DIR`` (the pipelines page links here)."""
    root = Path(_reports_root()).resolve()
    return FileResponse(_file_in(root, f"{pipeline}/{relative or REPORT_FILE}"))


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
    operator_extra_links = [RunReportLink()]
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
