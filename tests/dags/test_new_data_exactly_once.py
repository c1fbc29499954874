"""Event-driven runs (``airflow.schedule: on_new_data``) under a real scheduler and triggerer that
are SIGKILLed mid-stream: each batch of new files leads to exactly one DAG run, and the sink holds
every input line once (issue 40 item 5).

The Airflow here is the real one in separate processes: ``airflow db migrate`` on a SQLite
database, then ``api-server`` (the execution API the tasks talk to), ``scheduler`` (LocalExecutor:
each task a real process with local Spark), ``dag-processor`` and ``triggerer``, all with the
provider's DAGs for one files pipeline (:func:`splitkeeper.airflow.splitkeeper_dags`). Only the
ingest DAG is unpaused. The test reads the metadata database (SQLite) only to watch and count.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

DAG_ID = "splitkeeper_ingest"
PIPELINE = "eventful"
BATCHES = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Airflow:
    """The Airflow processes of the test, each in its own process group (a SIGKILL reaches the
    triggerer's runner child too), with their logs in ``home/logs``."""

    def __init__(self, home: Path, dags: Path) -> None:
        self.home = home
        self.db = home / "airflow.db"
        self.logs = home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.api = f"http://127.0.0.1:{port}"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db}",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": self.api,
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.logs / "tasks"),
            "SPLITKEEPER_PIPELINE_CONFIG": "",
        }
        self.cli = str(Path(sys.executable).with_name("airflow"))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: Counter[str] = Counter()

    def run(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [self.cli, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        assert done.returncode == 0, f"airflow {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def start(self, name: str, *args: str) -> None:
        self.starts[name] += 1
        log = open(self.logs / f"{name}.{self.starts[name]}.log", "wb")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(
            [self.cli, name, *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, name: str) -> None:
        """SIGKILL the service and every process of its group (the triggerer's runner child)."""
        proc = self.procs.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def query(self, sql: str, *params: object) -> list[tuple]:
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30) as db:
            return db.execute(sql, params).fetchall()

    def runs(self) -> list[tuple[str, str]]:
        return self.query("SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id", DAG_ID)

    def cursor(self) -> str | None:
        rows = self.query("SELECT val FROM variable WHERE key = ?", f"splitkeeper_new_data__{DAG_ID}")
        return rows[0][0] if rows else None

    def asset_events(self) -> int:
        """The trigger's events committed (not the ingest task's outlet events)."""
        return int(self.query("SELECT count(*) FROM asset_event WHERE extra LIKE '%from_trigger%'")[0][0])

    def ingested(self) -> int:
        """The ingest DAG's runs whose epochs task succeeded (validate and report may still run)."""
        return int(
            self.query(
                "SELECT count(*) FROM task_instance WHERE dag_id = ? AND task_id = 'run_epochs' "
                "AND state = 'success'",
                DAG_ID,
            )[0][0]
        )

    def consumed(self, run_id: str) -> list[dict]:
        """The payloads of the trigger events a DAG run consumed."""
        rows = self.query(
            "SELECT e.extra FROM asset_event e JOIN dagrun_asset_event d ON d.event_id = e.id "
            "JOIN dag_run r ON r.id = d.dag_run_id WHERE r.dag_id = ? AND r.run_id = ?",
            DAG_ID,
            run_id,
        )
        return [json.loads(extra)["payload"] for (extra,) in rows]

    def wait(self, what: str, ready, timeout: float, step: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                assert proc.poll() is None, (
                    f"airflow {name} exited ({proc.returncode}) while waiting for {what}"
                )
            try:
                got = ready()
            except sqlite3.OperationalError:  # the database is busy, or not migrated yet
                got = None
            if got:
                return got
            time.sleep(step)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; runs {self.runs()}")


def _drop(folder: Path, batch: int, files: int = 2, lines: int = 5) -> list[str]:
    """Batch ``batch``: ``files`` new files, each moved into the folder whole. Returns its lines."""
    staged = folder.parent / "staging"
    staged.mkdir(exist_ok=True)
    written = []
    for f in range(files):
        body = [f"batch{batch}-file{f}-line{i}" for i in range(lines)]
        (staged / f"b{batch}-{f}.txt").write_text("\n".join(body) + "\n", encoding="utf-8")
        os.replace(staged / f"b{batch}-{f}.txt", folder / f"b{batch}-{f}.txt")
        written += body
    return written


def _kill_right_after_fire(airflow: Airflow, before: str | None, timeout: float = 300) -> tuple[str, bool]:
    """SIGKILL the triggerer the moment its cursor moves (rule 6: written just before the event is
    yielded). Returns the cursor and whether the event had been committed when the kill landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            now = airflow.cursor()
        except sqlite3.OperationalError:
            now = before
        if now != before:
            events_before_kill = airflow.asset_events()
            airflow.kill("triggerer")
            return str(now), airflow.asset_events() > events_before_kill
        time.sleep(0.01)
    raise AssertionError("the trigger never fired")


def _wait_for_runs(airflow: Airflow, n: int, timeout: float = 600) -> list[tuple[str, str]]:
    def done():
        runs = airflow.runs()
        assert all(state != "failed" for _r, state in runs), runs
        return runs if len(runs) >= n and all(state == "success" for _r, state in runs) else None

    return airflow.wait(f"{n} successful DAG run(s)", done, timeout)


def test_each_batch_makes_one_dag_run_across_triggerer_and_scheduler_kills(tmp_path):
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config
    from splitkeeper.sinks.delta.read import read_sink

    inbox = tmp_path / "in"
    inbox.mkdir()
    config_path = tmp_path / "pipelines" / f"{PIPELINE}.yaml"
    config_path.parent.mkdir()
    config_path.write_text(
        f"""
name: {PIPELINE}
parallelism: 1
source: {{kind: files, path: {inbox}, format: lines}}
state: {{path: {tmp_path / "state"}}}
sink: {{path: {tmp_path / "sink"}}}
airflow: {{schedule: on_new_data, poll_interval_s: 1}}
""",
        encoding="utf-8",
    )
    # the first run of the empty folder commits a checkpoint with no region task (no Spark), so
    # the first event is for the first batch, not for a state that never checkpointed
    assert services.run(load_config(str(config_path))).finished

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "splitkeeper_dags.py").write_text(
        f"from splitkeeper.airflow import splitkeeper_dags\n\nsplitkeeper_dags({str(config_path)!r})\n",
        encoding="utf-8",
    )
    airflow = Airflow(tmp_path / "airflow", dags)
    started = time.monotonic()
    airflow.run("db", "migrate")
    airflow.run("pools", "set", f"splitkeeper-{PIPELINE}", "1", "one writer per pipeline")
    try:
        airflow.start("api-server", "--host", "127.0.0.1", "--port", airflow.env["AIRFLOW__API__PORT"])
        airflow.start("scheduler", "--skip-serve-logs")
        airflow.start("dag-processor")
        airflow.start("triggerer", "--skip-serve-logs")
        airflow.wait(
            "the ingest DAG parsed",
            lambda: airflow.query("SELECT 1 FROM dag WHERE dag_id = ?", DAG_ID),
            180,
        )
        airflow.run("dags", "unpause", DAG_ID)
        print(f"airflow up in {time.monotonic() - started:.0f} s")
        lines: list[str] = []
        outcomes = []

        # batch 1: the triggerer is SIGKILLed the moment it fires, then restarted
        cursor = airflow.cursor()
        lines += _drop(inbox, 1)
        cursor, committed = _kill_right_after_fire(airflow, cursor)
        outcomes.append(("killed right after the fire", committed))
        airflow.start("triggerer", "--skip-serve-logs")
        _wait_for_runs(airflow, 1)
        print(f"batch 1 run done at {time.monotonic() - started:.0f} s")

        # batch 2: dropped while the triggerer is down (killed between batches), the scheduler
        # SIGKILLed too; both restarted
        airflow.kill("triggerer")
        lines += _drop(inbox, 2)
        airflow.kill("scheduler")
        airflow.start("triggerer", "--skip-serve-logs")
        cursor, committed = _kill_right_after_fire(airflow, cursor)
        outcomes.append(("down while dropped, killed again right after the fire", committed))
        airflow.start("triggerer", "--skip-serve-logs")
        time.sleep(3)  # the event (or its re-fire) waits in the queue with no scheduler
        airflow.start("scheduler", "--skip-serve-logs")

        # batch 3: dropped while run 2 still validates (the trigger holds its event until that
        # run ends: rule 2), then the triggerer is SIGKILLed once the event is committed
        airflow.wait("run 2's epochs", lambda: airflow.ingested() >= 2, 600)
        print(f"batch 2 read at {time.monotonic() - started:.0f} s")
        lines += _drop(inbox, 3)
        events = airflow.asset_events()
        airflow.wait("the third event", lambda: airflow.asset_events() > events, 600, step=0.01)
        airflow.kill("triggerer")
        airflow.start("triggerer", "--skip-serve-logs")
        runs = _wait_for_runs(airflow, 3)

        # a while longer: many looks of the restarted trigger, no other run
        time.sleep(8)
        runs = _wait_for_runs(airflow, 3)
        print(f"kills: {outcomes}; runs: {runs}; {time.monotonic() - started:.0f} s in all")
    finally:
        airflow.stop_all()

    assert len(runs) == BATCHES, runs
    for batch, (run_id, _state) in enumerate(runs, start=1):
        consumed = airflow.consumed(run_id)
        assert consumed, f"run {run_id} consumed no event"
        named = {split for payload in consumed for split in payload["splits"]}
        assert named == {f"b{batch}-0.txt", f"b{batch}-1.txt"}, (run_id, consumed)
    # the third batch's event waited for run 2 to end (rule 2): none of run 3's events is older
    (early,) = airflow.query(
        "SELECT count(*) FROM asset_event e JOIN dagrun_asset_event d ON d.event_id = e.id "
        "JOIN dag_run r ON r.id = d.dag_run_id WHERE r.run_id = ? "
        "AND e.timestamp < (SELECT end_date FROM dag_run WHERE run_id = ?)",
        runs[2][0],
        runs[1][0],
    )
    assert early == (0,)
    sink = read_sink(str(tmp_path / "sink"), ["value"]).column("value").to_pylist()
    assert Counter(v.decode() if isinstance(v, bytes) else v for v in sink) == Counter(lines)  # each once
