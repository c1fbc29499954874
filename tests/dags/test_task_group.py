"""``splitkeeper_task_group``: a pipeline's ingest -> validate -> report steps in a DAG of one's own.

The runs are real (``dag.test()`` on the SQLite metadata DB, real Spark and Delta); the wiring
and the errors are checked without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest

from splitkeeper.errors import ConfigError, InvalidParameterError

pytestmark = [pytest.mark.airflow]

STEPS = ["run_epochs", "validate", "report"]


def _pipeline(root: Path, name: str = "orders") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = root / f"{name}.yaml"
    config.write_text(
        f"""
name: {name}
parallelism: 2
source: {{kind: files, path: in, format: lines}}
state: {{path: state}}
sink: {{path: sink}}
""",
        encoding="utf-8",
    )
    return config


def _files() -> dict[str, list[str]]:
    """The source: 3 files of 40 distinct lines."""
    return {f"part-{f}.txt": [f"order-{f}-{i}" for i in range(40)] for f in range(3)}


def _write_source(root: Path) -> int:
    """What the upstream task does: write the source files that are not there yet."""
    (root / "in").mkdir(exist_ok=True)
    for name, lines in _files().items():
        if not (root / "in" / name).exists():
            (root / "in" / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sum(len(lines) for lines in _files().values())


def _user_dag(dag_id: str, config: Path, *, boom: bool = False, **group: object):
    """A team's DAG: ``prepare >> <the group> >> publish``; ``boom``: plus an unrelated failing task."""
    import pendulum
    from airflow.sdk import DAG, task

    from splitkeeper.airflow import splitkeeper_task_group

    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:

        @task
        def prepare() -> int:
            return _write_source(config.parent)

        @task
        def publish() -> str:
            return "published"

        prepare() >> splitkeeper_task_group(str(config), **group) >> publish()  # type: ignore[arg-type]
        if boom:

            @task
            def unrelated() -> None:
                raise RuntimeError("a task of the team's own, outside the group")

            unrelated()
    return dag


TEAM_DAG = """
import pathlib

import pendulum
from airflow.sdk import DAG, task

from splitkeeper.airflow import splitkeeper_task_group

HERE = pathlib.Path(__file__).parent
FILES = {files!r}

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False) as dag:

    @task
    def prepare() -> int:
        (HERE / "in").mkdir(exist_ok=True)
        for name, lines in FILES.items():
            if not (HERE / "in" / name).exists():
                (HERE / "in" / name).write_text("\\n".join(lines) + "\\n", encoding="utf-8")
        return sum(len(lines) for lines in FILES.values())

    @task
    def publish() -> str:
        return "published"

    prepare() >> splitkeeper_task_group({pipeline!r}, epochs={epochs}) >> publish()

    if {boom}:

        @task
        def unrelated() -> None:
            raise RuntimeError("a task of the team's own, outside the group")

        unrelated()
"""


