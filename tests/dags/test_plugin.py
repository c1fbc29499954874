"""The Airflow plugin through the real Airflow API server: its pages behind Airflow's auth manager
(401 without a token, 403 for a user who may not read the DAG, the page for one who may), the
"Run report" link of a report task pointing at that run's kept report, Data Docs served, and no
file written by a GET. Reports come from a real Delta state (no Spark); the DAG runs are real
``dag.test()`` runs in the SQLite metadata database the API server reads."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urljoin

import pytest

from splitkeeper.report import REPORT_FILE, render_report
from splitkeeper.report.html import INDEX_FILE, RUNS_DIR, run_report
from tests.dags.auth_manager import HIDDEN_DAG_ENV, OUTSIDER
from tests.report.states import PIPELINE, incident_state, phases_of

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "splitkeeper_plugin_check"
PASSWORDS = {"admin": "admin-pass", OUTSIDER: "outsider-pass"}


def _check_dag():
    """A DAG shaped like splitkeeper's: ``report`` returns the page kept for its run (the value
    :func:`splitkeeper.airflow.tasks.report` returns), ``other`` returns something else."""
    import pendulum
    from airflow.sdk import DAG, task

    with DAG(
        DAG_ID, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), tags=["splitkeeper"]
    ) as dag:

        @task
        def report(params: dict | None = None) -> str:
            return str((params or {})["page"])

        @task
        def other() -> dict:
            return {"rows": 3}

        report()
        other()
    # what the DAG processor does with a parsed DAG file: the serialized DAG the API server reads
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session
        )
    return dag


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api_server(airflow_db, tmp_path):
    """``airflow api-server`` on the test session's metadata database, with the auth manager of
    tests/dags/auth_manager.py and two users: ``admin`` and ``outsider`` (a viewer kept out of
    DAG_ID); yields a function that waits until it answers and returns its base URL (the
    server starts while the test prepares its runs)."""
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.dags.auth_manager.OneDagHiddenAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,{OUTSIDER}:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API_AUTH__JWT_SECRET": "plugin-test-jwt-secret",
        "AIRFLOW__API__SECRET_KEY": "plugin-test-secret",
        "SPLITKEEPER_REPORTS_DIR": str(tmp_path / "reports"),
        HIDDEN_DAG_ENV: DAG_ID,
    }
    log = (tmp_path / "api-server.log").open("w")
    argv = [str(Path(sys.executable).with_name("airflow")), "api-server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def ready() -> str:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "api-server.log").read_text()[-3000:]
            try:
                if httpx.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200:
                    return base
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "api-server.log").read_text()[-3000:]
            time.sleep(0.5)

    try:
        yield ready
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def _two_runs_of_reports(tmp_path: Path) -> tuple[Path, Path]:
    """Two pipeline runs, each followed by its report (as the report task renders it): the kept
    page of each run. Data Docs exist beside them."""
    from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for

    out = tmp_path / "reports" / PIPELINE
    docs = out / "data_docs" / "index.html"
    docs.parent.mkdir(parents=True)
    docs.write_text("<html><body>restart checks: data docs</body></html>")
    store = incident_state(tmp_path, checkpoints=3, end=100, regional_at=2, aborted_at=99)
    first = run_report(render_report(store, out, title="run one", data_docs_index=docs))
    latest = store.latest_checkpoint()
    assert latest is not None and latest.enumerator is not None
    second_run = DeltaStateStore(tmp_path / "state", PIPELINE, "files:/orders")
    nxt = replace(latest, checkpoint_id=4, enumerator=replace(latest.enumerator, checkpoint_id=4))
    second_run.commit_checkpoint(decision_for(nxt), phases_ms=phases_of(4))
    second = run_report(render_report(second_run, out, title="run two", data_docs_index=docs))
    assert first != second and first.parent.parent == second.parent.parent == out / RUNS_DIR
    assert store.run_id in first.parent.name and second_run.run_id in second.parent.name
    return first, second


def test_plugin_pages_behind_the_auth_manager_link_each_run_and_write_nothing(api_server, tmp_path):
    import httpx

    from splitkeeper.airflow import plugin
    from splitkeeper.report import html

    # the plugin names the report's files without importing the report package
    assert (plugin.REPORT_FILE, plugin.RUNS_DIR, plugin.SUMMARY_FILE) == (
        html.REPORT_FILE,
        html.RUNS_DIR,
        html.SUMMARY_FILE,
    )
    first, second = _two_runs_of_reports(tmp_path)
    dag = _check_dag()
    runs = [dag.test(run_conf={"page": str(page)}) for page in (first, second)]
    assert [r.state for r in runs] == ["success", "success"]
    base = api_server()

    def token(user: str) -> str:
        got = httpx.post(f"{base}/auth/token", json={"username": user, "password": PASSWORDS[user]})
        assert got.status_code == 201, got.text
        return str(got.json()["access_token"])

    admin = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token('admin')}"})
    outsider = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token(OUTSIDER)}"})
    anonymous = httpx.Client(base_url=base)

    # the link of each run's report task: that run's kept page; none on the other task
    pages = []
    for run, page in zip(runs, (first, second), strict=True):
        links = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}/taskInstances/report/links")
        assert links.status_code == 200, links.text
        link = links.json()["extra_links"]["Run report"]
        assert link and link.startswith("/splitkeeper/report/"), links.text
        other = admin.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run.run_id}/taskInstances/other/links")
        assert other.status_code == 200 and not other.json()["extra_links"].get("Run report"), other.text

        assert anonymous.get(link).status_code == 401
        denied = outsider.get(link)
        assert denied.status_code == 403, denied.text
        shown = admin.get(link, follow_redirects=True)
        assert shown.status_code == 200, shown.text
        assert shown.text == page.read_text(encoding="utf-8")  # that run's kept page, not the latest
        assert str(shown.url).endswith(f"/{RUNS_DIR}/{page.parent.name}/{REPORT_FILE}")
        pages.append(shown)
    assert "<title>run one</title>" in pages[0].text and "<title>run two</title>" in pages[1].text

    # Data Docs and the runs index, where the kept page's relative links point
    hrefs = re.findall(r'href="([^"#]+)"', pages[0].text)
    docs = next(h for h in hrefs if h.endswith("data_docs/index.html"))
    docs_url = urljoin(str(pages[0].url), docs)
    assert admin.get(docs_url).text == "<html><body>restart checks: data docs</body></html>"
    assert outsider.get(docs_url).status_code == 403 and anonymous.get(docs_url).status_code == 401
    runs_index = admin.get(urljoin(str(pages[0].url), "../../index.html"))
    assert runs_index.status_code == 200 and first.parent.name in runs_index.text
    assert admin.get(f"/splitkeeper/dags/{DAG_ID}/%2E%2E/%2E%2E/summary.json").status_code == 404
    assert admin.get(f"/splitkeeper/report/{DAG_ID}/no-such-run").status_code == 404

    # the pipelines page covers every pipeline: all-DAG read access; rendered, not written
    reports = tmp_path / "reports"
    before = {p: p.stat().st_mtime_ns for p in reports.rglob("*")}
    assert anonymous.get("/splitkeeper/pipelines").status_code == 401
    assert outsider.get("/splitkeeper/pipelines").status_code == 403
    index = admin.get("/splitkeeper/pipelines")
    assert index.status_code == 200 and f'href="{PIPELINE}/report.html"' in index.text
    assert (
        admin.get(f"/splitkeeper/{PIPELINE}/report.html").text
        == (reports / PIPELINE / REPORT_FILE).read_text()
    )
    assert outsider.get(f"/splitkeeper/{PIPELINE}/report.html").status_code == 403
    assert {p: p.stat().st_mtime_ns for p in reports.rglob("*")} == before  # no GET wrote a file
    assert (reports / INDEX_FILE).is_file()  # written by the report task, not by the GETs
