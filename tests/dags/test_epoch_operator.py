"""The ingest DAG's spark-submit epoch task, cancelled while a continuous run goes on.

The operator is the one the ingest DAG builds on a cluster master (``EpochJobSubmitOperator``).
It runs for real here: its ``execute`` has the provider's hook start ``spark-submit`` (on a
``local[2]`` master, from an Airflow connection in the environment). spark-submit runs
``jobs/epoch_job.py --continuous``, a files pipeline in which region 1 fails in epoch 2, so
checkpoint 2 is regional. Once that checkpoint is in, ``on_kill`` is called, as Airflow calls it
on a cancel. The run must end the way ``splitkeeper stop`` ends it: on a final checkpoint that
is global, with spark-submit exiting 0 and the lease released. The state is read through
splitkeeper's status API.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.runtime.helpers import pipeline_mapping, subprocess_env, write_config, write_input

pytestmark = [pytest.mark.spark, pytest.mark.airflow, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 5.0


def _ancestors(pid: int) -> list[int]:
    chain = []
    while pid > 1 and len(chain) < 10:
        chain.append(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    return chain


def test_cancelling_a_continuous_spark_submit_run_ends_it_on_a_global_checkpoint(
    tmp_path, monkeypatch, caplog
):
    from splitkeeper.airflow.spark_submit import EpochJobSubmitOperator
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config
    from splitkeeper.spark import jars as jarlib

    write_input(tmp_path / "in", files=3, lines=60)
    mapping = pipeline_mapping(
        tmp_path, "cancel-continuous", tmp_path / "in", parallelism=3, epoch_records=30
    )
    mapping["backlog"].update({"backlog_interval_s": INTERVAL_S, "normal_interval_s": INTERVAL_S})
    path = write_config(tmp_path / "pipeline.yaml", mapping)
    config = load_config(path)
    for key, value in subprocess_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    monkeypatch.setenv(
        "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )  # spark-submit
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPLITKEEPER_LOCAL_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"})
    )
    jars = sorted(jarlib.group_dir(jarlib.JarGroup.SPARK, jarlib.jars_root()).glob("*.jar"))
    assert jars, "no Delta jars: run `bash scripts/setup.sh`"
    operator = EpochJobSubmitOperator(
        pipeline_config=str(path),
        task_id="run_epochs",
        application=str(REPO / "jobs" / "epoch_job.py"),
        conn_id="splitkeeper_local_spark",
        # what the ingest DAG renders for continuous=True, faults=["fail:1@2"], pipeline={}
        application_args=[
            "--config",
            str(path),
            "--continuous",
            "--no-until-caught-up",
            "--faults-json",
            json.dumps(["fail:1@2"]),
            "--pipeline-json",
            "{}",
        ],
        jars=",".join(map(str, jars)),
        name="splitkeeper-epochs",
        stop_timeout_s=120,
    )
    failure: list[BaseException] = []

    def execute() -> None:
        try:
            operator.execute(context={})  # type: ignore[arg-type]
        except BaseException as err:  # noqa: BLE001 - reported by the test
            failure.append(err)

    runner = threading.Thread(target=execute, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 240
        while True:  # checkpoint 2 (regional: region 1 failed) is in
            # the state folder appears with the run's first commit: status refuses a missing one
            latest = services.status(config).latest_checkpoint if os.path.isdir(config.state.path) else None
            if latest is not None and latest.id >= 2:
                break
            assert runner.is_alive(), failure
            assert time.monotonic() < deadline, "checkpoint 2 never came"
            time.sleep(0.3)
        process = operator._hook._submit_sp  # type: ignore[union-attr]
        assert process.poll() is None
        before = latest
        # the lease holder is the driver spark-submit started (client mode): stop signals it
        holder = services.status(config).lease
        assert holder is not None and not holder["released"], holder
        driver = int(re.search(r"\(pid (\d+) on ", holder["holder"]).group(1))  # type: ignore[union-attr]
        assert process.pid in _ancestors(driver), (holder, process.pid)
        t0 = time.monotonic()
        operator.on_kill()  # what Airflow calls on a cancel (SIGTERM) or an execution timeout
        took = time.monotonic() - t0
        # on_kill returned once spark-submit had exited by itself, with 0 (SIGKILL gives -9)
        assert process.poll() == 0, process.returncode
        assert not Path(f"/proc/{driver}").exists()
        runner.join(timeout=60)
        assert not runner.is_alive() and not failure, failure
    finally:
        submitted = operator._hook._submit_sp if operator._hook is not None else None
        if submitted is not None and submitted.poll() is None:
            submitted.kill()
    status = services.status(config)
    latest = status.latest_checkpoint
    assert latest is not None and latest.kind == "global", latest
    assert latest.id > before.id, (before, latest)  # a checkpoint was taken after the stop
    kinds = {line.id: line.kind for line in status.timeline}
    assert kinds[2] == "regional", status.timeline  # the fault made the last checkpoint before it regional
    assert status.next_epoch == latest.id + 1  # no epoch planned and left open
    assert status.lease is not None and status.lease["released"] is True, status.lease
    assert took < 120, took
