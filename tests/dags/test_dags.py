"""The DAGs as users run them: real DAG runs (dag.test) on a SQLite metadata DB, real Spark and Delta."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest

from splitkeeper.commands import run as run_command
from tests.dags.conftest import REPO, load_dag

pytestmark = [pytest.mark.airflow]


def _write_pipeline(root: Path, *, files: int = 3, lines: int = 200, parallelism: int = 2) -> Path:
    subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "make_files.py"),
            str(root / "in"),
            "--files",
            str(files),
            "--lines",
            str(lines),
            "--format",
            "lines",
        ],
        check=True,
        capture_output=True,
    )
    config = root / "pipeline.yaml"
    config.write_text(
        f"""
name: dagtest
parallelism: {parallelism}
strategy: least-loaded
source: {{kind: files, path: in, format: lines}}
checkpoint: {{max_consecutive_failures: 2, max_failure_ratio: 0.5, region_timeout_s: 30}}
backlog: {{backlog_epoch_records: 400, normal_epoch_records: 400}}
state: {{path: state}}
sink: {{path: sink}}
notifications: {{on_failure: "tests.dags.alerts:record"}}
""",
        encoding="utf-8",
    )
    return config


def test_dag_files_only_wire_tasks_and_import_no_spark(tmp_path):
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from tests.dags.conftest import load_dag\n"
        "names = [f'splitkeeper_{n}' for n in ('ingest', 'recover', 'rescale', 'maintain')]\n"
        "dags = {n: load_dag(n) for n in names}\n"
        "ids = {n: [t.task_id for t in d.topological_sort()] for n, d in dags.items()}\n"
        "pools = {n: {t.task_id: t.pool for t in d.tasks} for n, d in dags.items()}\n"
        "uris = lambda t: sorted(a.uri for a in t.outlets)\n"
        "outlets = {n: {t.task_id: uris(t) for t in d.tasks} for n, d in dags.items()}\n"
        "docs = {n: bool(d.doc_md and 'splitkeeper' in d.doc_md) for n, d in dags.items()}\n"
        "out = dict(ids=ids, pools=pools, outlets=outlets, docs=docs, spark='pyspark' in sys.modules)\n"
        "import json; print(json.dumps(out))\n"
    )
    env = {**os.environ, "SPLITKEEPER_PIPELINE_CONFIG": str(_write_pipeline(tmp_path, files=1, lines=1))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["spark"] is False  # parsing a DAG file never starts or imports Spark
    # every task that writes the pipeline's state is in its one-slot pool; the others are not
    writers = {"splitkeeper_ingest": "run_epochs", "splitkeeper_recover": "reassign_and_rebalance"}
    writers["splitkeeper_rescale"] = "redistribute"
    writers["splitkeeper_maintain"] = "maintain"
    for name, pools in result["pools"].items():
        assert {t for t, pool in pools.items() if pool == "splitkeeper-dagtest"} == {writers[name]}, pools
    # the writing task's outlets are the sink and state tables (lineage in the UI); every DAG has its doc
    sink, state = f"file://{tmp_path / 'sink'}", f"file://{tmp_path / 'state'}"
    for name, outlets in result["outlets"].items():
        assert {t: uris for t, uris in outlets.items() if uris} == {writers[name]: sorted([sink, state])}
    assert result["docs"] == dict.fromkeys(writers, True)
    # the ingest DAG opens the pipeline once: recovery, discovery and epochs are one task
    assert result["ids"]["splitkeeper_ingest"] == ["run_epochs", "validate", "report"]
    assert result["ids"]["splitkeeper_recover"] == [
        "restore_enumerator_state",
        "collect_reader_reports",
        "classify_splits",
        "reassign_and_rebalance",
        "validate",
        "resume",
    ]
    ingest, recover = load_dag("splitkeeper_ingest"), load_dag("splitkeeper_recover")
    assert ingest.max_active_runs == 1
    assert recover.schedule is None if hasattr(recover, "schedule") else True


def test_several_pipelines_get_their_own_dags_pools_and_config_paths(tmp_path, monkeypatch):
    # SPLITKEEPER_PIPELINE_CONFIG naming two files (':'-separated, like PATH): one set of DAGs each
    import importlib.util

    paths = []
    for name in ("left", "right"):
        folder = tmp_path / name
        folder.mkdir()
        path = _write_pipeline(folder, files=1, lines=1)
        path.write_text(path.read_text().replace("name: dagtest", f"name: p-{name}"))
        paths.append(path)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", os.pathsep.join(map(str, paths)))
    monkeypatch.setenv("SPLITKEEPER_SPARK_MASTER", "spark://spark-master:7077")
    spec = importlib.util.spec_from_file_location(
        "dag_ingest_several", REPO / "dags" / "splitkeeper_ingest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert sorted(module.dags) == ["splitkeeper_ingest__p-left", "splitkeeper_ingest__p-right"]
    for name, path in zip(("left", "right"), paths, strict=True):
        task = module.dags[f"splitkeeper_ingest__p-{name}"].get_task("run_epochs")
        assert task.pool == f"splitkeeper-p-{name}"
        assert task.application_args[:2] == ["--config", str(path)]  # the job gets its own pipeline


def test_on_a_cluster_master_the_epoch_task_submits_the_packaged_epoch_job(monkeypatch):
    from splitkeeper import resources

    monkeypatch.setenv("SPLITKEEPER_SPARK_MASTER", "spark://spark-master:7077")
    task = load_dag("splitkeeper_ingest").get_task("run_epochs")
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from splitkeeper.airflow.spark_submit import EpochJobSubmitOperator

    assert type(task) is EpochJobSubmitOperator and isinstance(task, SparkSubmitOperator)
    assert task.pipeline_config == os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", "")
    assert task.application == str(resources.epoch_job())
    assert Path(task.application) == REPO / "jobs" / "epoch_job.py"  # this checkout's file, on disk
    config = os.environ.get("SPLITKEEPER_PIPELINE_CONFIG", "")
    env = jinja2.Environment()

    def argv(**params):  # what spark-submit gets for these Params, rendered as Airflow renders templates
        return [env.from_string(arg).render(params=params) for arg in task.application_args]

    parser = argparse.ArgumentParser()
    run_command.configure(parser)
    overrides = {"backlog": {"normal_epoch_records": 7}}
    every = argv(
        epochs=5,
        until_caught_up=True,
        continuous=False,
        faults=["fail:1@2", "stall:2@3"],
        pipeline=overrides,
        reset_backlog=True,
        reader_mode="legacy",
    )
    assert every == [
        "--config",
        config,
        "--epochs=5",
        "--until-caught-up",
        "--faults-json",
        every[5],
        "--pipeline-json",
        every[7],
        "--reset-backlog",
        "--reader-mode=legacy",
    ]
    args = parser.parse_args(every)  # every Param reaches the epoch job
    assert (args.epochs, args.until_caught_up, args.continuous) == (5, True, False)
    assert run_command._faults(args) == ["fail:1@2", "stall:2@3"]
    assert json.loads(args.pipeline_json) == overrides
    assert (args.reset_backlog, args.reader_mode) == (True, "legacy")
    args = parser.parse_args(
        argv(epochs=3, until_caught_up=True, continuous=True, faults=[], pipeline={}, reset_backlog=False)
    )
    assert (args.epochs, args.until_caught_up, args.continuous) == (None, False, True)
    assert (args.reset_backlog, args.reader_mode) == (False, "configured")  # reader_mode null: the file's


@pytest.mark.parametrize(
    ("conf", "fragment"),
    [
        ({"parallelism": 0}, "parallelism"),
        ({"mode": "sideways"}, "mode"),
        ({"checkpoint_id": "yesterday"}, "checkpoint_id"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"readers": [-1]}, "readers"),
    ],
)
def test_recover_rejects_bad_params_at_trigger(airflow_db, conf, fragment):
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError) as err:
        load_dag("splitkeeper_recover").test(run_conf=conf)
    assert fragment in str(err.value)


def _the_report_is_reachable_from_the_report_task(
    run_id: str, dag_id: str = "splitkeeper_ingest", task_id: str = "report"
) -> Path:
    """The plugin's "Run report" link on the report-producing task, served by its FastAPI app (what
    the API server mounts under /splitkeeper, here with an admin's token from Airflow's auth
    manager) from the task's XCom in the metadata database: the page kept for that run."""
    from urllib.parse import quote

    from airflow.api_fastapi.app import init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.models.taskinstancekey import TaskInstanceKey
    from fastapi.testclient import TestClient

    from splitkeeper.airflow.plugin import URL_PREFIX, RunReportLink, app, run_report_path

    link = RunReportLink().get_link(None, ti_key=TaskInstanceKey(dag_id, task_id, run_id))
    assert link == f"{URL_PREFIX}/report/{dag_id}/{quote(run_id, safe='')}?task_id={task_id}"
    assert RunReportLink().get_link(None, ti_key=TaskInstanceKey(dag_id, "validate", run_id)) == ""
    kept = run_report_path(dag_id, run_id)
    assert kept.parent.parent.name == "runs" and kept.name == "report.html"  # that run's kept page
    token = init_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    client = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    assert TestClient(app).get(link.removeprefix(URL_PREFIX)).status_code == 401  # no token
    page = client.get(link.removeprefix(URL_PREFIX), follow_redirects=True)
    assert page.status_code == 200 and "dagtest" in page.text and "chart-timeline" in page.text
    assert page.text == kept.read_text(encoding="utf-8")
    missing = client.get(f"/report/{dag_id}/no-such-run")
    assert missing.status_code == 404 and "its report task has not run" in missing.text
    index = client.get("/pipelines")
    assert index.status_code == 200 and 'href="dagtest/report.html"' in index.text
    assert client.get("/dagtest/report.html").status_code == 200  # where the pipelines page links
    assert client.get("/..%2F..%2Fetc/report.html").status_code == 404  # nothing outside the folder
    return kept


