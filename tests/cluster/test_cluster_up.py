"""The local cluster for real: `scripts/cluster.sh up`, every service healthy, a Spark job on
the standalone master reading and writing Delta on the object store (s3a), deltalake commits
on the same store (concurrent writers: one fails), a DAG run through Airflow's REST API on the
LocalExecutor, then `down` with no process left.

The tests of this module share one cluster (module fixture) and run in file order; the last
one takes it down. Wall time of each phase is printed at the end (and written to
``var/cluster-test-timings.json``). ``bash scripts/setup.sh cluster`` runs first (it builds the
object store and fetches the S3A jars once; later runs find its stamps current).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.cluster.local import BUCKET, HOST, SERVICES, LocalCluster
from splitkeeper.cluster.s3 import S3Client, S3Error
from splitkeeper.resources import require_checkout

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

ROOT = require_checkout("the cluster test")
TIMINGS: dict[str, float] = {}


def _run(
    argv: list[str], timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=ROOT,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Phase:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> Phase:
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        TIMINGS[self.name] = round(time.monotonic() - self.t0, 1)


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    with Phase("setup.sh cluster"):
        setup = _run(["bash", "scripts/setup.sh", "cluster"], timeout=1800)
    assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
    # A folder the postgres user can reach (pytest's own tmp folders are 0700 under /tmp).
    root = Path(tempfile.mkdtemp(prefix="splitkeeper-cluster-"))
    root.chmod(0o755)
    with Phase("cluster.sh up"):
        up = _run(["bash", "scripts/cluster.sh", "up", "--dir", str(root)], timeout=600)
    cluster = LocalCluster(root)
    try:
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        yield cluster
    finally:
        if cluster.state() and cluster.state().services:  # a test failed before the down test
            _run(["bash", "scripts/cluster.sh", "down", "--dir", str(root)], timeout=300)
        state = cluster.state()
        if state:
            TIMINGS.update({f"cluster: {k}": v for k, v in state.timings_s.items()})
        report = ROOT / "var" / "cluster-test-timings.json"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(TIMINGS, indent=2) + "\n")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                reporter.write_line(
                    f"cluster test wall time per phase (s, also in {report}): {json.dumps(TIMINGS)}"
                )
        if not cluster.processes():
            shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------


def test_status_says_every_service_is_healthy(cluster):
    with Phase("check: status"):
        done = _run(
            ["bash", "scripts/cluster.sh", "status", "--dir", str(cluster.root), "--json"], timeout=120
        )
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = {s["name"]: s for s in json.loads(done.stdout)}
    assert set(statuses) == set(SERVICES)
    unhealthy = {n: s["detail"] for n, s in statuses.items() if not s["healthy"]}
    assert not unhealthy
    assert "2 worker(s) ALIVE" in statuses["spark-master"]["detail"]
    assert "auth on" in statuses["airflow-api-server"]["detail"]
    assert BUCKET in statuses["object-store"]["detail"]
    assert statuses["kafka"]["detail"].startswith("Kafka metadata: 1 broker(s)")


def _listening_sockets() -> dict[int, str]:
    """inode -> local address of every listening TCP socket (IPv4 and IPv6)."""
    found = {}
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A":  # LISTEN
                continue
            addr, port = cols[1].split(":")
            assert len(addr) == width
            found[int(cols[9])] = f"{addr}:{int(port, 16)}"
    return found


def test_every_port_of_every_cluster_process_is_bound_to_loopback(cluster):
    loopback = {"0100007F", "0000000000000000FFFF00000100007F", "00000000000000000000000001000000"}
    listening = _listening_sockets()
    bound: dict[int, list[str]] = {}
    for pid in cluster.processes():
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in listening:
                    bound.setdefault(pid, []).append(listening[inode])
    assert len(bound) >= 8, bound  # postgres, versitygw, kafka, master, 2 workers, api-server, scheduler
    wild = {pid: a for pid, addrs in bound.items() for a in addrs if a.split(":")[0] not in loopback}
    assert not wild, f"listening beyond 127.0.0.1: {wild}"


def test_credentials_are_private_and_the_env_file_holds_no_secret(cluster):
    creds = cluster.credentials()
    assert cluster.layout.credentials.stat().st_mode & 0o777 == 0o600
    for private in ("spark/daemon.conf", "spark/conf/spark-defaults.conf", "airflow/passwords.json"):
        assert (cluster.root / private).stat().st_mode & 0o777 == 0o600, private
    env_text = cluster.layout.env_file.read_text()
    status_text = json.dumps([s.__dict__ for s in cluster.status()])
    logs = "".join(p.read_text(errors="replace") for p in cluster.layout.logs.glob("*.log") if p.is_file())
    for secret in creds.values():
        assert secret not in env_text and secret not in status_text
        assert secret not in logs, "a secret reached a log file"
    assert "SPLITKEEPER_SPARK_MASTER" in env_text and "SPLITKEEPER_SPARK_CONF" in env_text
    # the env file, sourced by a shell, gives the resolved values
    shell = _run(["bash", "-c", f"source {cluster.layout.env_file} && env"], timeout=30)
    exported = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
    assert exported["AWS_SECRET_ACCESS_KEY"] == creds.s3_secret_key
    assert exported["SPLITKEEPER_SPARK_MASTER"] == cluster.client_env()["SPLITKEEPER_SPARK_MASTER"]


SPARK_AND_DELTALAKE_JOB = textwrap.dedent(
    """
    import json, os, sys, time
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from splitkeeper.runtime.spark import SparkSettings, get_spark

    table = sys.argv[1]                      # "<bucket>/<path>": s3a:// for Spark, s3:// for deltalake
    t0 = time.monotonic()
    spark = get_spark(SparkSettings.from_env(app_name="cluster-check", ui_enabled=False))
    sc = spark.sparkContext
    out = {"master": sc.master, "session_s": round(time.monotonic() - t0, 1)}
    deadline = time.monotonic() + 60        # both workers' executors registered
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    out["executors"] = sc._jsc.sc().getExecutorMemoryStatus().size() - 1

    def ancestors(_rows):                    # python worker <- pyspark daemon <- executor JVM <- Spark worker
        pid, chain = os.getpid(), []
        while pid > 1 and len(chain) < 8:
            chain.append(pid)
            pid = int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
        yield chain
    out["task_ancestors"] = sc.parallelize(range(8), 8).mapPartitions(ancestors).collect()

    t1 = time.monotonic()
    spark.range(0, 1500, numPartitions=4).selectExpr("id", "id % 7 AS k").write.format("delta") \
        .mode("overwrite").save(f"s3a://{table}")
    counted = spark.read.format("delta").load(f"s3a://{table}").selectExpr("count(*)", "sum(id)").collect()[0]
    out["spark_rows"], out["spark_sum"] = counted[0], counted[1]
    out["spark_write_read_s"] = round(time.monotonic() - t1, 1)

    t2 = time.monotonic()                    # one deltalake (delta-rs) commit on the same table
    row = pa.table({"id": pa.array([5000], pa.int64()), "k": pa.array([3], pa.int64())})
    write_deltalake(f"s3://{table}", row, mode="append")
    dt = DeltaTable(f"s3://{table}")
    out["deltalake_version"] = dt.version()
    out["deltalake_rows"] = dt.to_pyarrow_table().num_rows
    out["deltalake_s"] = round(time.monotonic() - t2, 1)
    out["spark_rows_after"] = spark.read.format("delta").load(f"s3a://{table}").count()
    spark.stop()
    print("RESULT " + json.dumps(out))
    """
)


def test_spark_job_on_the_standalone_master_reads_and_writes_delta_on_s3a_and_deltalake_commits(
    cluster, tmp_path
):
    env = {**os.environ, **cluster.client_env(), "PYTHONPATH": str(ROOT)}
    script = tmp_path / "job.py"
    script.write_text(SPARK_AND_DELTALAKE_JOB)
    table = f"{BUCKET}/checks/spark-{uuid.uuid4().hex[:8]}"
    with Phase("check: spark job + deltalake commit"):
        done = _run([sys.executable, str(script), table], timeout=600, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    for secret in cluster.credentials().values():
        assert secret not in output, "a secret reached the job's output"
    result = json.loads(next(ln for ln in done.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    state = cluster.state()
    assert result["master"] == f"spark://{HOST}:{state.ports['spark_master']}"
    assert result["executors"] == 2
    worker_pids = {state.services[f"spark-worker-{i}"]["pid"] for i in (1, 2)}
    # every task ran in an executor launched by one of the two Spark workers, and both took tasks
    ran_under = {pid for chain in result["task_ancestors"] for pid in chain if pid in worker_pids}
    assert all(set(chain) & worker_pids for chain in result["task_ancestors"]), result["task_ancestors"]
    assert ran_under == worker_pids, (ran_under, worker_pids)
    assert result["spark_rows"] == 1500 and result["spark_sum"] == sum(range(1500))
    assert result["deltalake_rows"] == 1501 and result["spark_rows_after"] == 1501
    TIMINGS.update({f"job: {k}": v for k, v in result.items() if k.endswith("_s")})


RACE_WRITER = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, write_deltalake

    uri, me, go, retries = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dt = DeltaTable(uri)                 # both writers hold the same snapshot (version 0) ...
    open(f"{go}.{me}.ready", "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    try:                                 # ... and commit version 1 at the same moment
        write_deltalake(dt, pa.table({"writer": [me]}), mode="append",
                        commit_properties=CommitProperties(max_commit_retries=retries))
        print("OK", DeltaTable(uri).version())
    except Exception as err:
        print("FAILED", type(err).__name__)
    """
)


