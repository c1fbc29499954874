"""The tasks' Spark work on a cluster master: submitted Spark applications, results back through state.

Fast tests run the task job's side in this process (:func:`splitkeeper.airflow.submitted.job_main`,
no Spark) and check what the task makes of its result. The slow one starts a real Spark standalone
master with 2 workers (the project's local cluster, Spark only), points the DAGs at it the way a
deployment does (``SPLITKEEPER_SPARK_MASTER`` and a ``spark_default`` connection) and runs the
ingest, recovery and rescale DAGs for real (``dag.test()``): every step that starts Spark is a
spark-submit whose application the workers ran, while the task process (this one) is kept from
starting a JVM at all. The maintain DAG runs there too: it starts no Spark (delta-rs only), so it
stays in the task, still without a JVM.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.dags.conftest import load_dag
from tests.runtime.helpers import pipeline_mapping, write_config, write_input

pytestmark = [pytest.mark.airflow]


def _config(tmp_path: Path, name: str = "submitted") -> Path:
    write_input(tmp_path / "in", files=3, lines=40)
    # a region's deadline counts its executor's start on a busy 2-core machine
    mapping = pipeline_mapping(
        tmp_path, name, tmp_path / "in", parallelism=2, epoch_records=40, region_timeout_s=180
    )
    return write_config(tmp_path / "pipeline.yaml", mapping)


def test_the_jobs_error_is_raised_by_the_task_as_the_same_error(tmp_path):
    """The job runs the task function outside Airflow and writes its error; the task raises it
    again: same class, same message (here: validate of a pipeline that never ran)."""
    from splitkeeper.airflow import submitted, tasks
    from splitkeeper.config.settings import load_config
    from splitkeeper.errors import SplitkeeperError

    path = _config(tmp_path)
    state = load_config(path).state.path
    with pytest.raises(SplitkeeperError) as direct:
        tasks.validate(str(path))
    with submitted.request(state, "validate", {"path": str(path)}) as folder:
        assert Path(folder).parent == Path(state) / "_submitted"
        assert submitted.job_main([folder]) == 1
        outcome = submitted.result(folder)
    assert outcome is not None and "application_id" in outcome  # None unless a session ran in this process
    with pytest.raises(SplitkeeperError) as again:
        submitted.outcome_value("validate", outcome, None)
    assert type(again.value) is type(direct.value)
    assert str(again.value) == str(direct.value)
    assert not Path(state).exists()  # the request folder, and the state folder it made, are gone


def test_a_result_comes_back_and_no_result_is_an_error_naming_the_task(tmp_path):
    from splitkeeper.airflow import submitted
    from splitkeeper.errors import SubmittedJobError

    path = _config(tmp_path)
    state = str(tmp_path / "state")
    kwargs = {"path": str(path), "reports": {"dry_run": True}}
    with submitted.request(state, "reassign_and_rebalance", kwargs) as folder:
        assert submitted.job_main([folder]) == 0
        outcome = submitted.result(folder)
    value = submitted.outcome_value("reassign_and_rebalance", outcome, None)
    value.pop("spark_application", None)  # there when an earlier test started Spark in this process
    assert value == {"dry_run": True, "note": "dry run: nothing restored or written"}
    left = r"\[SUBMITTED_JOB_FAILED\] rescale's Spark application left no result: spark-submit exited 1"
    with pytest.raises(SubmittedJobError, match=left):
        submitted.outcome_value("rescale", None, RuntimeError("spark-submit exited 1"))
    with pytest.raises(SubmittedJobError, match="rescale failed in its Spark application: builtins.Zero"):
        submitted.outcome_value("rescale", {"error": submitted.error_data(ZeroDivisionError("boom"))}, None)


def test_on_a_cluster_master_a_step_without_spark_is_not_submitted(tmp_path, monkeypatch):
    """A recovery's dry run starts no Spark: it stays in the task even on a cluster master (a
    master nobody listens on: a submit would fail)."""
    from splitkeeper.airflow.submitted import spark_task

    path = _config(tmp_path)
    monkeypatch.setenv("SPLITKEEPER_SPARK_MASTER", "spark://127.0.0.1:9")
    done = spark_task("reassign_and_rebalance", str(path), reports={"dry_run": True})
    assert done["dry_run"] is True


# -- on a real Spark standalone cluster ------------------------------------------------------


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A Spark standalone master and 2 workers (1 core each, Spark authentication on), and what
    a driver needs to use them."""
    from splitkeeper_tools.chaos.cluster import spark_unavailable
    from splitkeeper_tools.cluster.local import LocalCluster

    why = spark_unavailable()
    if why:
        pytest.skip(why)
    cluster = LocalCluster(tmp_path_factory.mktemp("standalone") / "cluster")
    env = cluster.up_spark(worker_cores=1, say=lambda _m: None)
    try:
        yield cluster, env
    finally:
        cluster.down(say=lambda _m: None)