def test_the_pipeline_param_is_data_a_secret_in_it_reaches_no_listener(airflow_db, tmp_path, monkeypatch):
    """Issue 36 unsafe 1: whoever may trigger the ingest DAG could read the worker's environment
    through ``${VAR}`` in the ``pipeline`` Param and a metrics endpoint of their choosing."""
    import http.server
    import threading

    seen = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server hook
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "adv-s3cr3t-dag-9c1"
    config_path = _write_pipeline(tmp_path, files=1, lines=1)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(config_path))
    monkeypatch.setenv("ADV_SECRET", secret)
    try:
        for endpoint in (
            f"http://127.0.0.1:{server.server_address[1]}/${{ADV_SECRET}}",
            "http://127.0.0.1:1",
        ):
            pipeline = {"metrics": {"otlp_endpoint": endpoint}}
            run = load_dag("splitkeeper_ingest").test(run_conf={"pipeline": pipeline})
            assert run.state == "failed"
    finally:
        server.shutdown()
        server.server_close()
    assert seen == [] and not (tmp_path / "state").exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("pipeline", "fragment"),
    [
        ({"checkpoint": {"on_split_failure": "park"}}, "'park' is not one of ['stall', 'quarantine']"),
        ({"state": {"path": "/elsewhere"}}, "'state' was unexpected"),  # not a section a run may override
        ({"backlog": {"normal_epoch_records": "many"}}, "'many' is not of type 'integer'"),
        ({"checkpoint": {"max_failur_ratio": 0.2}}, "'max_failur_ratio' was unexpected"),
    ],
)
def test_ingest_rejects_a_bad_pipeline_override_at_trigger(
    airflow_db, tmp_path, monkeypatch, pipeline, fragment
):
    from airflow.exceptions import ParamValidationError

    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(_write_pipeline(tmp_path, files=1, lines=1)))
    with pytest.raises(ParamValidationError) as err:
        load_dag("splitkeeper_ingest").test(run_conf={"pipeline": pipeline})
    assert "pipeline" in str(err.value) and fragment in str(err.value)
    assert not (tmp_path / "state").exists()