def _race(cluster: LocalCluster, tmp_path: Path, retries: int) -> tuple[list[str], int, list[str]]:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    env = {**os.environ, **cluster.client_env()}
    storage = {k: v for k, v in cluster.client_env().items() if k.startswith("AWS_")}
    uri = f"s3://{BUCKET}/checks/race-{uuid.uuid4().hex[:8]}"
    write_deltalake(uri, pa.table({"writer": ["init"]}), storage_options=storage)
    script = tmp_path / "writer.py"
    script.write_text(RACE_WRITER)
    go = tmp_path / f"go-{retries}"
    writers = [
        subprocess.Popen(
            [sys.executable, str(script), uri, name, str(go), str(retries)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{n}.ready").exists() for n in ("a", "b")):
        assert time.monotonic() < deadline, [w.poll() for w in writers]
        time.sleep(0.01)
    go.touch()
    outputs = [w.communicate(timeout=120)[0].strip().splitlines()[-1] for w in writers]
    table = DeltaTable(uri, storage_options=storage)
    return outputs, table.version(), sorted(table.to_pyarrow_table()["writer"].to_pylist())


def test_concurrent_deltalake_commits_on_the_store_one_fails_none_is_lost(cluster, tmp_path):
    with Phase("check: deltalake race"):
        # no retries: both commit version 1 with If-None-Match; the store lets exactly one through
        outputs, version, rows = _race(cluster, tmp_path, retries=0)
        assert sorted(o.split()[0] for o in outputs) == ["FAILED", "OK"], outputs
        assert version == 1 and len(rows) == 2
        # with retries (delta-rs' default), the loser rebases onto version 1: both land, nothing lost
        outputs, version, rows = _race(cluster, tmp_path, retries=10)
        assert [o.split()[0] for o in outputs] == ["OK", "OK"], outputs
        assert version == 2 and rows == ["a", "b", "init"]
        # the primitive itself: a conditional create of an existing key is refused (412)
        creds = cluster.credentials()
        s3 = S3Client(
            f"http://{HOST}:{cluster.state().ports['s3']}", creds.s3_access_key, creds.s3_secret_key
        )
        key = f"checks/put-{uuid.uuid4().hex[:8]}"
        s3.put_object(BUCKET, key, b"first", if_none_match=True)
        with pytest.raises(S3Error) as refused:
            s3.put_object(BUCKET, key, b"second", if_none_match=True)
        assert refused.value.status == 412 and s3.get_object(BUCKET, key) == b"first"


def _api(
    cluster: LocalCluster,
    method: str,
    path: str,
    token: str | None = None,
    body: dict[str, Any] | None = None,
) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{cluster.airflow_url()}{path}",
        method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def test_a_dag_run_triggered_through_the_rest_api_runs_on_the_local_executor(cluster):
    env = cluster.client_env()
    dag = "splitkeeper_cluster_check"
    with Phase("check: DAG run via REST"):
        assert _api(cluster, "GET", "/api/v2/dags")[0] == 401  # authentication is on
        status, bad = _api(cluster, "POST", "/auth/token", body={"username": "operator", "password": "wrong"})
        assert status == 401, bad
        status, token = _api(
            cluster,
            "POST",
            "/auth/token",
            body={
                "username": env["SPLITKEEPER_AIRFLOW_USER"],
                "password": env["SPLITKEEPER_AIRFLOW_PASSWORD"],
            },
        )
        assert status == 201, token
        token = token["access_token"]
        deadline = time.monotonic() + 180  # the dag-processor parses dags/ after start-up
        while _api(cluster, "GET", f"/api/v2/dags/{dag}", token)[0] != 200:
            assert time.monotonic() < deadline, "the DAG never appeared"
            time.sleep(1)
        status, _ = _api(cluster, "PATCH", f"/api/v2/dags/{dag}", token, {"is_paused": False})
        assert status == 200
        status, run = _api(cluster, "POST", f"/api/v2/dags/{dag}/dagRuns", token, {"logical_date": None})
        assert status == 200, run
        run_id = run["dag_run_id"]
        deadline = time.monotonic() + 240
        while True:
            status, run = _api(cluster, "GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}", token)
            if run["state"] in ("success", "failed"):
                break
            assert time.monotonic() < deadline, run
            time.sleep(1)
        assert run["state"] == "success", run
        status, xcom = _api(
            cluster,
            "GET",
            f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/where_am_i/xcomEntries/return_value",
            token,
        )
        assert status == 200, xcom
        seen = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert seen["executor"] == "LocalExecutor"
    assert (
        cluster.state().services["airflow-scheduler"]["pid"] in seen["ancestors"]
    )  # a child of the scheduler
    assert seen["spark_master"] == env["SPLITKEEPER_SPARK_MASTER"]
    assert seen["s3_endpoint"] == env["AWS_ENDPOINT_URL"]


def test_a_killed_spark_worker_shows_in_status_and_restarts(cluster):
    with Phase("check: worker SIGKILL + restart"):
        pid = cluster.state().services["spark-worker-2"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        statuses = {s.name: s for s in cluster.status()}
        assert not statuses["spark-worker-2"].running and not statuses["spark-worker-2"].healthy
        assert statuses["spark-worker-1"].healthy and statuses["spark-master"].healthy
        new_pid = cluster.start_spark_worker(2)
        assert new_pid != pid
        statuses = {s.name: s for s in cluster.status()}
        assert all(s.healthy for s in statuses.values()), {n: s.detail for n, s in statuses.items()}


def test_down_stops_everything_and_leaves_no_process(cluster):
    assert cluster.processes()
    with Phase("cluster.sh down"):
        done = _run(["bash", "scripts/cluster.sh", "down", "--dir", str(cluster.root)], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert cluster.processes() == []
    assert not (cluster.layout.pg_data / "postmaster.pid").exists()
    status = _run(["bash", "scripts/cluster.sh", "status", "--dir", str(cluster.root)], timeout=60)
    assert status.returncode == 3, status.stdout  # nothing running