def _run_team_dag(root: Path, dag_id: str, pipeline: str, *, epochs: int, boom: bool = False):
    """Write the team's DAG file beside its pipeline file, parse it as the DAG processor does (a
    relative pipeline path is relative to the file's folder), store it, and run it (``dag.test()``)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.models.dagbag import BundleDagBag, sync_bag_to_db

    dag_file = root / "team_dag.py"
    dag_file.write_text(
        TEAM_DAG.format(files=_files(), dag_id=dag_id, pipeline=pipeline, epochs=epochs, boom=boom)
    )
    DagBundlesManager().sync_bundles_to_db()
    bag = BundleDagBag(dag_folder=str(dag_file), bundle_path=root)
    assert bag.import_errors == {} and list(bag.dags) == [dag_id]
    sync_bag_to_db(bag, "dags-folder", None)  # dag.test() runs a stored DAG
    return bag.dags[dag_id].test()


def test_the_group_holds_the_ingest_steps_with_the_ingest_dags_wiring(tmp_path, monkeypatch):
    from splitkeeper.airflow.operators import (
        SplitkeeperIngestOperator,
        SplitkeeperReportOperator,
        SplitkeeperValidateOperator,
    )

    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    dag = _user_dag("team_orders", _pipeline(tmp_path), epochs=7, reader_mode="legacy")
    assert [t.task_id for t in dag.topological_sort()] == [
        "prepare",
        "orders.run_epochs",
        "orders.validate",
        "orders.report",
        "publish",
    ]
    run, validate, report = (dag.get_task(f"orders.{s}") for s in STEPS)
    assert (type(run), type(validate), type(report)) == (
        SplitkeeperIngestOperator,
        SplitkeeperValidateOperator,
        SplitkeeperReportOperator,
    )
    assert run.pool == "splitkeeper-orders" and {a.uri for a in run.outlets} == {
        f"file://{tmp_path / 'sink'}",
        f"file://{tmp_path / 'state'}",
    }
    assert (run.epochs, run.reader_mode, validate.reader_mode) == (7, "legacy", "legacy")
    assert report.trigger_rule == "all_done" and run.retries == 0  # the pipeline's default args
    assert dag.get_task("publish").upstream_task_ids == {"orders.report"}

    # validate=False, report=False: only the epochs; two pipelines, two groups
    only = _user_dag("team_two", _pipeline(tmp_path / "b", "orders.eu"), validate=False, report=False)
    assert [t.task_id for t in only.topological_sort()] == ["prepare", "orders_eu.run_epochs", "publish"]
    assert only.get_task("publish").upstream_task_ids == {"orders_eu.run_epochs"}


def test_on_a_cluster_master_the_groups_values_reach_the_epoch_job(tmp_path, monkeypatch):
    from splitkeeper.airflow.spark_submit import EpochJobSubmitOperator

    monkeypatch.setenv("SPLITKEEPER_SPARK_MASTER", "spark://spark-master:7077")
    config = _pipeline(tmp_path)
    overrides = {"backlog": {"normal_epoch_records": 7}}
    dag = _user_dag("team_cluster", config, epochs=4, overrides=overrides, reset_backlog=True, group_id="o")
    task = dag.get_task("o.run_epochs")
    assert type(task) is EpochJobSubmitOperator and task.pool == "splitkeeper-orders"
    env = jinja2.Environment()
    argv = [env.from_string(a).render(params={"epochs": 99}, task=task) for a in task.application_args]
    assert argv == [
        "--config",
        str(config),
        "--epochs=4",  # the group's, not a Param of the DAG's
        "--until-caught-up",
        "--faults-json",
        "[]",
        "--pipeline-json",
        json.dumps(overrides),
        "--reset-backlog",
        "--reader-mode=configured",
    ]


def test_bad_input_is_named_with_the_fix(tmp_path, monkeypatch):
    import pendulum
    from airflow.sdk import DAG

    from splitkeeper.airflow import splitkeeper_task_group

    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    start = pendulum.datetime(2026, 1, 1, tz="UTC")
    missing = tmp_path / "pipelines" / "ordrs.yaml"
    with DAG("bad_path", start_date=start), pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group(str(missing))
    assert str(err.value) == (
        f"[INVALID_PARAMETER] pipeline={str(missing)!r} is not allowed: a pipeline file (.yaml, .yml or "
        f".toml). There is no file {missing}; a relative path is relative to the DAG file's folder "
        f"{Path(__file__).parent}"
    )
    with DAG("relative", start_date=start), pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group("pipelines/none.yaml")  # relative to this file's folder, as in a DAG file
    assert f"There is no file {Path(__file__).parent / 'pipelines' / 'none.yaml'}" in str(err.value)

    config = _pipeline(tmp_path)
    config.write_text(config.read_text().replace("parallelism: 2", "parallelism: two"))
    with DAG("bad_file", start_date=start), pytest.raises(ConfigError) as bad:
        splitkeeper_task_group(str(config))
    assert "parallelism" in str(bad.value) and str(config) in str(bad.value)

    config = _pipeline(tmp_path)
    with DAG("clash", start_date=start), pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group(str(config))
        splitkeeper_task_group(str(config))  # the same default group_id: the pipeline's name
    assert "group_id='orders' is not allowed" in str(err.value)
    assert "its own group_id=" in str(err.value)
    with DAG("epochs", start_date=start), pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group(str(config), epochs=0)
    assert str(err.value) == (
        "[INVALID_PARAMETER] epochs=0 is not allowed: epochs (checkpoints) per run. "
        "0 is less than the minimum of 1"
    )
    with DAG("overrides", start_date=start), pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group(str(config), overrides={"state": {"path": "/elsewhere"}})
    assert "overrides=" in str(err.value) and "'state' was unexpected" in str(err.value)
    with pytest.raises(InvalidParameterError) as err:
        splitkeeper_task_group(str(config))  # no DAG being defined
    assert "inside `with DAG(...):`" in str(err.value)


@pytest.mark.spark
def test_a_user_dag_runs_the_group_between_its_own_tasks(airflow_db, spark, tmp_path, monkeypatch):
    """The group ingests what the upstream task wrote; the downstream task runs after its report. An
    unrelated task of the DAG that fails turns the run red but not the group's report (its verdict
    looks at the group's tasks only)."""
    from splitkeeper.sinks.delta.read import read_sink

    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))
    config = _pipeline(tmp_path)
    run = _run_team_dag(tmp_path, "team_orders_run", "orders.yaml", epochs=20, boom=True)
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert {t: ti.state for t, ti in tis.items()} == {
        "prepare": "success",
        "orders.run_epochs": "success",
        "orders.validate": "success",
        "orders.report": "success",
        "publish": "success",
        "unrelated": "failed",
    }
    assert run.state == "failed"  # the unrelated task's doing; the group's report passed
    assert tis["unrelated"].end_date <= tis["orders.report"].start_date  # failed before the verdict
    assert tis["publish"].start_date >= tis["orders.report"].end_date  # after the group
    assert tis["orders.report"].start_date >= tis["orders.validate"].end_date
    assert Path(tis["orders.report"].xcom_pull(task_ids="orders.report")).is_file()  # its run report
    sink = read_sink(config.parent / "sink", ["value"]).column("value").to_pylist()
    values = sorted(v.decode() if isinstance(v, bytes) else v for v in sink)
    assert values == sorted(line for lines in _files().values() for line in lines)  # each once, by content


@pytest.mark.spark
def test_a_failed_validate_in_the_group_fails_its_report(airflow_db, spark, tmp_path, monkeypatch):
    from deltalake import DeltaTable, write_deltalake

    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config

    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))
    config_path = _pipeline(tmp_path, "refunds")  # its own name: its Assets are its own
    _write_source(tmp_path)
    config = load_config(config_path)
    services.run(config)
    one = DeltaTable(config.sink.path).to_pyarrow_table().slice(3, 1)
    write_deltalake(config.sink.path, one, mode="append")  # a record written twice: rule 6.4 breaks

    run = _run_team_dag(tmp_path, "team_refunds_red", "refunds.yaml", epochs=1)
    tis = {ti.task_id: ti for ti in run.get_task_instances()}
    assert {t: ti.state for t, ti in tis.items()} == {
        "prepare": "success",
        "refunds.run_epochs": "success",
        "refunds.validate": "failed",
        "refunds.report": "failed",  # its verdict: a task of its group failed
        "publish": "upstream_failed",
    }
    assert run.state == "failed"
    page = tis["refunds.report"].xcom_pull(task_ids="refunds.report")
    assert Path(page).is_file()  # the page is written though the step failed