def test_an_override_only_the_core_rejects_fails_the_run_naming_the_key(airflow_db, tmp_path, monkeypatch):
    from splitkeeper.airflow import tasks
    from splitkeeper.errors import ConfigError

    config_path = _write_pipeline(tmp_path, files=1, lines=1)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(config_path))
    pipeline = {"checkpoint": {"max_failure_ratio": 1.5}}  # a number, as the schema says; the core says <= 1
    run = load_dag("splitkeeper_ingest").test(run_conf={"pipeline": pipeline})
    assert run.state == "failed"
    assert not (tmp_path / "state").exists()  # refused before anything was written
    with pytest.raises(ConfigError) as err:  # what the run_epochs task raised
        tasks.run_epochs(str(config_path), epochs=1, pipeline=pipeline)
    assert str(err.value) == (
        "[CONFIG_ERROR] checkpoint.max_failure_ratio=1.5 is not allowed: a number between 0 and 1 "
        f"({config_path})"
    )


@pytest.mark.spark
def test_a_failed_validate_turns_the_run_red_and_its_report_still_says_why(
    airflow_db, spark, tmp_path, monkeypatch
):
    """Issue 39: the report task runs when validate fails (trigger rule all_done), keeps its page
    for the run naming the failed check, then fails naming validate: the DAG run is red."""
    from deltalake import DeltaTable, write_deltalake

    from splitkeeper.airflow.plugin import run_report_path
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config

    config_path = _write_pipeline(tmp_path, files=1, lines=20, parallelism=1)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(config_path))
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))
    config = load_config(config_path)
    services.run(config)
    latest = services.status(config).latest_checkpoint
    assert latest is not None
    one = DeltaTable(config.sink.path).to_pyarrow_table().slice(3, 1)
    write_deltalake(config.sink.path, one, mode="append")  # a record written twice: rule 6.4 breaks

    run = load_dag("splitkeeper_ingest").test(run_conf={"epochs": 1})
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert {task: ti.state for task, ti in tis.items()} == {
        "run_epochs": "success",
        "validate": "failed",
        "report": "failed",
    }
    assert run.state == "failed"
    assert tis["report"].xcom_pull(task_ids="report") == str(
        run_report_path("splitkeeper_ingest", run.run_id)
    )  # the "Run report" link's XCom is there though the task failed
    page = run_report_path("splitkeeper_ingest", run.run_id).read_text(encoding="utf-8")
    assert f"FAILED on checkpoint {latest.id} (sink_records)" in page
    assert "offset_duplicate" in page