def _no_jvm_here(monkeypatch) -> list[str]:
    """Make this process (where dag.test() runs the tasks) refuse to start Spark: splitkeeper's one
    door to a session and py4j's gateway launch both fail, naming the caller."""
    import pyspark.context
    import pyspark.java_gateway
    import pyspark.sql.session

    from splitkeeper.spark import session

    started: list[str] = []

    def refuse(what: str):
        def call(*_args, **_kwargs):
            started.append(what)
            raise RuntimeError(f"the Airflow task process tried to start Spark ({what})")

        return call

    monkeypatch.setattr(session, "get_spark", refuse("get_spark"))
    monkeypatch.setattr(pyspark.java_gateway, "launch_gateway", refuse("launch_gateway"))
    monkeypatch.setattr(pyspark.context, "launch_gateway", refuse("launch_gateway"))
    monkeypatch.setattr(pyspark.sql.session.SparkSession.Builder, "getOrCreate", refuse("getOrCreate"))
    return started


def _ran_on_a_worker(cluster, application: str) -> list[str]:
    """The workers whose work folders hold executors of ``application``."""
    spark = cluster.layout.spark
    return [w for w in ("worker-1", "worker-2") if (spark / w / application).is_dir()]


@pytest.mark.slow  # not `spark`: that mark starts the shared local session in this process
def test_on_a_cluster_master_recover_and_validate_run_as_submitted_applications(
    airflow_db, standalone, tmp_path, monkeypatch
):
    from deltalake import DeltaTable, write_deltalake

    from splitkeeper.airflow.operators import SplitkeeperValidateOperator
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.errors import InvariantViolation
    from splitkeeper.spark import jars as jarlib
    from splitkeeper.spark.runner import SHARED_DISK_CONF

    cluster, env = standalone
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    jars = sorted(jarlib.group_dir(jarlib.JarGroup.SPARK, jarlib.jars_root()).glob("*.jar"))
    monkeypatch.setenv("SPLITKEEPER_SPARK_JARS", ",".join(map(str, jars)))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": cluster.spark_master_url()})
    )
    # a driver runs its first job once both executors (one a worker) registered; the workers see
    # no /tmp folder of this process but the cluster's own (their private /tmp): the pipeline's
    # input, state and sink go there, and this one-host test allows a local staging folder (the
    # shared-nothing profile is tests/cluster/test_shared_nothing.py's)
    monkeypatch.setenv(
        "SPLITKEEPER_SPARK_CONF",
        env["SPLITKEEPER_SPARK_CONF"]
        + ";spark.cores.max=2;spark.scheduler.minRegisteredResourcesRatio=1.0"
        + f";{SHARED_DISK_CONF}=true",
    )
    path = _config(cluster.root / "pipeline")
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(path))
    monkeypatch.setenv("SPLITKEEPER_REPORTS_DIR", str(tmp_path / "reports"))
    config = load_config(path)
    from pyspark import SparkContext

    jvm_before = SparkContext._active_spark_context
    started = _no_jvm_here(monkeypatch)

    # one epoch of three: the recovery's and the rescale's epochs have records left to read, so
    # their drivers start Spark
    ingest = load_dag("splitkeeper_ingest").test(run_conf={"epochs": 1})
    tis = {ti.task_id: ti for ti in ingest.get_task_instances()}
    assert {t: ti.state for t, ti in tis.items()} == dict.fromkeys(
        ("run_epochs", "validate", "report"), "success"
    ), started
    checked = tis["validate"].xcom_pull(task_ids="validate")
    store = DeltaStateStore(config.state.path, config.name, None, read_only=True)
    before = store.checkpoint_ids()[-1]
    assert checked["success"] is True and checked["checkpoint_id"] == before, checked
    assert _ran_on_a_worker(cluster, checked["spark_application"]), checked  # the checks' executors

    recover = load_dag("splitkeeper_recover").test(run_conf={"mode": "global", "parallelism": 3})
    tis = {ti.task_id: ti for ti in recover.get_task_instances()}
    assert recover.state == "success", {t: ti.state for t, ti in tis.items()}
    done = tis["reassign_and_rebalance"].xcom_pull(task_ids="reassign_and_rebalance")
    validated = tis["validate"].xcom_pull(task_ids="validate")
    assert done["opened"]["restored_from"] == before and done["opened"]["parallelism"] == 3, done
    latest = DeltaStateStore(config.state.path, config.name, None, read_only=True).latest_checkpoint()
    assert latest is not None and latest.parallelism == 3 and latest.checkpoint_id > before
    assert validated["success"] is True and validated["checkpoint_id"] == latest.checkpoint_id, validated
    applications = {done["spark_application"], validated["spark_application"]}
    assert len(applications) == 2 and all(_ran_on_a_worker(cluster, a) for a in applications), applications
    assert Path(tis["resume"].xcom_pull(task_ids="resume")).is_file()  # the report step read the verdicts

    rescale = load_dag("splitkeeper_rescale").test(run_conf={"parallelism": 2, "redistribution": "union"})
    tis = {ti.task_id: ti for ti in rescale.get_task_instances()}
    assert rescale.state == "success", {t: ti.state for t, ti in tis.items()}
    redistributed = tis["redistribute"].xcom_pull(task_ids="redistribute")
    validated = tis["validate"].xcom_pull(task_ids="validate")
    assert redistributed["opened"]["restored_from"] == latest.checkpoint_id, redistributed
    latest = DeltaStateStore(config.state.path, config.name, None, read_only=True).latest_checkpoint()
    assert latest is not None and latest.parallelism == 2
    assert validated["success"] is True and validated["checkpoint_id"] == latest.checkpoint_id, validated
    assert _ran_on_a_worker(cluster, redistributed["spark_application"]), redistributed
    assert _ran_on_a_worker(cluster, validated["spark_application"]), validated

    # nothing changed since those checks passed: the task says so without a submit, as in-process
    again = SplitkeeperValidateOperator(task_id="validate", pipeline_config=str(path)).execute({})
    assert again["already_validated_at"] is not None and "spark_application" not in again, again
    assert again["checkpoint_id"] == latest.checkpoint_id

    # a failing verdict comes back as the checks' own error, naming the split
    one = DeltaTable(config.sink.path).to_pyarrow_table().slice(3, 1)
    write_deltalake(config.sink.path, one, mode="append")  # a record written twice: rule 6.4 breaks
    with pytest.raises(InvariantViolation) as failed:
        SplitkeeperValidateOperator(task_id="validate", pipeline_config=str(path)).execute({})
    assert one.column("split_id")[0].as_py() in str(failed.value)

    # maintain starts no Spark at all (delta-rs compaction and VACUUM): it runs in the task, submits
    # nothing, and needs no JVM here either
    maintain = load_dag("splitkeeper_maintain").test(run_conf={"history_hours": 0})
    tis = {ti.task_id: ti for ti in maintain.get_task_instances()}
    assert maintain.state == "success", {t: ti.state for t, ti in tis.items()}
    kept = tis["maintain"].xcom_pull(task_ids="maintain")
    assert kept["dry_run"] is False and "sink" in kept["compacted_files"], kept
    assert "spark_application" not in kept, kept
    assert started == []  # nothing in this process started a JVM
    assert SparkContext._active_spark_context is jvm_before  # None when this test runs alone
    assert not (Path(config.state.path) / "_submitted").exists() or not any(
        (Path(config.state.path) / "_submitted").iterdir()
    )  # every request folder was removed