@pytest.mark.spark
@pytest.mark.kafka
def test_the_ingest_params_reset_the_backlog_and_choose_legacy_readers(
    airflow_db, spark, kafka_broker, tmp_path, monkeypatch
):
    """Issue 39 item 6: ``reset_backlog`` (run --reset-backlog) and ``reader_mode`` reach the run from
    the ingest DAG's Params: after the run caught up, new messages with a backlog reset put it back in
    backlog mode, and legacy readers keep the splits they restored instead of handing them over."""
    from splitkeeper.airflow.plugin import _results
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config
    from tests.runtime.test_kafka_pipeline import produce_numbered
    from tests.runtime.test_kafka_source import create_topic

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2)
    produce_numbered(bootstrap, topic, {0: 30, 1: 30})
    config_path = tmp_path / "pipeline.yaml"
    config_path.write_text(
        f"""
name: dagkafka
parallelism: 2
strategy: least-loaded
source: {{kind: kafka, bootstrap_servers: "{bootstrap}", topics: [{topic}]}}
backlog: {{backlog_epoch_records: 400, normal_epoch_records: 400}}
state: {{path: state}}
sink: {{path: sink}}
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(config_path))
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))
    config = load_config(config_path)
    assert services.run(config, until_caught_up=True, epochs=5).caught_up
    latest = services.status(config).latest_checkpoint
    assert latest is not None and not latest.processing_backlog  # the backlog was read
    produce_numbered(bootstrap, topic, {0: 20, 1: 20}, first=30)

    conf = {"epochs": 1, "until_caught_up": False, "reset_backlog": True, "reader_mode": "legacy"}
    run = load_dag("splitkeeper_ingest").test(run_conf=conf)
    assert run.state == "success"
    [result] = _results("splitkeeper_ingest", run.run_id, "run_epochs")
    assert result["epochs"][0]["processing_backlog"] is True  # the new ends are backlog again
    decisions = result["opened"]["decisions"]
    assert decisions.get("kept_legacy") == 2 and "redistributed_global_restore" not in decisions
    [validated] = _results("splitkeeper_ingest", run.run_id, "validate")
    assert validated["suites"]["balance"] == "skipped"  # legacy readers: rule 6.5 does not bind them


_CHILD_RUN = """
import json, sys
sys.path.insert(0, {repo!r})
from tests.dags.conftest import load_dag
from splitkeeper.airflow.plugin import _results, run_report_path
run = load_dag("splitkeeper_ingest").test(run_conf={{"epochs": 5}})
validated = _results("splitkeeper_ingest", run.run_id, "validate")
print(json.dumps(dict(state=run.state, validated=validated[0] if validated else None,
                      report=str(run_report_path("splitkeeper_ingest", run.run_id)))))
"""


def _a_run_with_nothing_new_starts_no_spark(config_path: Path, finished_run_id: str, tmp_path: Path) -> None:
    """Issue 26 item 2 for the DAG: a run that commits nothing starts no JVM in any task. Its validate
    task finds the latest checkpoint validated (the validations table) with nothing changed since and
    names it and its Data Docs instead of scanning the sink. The run is a child process where no JVM
    can start (JAVA_HOME points at an empty folder, as the CLI's test does). ``finished_run_id``: the
    ingest run that read everything there is; its validate checked the latest checkpoint or found it
    checked by the run before (the rescale DAG's, when the rescale's epochs read the rest)."""
    from splitkeeper.airflow.plugin import _results
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sinks.delta.read import read_sink

    checked = _results("splitkeeper_ingest", finished_run_id, "validate")[0]
    config = load_config(config_path)
    latest = DeltaStateStore(config.state.path, config.name, None, read_only=True).ids()[-1]
    assert checked["checkpoint_id"] == latest  # checked then, or found checked by the run before
    assert checked["suites"] and set(checked["suites"].values()) == {"passed"}
    before = read_sink(config.sink.path).sort_by([("split_id", "ascending"), ("offset", "ascending")])

    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_RUN.format(repo=str(REPO))],
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    print(f"nothing new: DAG run {time.monotonic() - started:.2f} s in a fresh process, no JVM")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "success", done.stderr[-3000:]  # a JVM start would have failed its task
    assert "starting the Spark session" not in done.stderr and "Java gateway" not in done.stderr
    again = out["validated"]
    assert again["checkpoint_id"] == latest and again["success"] is True
    assert again["already_validated_at"] is not None and again["suites"] == checked["suites"]
    if checked["already_validated_at"] is not None:  # the same recorded run, named again
        assert again["already_validated_at"] == checked["already_validated_at"]
    assert again["data_docs"] == checked["data_docs"] and Path(again["data_docs"]).is_file()
    assert f"checkpoint {latest} was validated at {again['already_validated_at']}" in again["notes"][0]
    assert Path(out["report"]).is_file()  # the report task ran too, its page kept for that run
    assert DeltaStateStore(config.state.path, config.name, None, read_only=True).ids()[-1] == latest
    after = read_sink(config.sink.path).sort_by([("split_id", "ascending"), ("offset", "ascending")])
    assert after.equals(before)


@pytest.mark.spark
@pytest.mark.slow
def test_ingest_with_a_region_failure_then_recover_and_rescale(airflow_db, spark, tmp_path, monkeypatch):
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sources import build_source

    config_path = _write_pipeline(tmp_path)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(config_path))
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))

    run = load_dag("splitkeeper_ingest").test(run_conf={"epochs": 2, "faults": ["fail:1@2"]})
    assert run.state == "success"
    config = load_config(config_path)
    store = DeltaStateStore(config.state.path, config.name, build_source(config.source).fingerprint())
    kinds = [t.kind.value for t in store.history.timeline()]
    assert kinds[:2] == ["global", "regional"]
    assert (tmp_path / "reports" / "dagtest" / "report.html").exists()
    first_page = _the_report_is_reachable_from_the_report_task(run.run_id)
    before = store.checkpoint_ids()

    dry = load_dag("splitkeeper_recover").test(run_conf={"dry_run": True, "parallelism": 3})
    assert dry.state == "success"
    assert store.checkpoint_ids() == before  # a dry run writes nothing

    alerts = tmp_path / "alerts.jsonl"
    monkeypatch.setenv("SPLITKEEPER_TEST_ALERTS", str(alerts))
    missing = load_dag("splitkeeper_recover").test(run_conf={"checkpoint_id": "999"})
    assert missing.state == "failed"  # no such checkpoint: the restore task fails, naming it
    assert store.checkpoint_ids() == before
    events = [json.loads(line) for line in alerts.read_text().splitlines()]  # notifications.on_failure
    assert [(e["pipeline"], e["dag_id"], e["task_id"]) for e in events] == [
        ("dagtest", "splitkeeper_recover", "restore_enumerator_state")
    ]
    assert isinstance(
        events[0]["error"], str
    )  # the error's text (dag.test leaves it empty; a scheduler does not)

    # 'latest' is what the writing step restores when it gets the pool slot, not what the restore
    # step saw: an ingest that held the slot meanwhile committed a newer checkpoint
    from splitkeeper.airflow import tasks
    from splitkeeper.app import services

    restored = tasks.restore_enumerator_state({"checkpoint_id": "latest"}, str(config_path))
    assert restored["checkpoint_id"] == before[-1]
    services.run(config, epochs=1)
    newer = store.checkpoint_ids()[-1]
    assert newer > before[-1]
    done = tasks.reassign_and_rebalance(tasks.collect_reader_reports(restored, str(config_path)), None)
    assert done["opened"]["restored_from"] == newer

    rescale = load_dag("splitkeeper_recover").test(run_conf={"parallelism": 3, "mode": "global"})
    assert rescale.state == "success"
    _the_report_is_reachable_from_the_report_task(rescale.run_id, "splitkeeper_recover", "resume")
    latest = store.latest_checkpoint()
    assert latest is not None and latest.parallelism == 3
    loads = [len(s) for s in latest.enumerator.assignments.values()]
    assert max(loads) - min(loads) <= 1

    down = load_dag("splitkeeper_rescale").test(run_conf={"parallelism": 2, "redistribution": "union"})
    assert down.state == "success"
    latest = store.latest_checkpoint()
    assert latest is not None and latest.parallelism == 2 and latest.checkpoint_id > max(before)
    assert sorted(latest.enumerator.assignments) == [0, 1]

    finish = load_dag("splitkeeper_ingest").test(run_conf={"epochs": 20})
    assert finish.state == "success"
    assert _the_report_is_reachable_from_the_report_task(finish.run_id) != first_page  # each run its own
    assert store.latest_checkpoint().parallelism == 2  # the next scheduled run keeps the rescale
    sink = spark.read.format("delta").load(config.sink.path)
    source_lines = sum(len(p.read_text().splitlines()) for p in (tmp_path / "in").iterdir())
    assert sink.count() == source_lines
    assert sink.select("split_id", "offset").distinct().count() == source_lines
    _a_run_with_nothing_new_starts_no_spark(config_path, finish.run_id, tmp_path)

    # the incident workflow through Params: a rewind is planned (nothing written) until confirmed
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    ids = store.checkpoint_ids()
    back_to = ids[0]  # the oldest retained checkpoint: the largest rewind
    plan = load_dag("splitkeeper_recover").test(run_conf={"rewind": True, "checkpoint_id": str(back_to)})
    assert plan.state == "success" and store.checkpoint_ids() == ids
    from splitkeeper.airflow.operators import SplitkeeperRecoverOperator  # what a user's own DAG imports

    planned = SplitkeeperRecoverOperator(
        task_id="rewind", pipeline_config=str(config_path), rewind="True", checkpoint_id=str(back_to)
    ).execute({})
    assert (planned["kind"], planned["applied"], planned["dry_run"]) == ("rewind", False, True)
    assert store.checkpoint_ids() == ids  # without confirm: planned, nothing written
    rewound = load_dag("splitkeeper_recover").test(
        run_conf={"rewind": True, "checkpoint_id": str(back_to), "confirm": True, "reason": "dag test"}
    )
    assert rewound.state == "success"
    fresh = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    epoch = fresh.checkpoint_ids()[-1]
    assert epoch > ids[-1]
    decided = [d for d in fresh.tables.read("decisions").to_pylist() if d["epoch_id"] == epoch]
    assert [d["reason"] for d in decided] == [f"rewind to checkpoint {back_to} by airflow: dag test"]

    again = load_dag("splitkeeper_ingest").test(run_conf={"epochs": 20})  # reads the undone offsets again
    assert again.state == "success"
    sink = spark.read.format("delta").load(config.sink.path)
    assert sink.count() == source_lines
    assert sink.select("split_id", "offset").distinct().count() == source_lines
