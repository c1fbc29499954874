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

import contextlib
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.resources import require_checkout
from splitkeeper_tools.cluster.local import BUCKET, HOST, SERVICES, LocalCluster, _get_json
from splitkeeper_tools.cluster.s3 import S3Client, S3Error

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
    # The DAGs run the end-to-end test's two pipelines (their files exist before `up`: it creates
    # their writer pools); only triggered runs, so no scheduled ingest interferes.
    env = {
        **os.environ,
        "SPLITKEEPER_PIPELINE_CONFIG": os.pathsep.join(str(p) for p in _write_e2e_pipelines(root / "e2e")),
        "SPLITKEEPER_REPORTS_DIR": str(root / "e2e" / "reports"),
        "SPLITKEEPER_AIRFLOW_SCHEDULES": "0",
    }
    with Phase("cluster.sh up"):
        up = _run(["bash", "scripts/cluster.sh", "up", "--dir", str(root)], timeout=600, env=env)
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
    # Health is awaited (60 s), not sampled once: on a loaded machine one probe may time out.
    deadline = time.monotonic() + 60
    with Phase("check: status"):
        while True:
            done = _run(
                ["bash", "scripts/cluster.sh", "status", "--dir", str(cluster.root), "--json"], timeout=120
            )
            statuses = {s["name"]: s for s in json.loads(done.stdout)}
            unhealthy = {n: s["detail"] for n, s in statuses.items() if not s["healthy"]}
            if not unhealthy or time.monotonic() > deadline:
                break
            time.sleep(2)
    assert not unhealthy
    assert done.returncode == 0, done.stderr
    assert set(statuses) == set(SERVICES)
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
    from splitkeeper.spark.session import SparkSettings, get_spark

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


def test_the_store_probe_passes_on_the_store_and_refuses_it_behind_a_proxy_dropping_if_none_match(
    cluster, tmp_path, monkeypatch
):
    """The probe every writer runs at open (splitkeeper.delta.probe), against the real store: it
    passes; behind the fault proxy that drops If-None-Match (signing again, as a gateway that
    ignores the header would forward it) it is [STORE_UNSAFE], and `splitkeeper run` stops
    before it writes anything."""
    from splitkeeper.delta import probe
    from splitkeeper.delta.probe import probe_store
    from splitkeeper.errors import StoreUnsafeError
    from splitkeeper_tools.fault_proxy import FaultProxy

    with Phase("check: store probe"):
        for key, value in cluster.client_env().items():
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, value)
        creds = cluster.credentials()
        endpoint = f"http://{HOST}:{cluster.state().ports['s3']}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        base = f"s3://{BUCKET}/checks/probe-{uuid.uuid4().hex[:8]}"
        probe._reset_for_tests()
        try:
            assert probe_store(f"{base}/state") is True
            keys = (creds.s3_access_key, creds.s3_secret_key)
            with FaultProxy(endpoint, drop_headers={"If-None-Match"}, credentials=keys) as proxy:
                monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
                probe._reset_for_tests()
                with pytest.raises(StoreUnsafeError, match=r"accepted a second conditional create"):
                    probe_store(f"{base}/state")
                assert [r.dropped for r in proxy.seen if r.method == "PUT"] == [("If-None-Match",)] * 2
                (tmp_path / "in").mkdir()
                (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")
                config = tmp_path / "probe.yaml"
                config.write_text(
                    json.dumps(
                        {
                            "name": "probe",
                            "parallelism": 1,
                            "source": {"kind": "files", "path": str(tmp_path / "in"), "format": "lines"},
                            "state": {"path": f"{base}/state"},
                            "sink": {"path": f"{base}/sink"},
                            "staging": {"path": str(tmp_path / "staging")},
                        }
                    )
                )
                env = {**os.environ, "AWS_ENDPOINT_URL": proxy.url}
                refused = _run(
                    [sys.executable, "-m", "splitkeeper", "run", "--config", str(config)], 300, env
                )
            assert refused.returncode == 2 and "[STORE_UNSAFE]" in refused.stderr, refused.stderr
        finally:
            probe._reset_for_tests()
        s3 = S3Client(endpoint, *keys)
        with pytest.raises(S3Error) as missing:  # nothing of the refused run was written
            s3.get_object(BUCKET, f"{base.split('/', 3)[3]}/state/lease/_delta_log/00000000000000000000.json")
        assert missing.value.status == 404


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
        # Every probe answers again; on a loaded machine a probe (the worker's UI, Airflow's API)
        # may time out once just after the restart, so health is awaited, not sampled once.
        deadline = time.monotonic() + 60
        while True:
            unhealthy = {s.name: s.detail for s in cluster.status() if not s.healthy}
            if not unhealthy or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert not unhealthy


# --------------------------------------------------------------------------------------- end to end
# Two pipelines, Delta state and sink on the object store (s3a://), run by Airflow's scheduler:
# the ingest DAG's epochs go through spark-submit to the standalone workers; a worker JVM is
# SIGKILLed mid-epoch; a second writer of the pipeline (the maintain DAG), triggered while the
# ingest runs, queues for the pipeline's one-slot pool; the recover DAG is triggered through the
# REST API with a rescale; every run's restart checks pass and each sink holds its source exactly
# once. Data is tiny (200 lines, 300 messages): the DAG runs are what cost (mostly their validate
# task: Great Expectations on Spark), so there are three of them and one maintain run.

E2E_FILES, E2E_LINES = 4, 50  # the files pipeline: 4 files (one split each) of 50 lines
E2E_TOPIC, E2E_PARTITIONS = "e2e-orders", 2
E2E_EPOCH_RECORDS = 52  # the files pipeline's epoch: 13 lines a file
E2E_STALL_S = 15  # both regions of the files pipeline's epoch 2 sleep this long: the kill lands there
E2E_COMMON = """
parallelism: 2
strategy: least-loaded
checkpoint: {max_consecutive_failures: 3, max_failure_ratio: 0.5, region_timeout_s: 150,
             retain_checkpoints: 3}
lease: {ttl_s: 30}
"""


def _write_e2e_pipelines(folder: Path) -> list[Path]:
    """The files and Kafka pipelines' configs (and the files source); Kafka and the lake are named
    by ``${...}`` references the Airflow services resolve from the cluster's environment."""
    incoming = folder / "files-in"
    incoming.mkdir(parents=True)
    for f in range(E2E_FILES):
        (incoming / f"part-{f}.txt").write_text("".join(f"file{f}-line{n:03d}\n" for n in range(E2E_LINES)))
    lake = "${SPLITKEEPER_LAKE_ROOT}/e2e"
    files = folder / "files.yaml"
    files.write_text(
        "name: e2e-files\n"
        "source: {kind: files, path: files-in, format: lines}\n"
        f"backlog: {{backlog_epoch_records: {E2E_EPOCH_RECORDS}, "
        f"normal_epoch_records: {E2E_EPOCH_RECORDS}}}\n"
        f'state: {{path: "{lake}/files/state"}}\n'
        f'sink: {{path: "{lake}/files/sink"}}\n'
        + E2E_COMMON  # staging: the default <state>/_staging, on the store (workers share no /tmp)
    )
    kafka = folder / "kafka.yaml"
    kafka.write_text(
        "name: e2e-kafka\n"
        "source: {kind: kafka, bootstrap_servers: '${SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS}', "
        f"topics: [{E2E_TOPIC}], starting: earliest}}\n"
        "backlog: {backlog_epoch_records: 120, normal_epoch_records: 120}\n"  # shared by the partitions
        f'state: {{path: "{lake}/kafka/state"}}\n'
        f'sink: {{path: "{lake}/kafka/sink"}}\n'
        + E2E_COMMON  # staging: the default <state>/_staging, on the store (workers share no /tmp)
    )
    return [files, kafka]


class AirflowApi:
    """Airflow's REST API (v2) as the ``operator`` user."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        env = cluster.client_env()
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
        self.token = token["access_token"]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        status, answer = _api(self.cluster, method, path, self.token, body)
        assert status in (200, 201), (method, path, status, answer)
        return answer

    def ready(self, dag: str, timeout_s: float = 180) -> None:
        """Wait until the dag-processor has parsed ``dag``, then unpause it."""
        deadline = time.monotonic() + timeout_s
        while _api(self.cluster, "GET", f"/api/v2/dags/{dag}", self.token)[0] != 200:
            assert time.monotonic() < deadline, f"DAG {dag} never appeared"
            time.sleep(1)
        self.call("PATCH", f"/api/v2/dags/{dag}", {"is_paused": False})

    def trigger(self, dag: str, conf: dict[str, Any]) -> str:
        return str(
            self.call("POST", f"/api/v2/dags/{dag}/dagRuns", {"logical_date": None, "conf": conf})[
                "dag_run_id"
            ]
        )

    def run(self, dag: str, run_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}"))

    def wait(self, dag: str, run_id: str, timeout_s: float = 600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (run := self.run(dag, run_id))["state"] not in ("success", "failed"):
            assert time.monotonic() < deadline, run
            time.sleep(1)
        return run

    def task(self, dag: str, run_id: str, task_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/{task_id}"))

    def xcom(self, dag: str, run_id: str, task_id: str) -> Any:
        entry = self.call(
            "GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        )
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) and value[:1] in "{[" else value

    def failure(self, dag: str, run_id: str) -> str:
        """Which tasks did not succeed, with their log tails (for assertion messages)."""
        tis = self.call("GET", f"/api/v2/dags/{dag}/dagRuns/{run_id}/taskInstances")["task_instances"]
        bad = [t["task_id"] for t in tis if t["state"] != "success"]
        return f"{dag} {run_id}: not successful {bad}\n" + "\n".join(
            _task_log(self.cluster, dag, run_id, t)[-3000:] for t in bad
        )


def _task_log(cluster: LocalCluster, dag: str, run_id: str, task_id: str) -> str:
    logs = [
        p
        for p in (cluster.layout.logs / "airflow-tasks" / f"dag_id={dag}").rglob("*.log")
        if f"run_id={run_id}" in str(p) and f"task_id={task_id}" in str(p)
    ]
    return "\n".join(p.read_text(errors="replace") for p in sorted(logs))


def _e2e_config(cluster: LocalCluster, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The pipeline as the DAGs see it; this process reads its state from the store like they do."""
    from splitkeeper.config.settings import load_config

    env = cluster.client_env()
    for key, value in env.items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    return load_config(cluster.root / "e2e" / f"{name}.yaml", env=env)


def _latest_checkpoint(config: Any) -> int:
    from splitkeeper.app import services

    latest = services.status(config).latest_checkpoint
    return 0 if latest is None else latest.id


def _sink_rows(config: Any) -> list[tuple[str, int, bytes]]:
    """(split id, offset, value) of every record in the pipeline's sink, read with deltalake."""
    from deltalake import DeltaTable

    from splitkeeper.delta import storage

    uri = storage.table_uri(config.sink.path)
    assert uri.startswith(f"s3://{BUCKET}/e2e/"), uri  # on the object store
    table = DeltaTable(uri, storage_options=storage.storage_options(uri)).to_pyarrow_table(
        columns=["split_id", "offset", "value"]
    )
    return list(zip(*(table[c].to_pylist() for c in ("split_id", "offset", "value")), strict=True))


def _assert_exactly_once(rows: list[tuple[str, int, bytes]], source: list[str] | list[bytes]) -> None:
    """Every source record once in the sink, byte for byte (the raw sink's values are its bytes)."""
    positions = [(split, offset) for split, offset, _ in rows]
    assert len(set(positions)) == len(positions), "a record was committed twice"
    values = sorted(v for _, _, v in rows)
    wanted = sorted(s.encode("utf-8", "surrogateescape") if isinstance(s, str) else s for s in source)
    missing, extra = sorted(set(wanted) - set(values)), sorted(set(values) - set(wanted))
    assert values == wanted, f"lost {len(missing)} {missing[:5]}, unexpected {len(extra)} {extra[:5]}"


def _log_events(log: str) -> list[str]:
    """The ``event`` text of every JSON line of a task log (Airflow 3 writes one JSON object a line)."""
    events = []
    for line in log.splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and isinstance(entry.get("event"), str):
                events.append(entry["event"])
    return events


def _secrets_in_command_lines(cluster: LocalCluster) -> dict[int, list[str]]:
    """pid -> the names of the credentials its command line (/proc/<pid>/cmdline) holds, over every
    process of the cluster (the services and their children: Airflow tasks, spark-submit, drivers,
    executors)."""
    secrets = {name: value for name, value in asdict(cluster.credentials()).items() if value}
    found: dict[int, list[str]] = {}
    for pid in cluster.processes():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        names = [name for name, value in secrets.items() if value in cmdline]
        if names:
            found[pid] = names
    return found


def _green(api: AirflowApi, dag: str, run_id: str, checkpoint: int | None = None) -> dict[str, Any]:
    """The run's restart checks (its validate task) passed; returns their verdict."""
    verdict = api.xcom(dag, run_id, "validate")
    assert verdict["success"] is True and set(verdict["suites"].values()) == {"passed"}, verdict
    if checkpoint is not None:
        assert verdict["checkpoint_id"] == checkpoint, verdict
    return dict(verdict)


def test_e2e_files_pipeline_on_the_workers_survives_a_killed_worker_a_queued_writer_and_a_rescale(
    cluster, monkeypatch
):
    api = AirflowApi(cluster)
    ingest, maintain, recover = (f"splitkeeper_{d}__e2e-files" for d in ("ingest", "maintain", "recover"))
    config = _e2e_config(cluster, "files", monkeypatch)
    source = [f"file{f}-line{n:03d}" for f in range(E2E_FILES) for n in range(E2E_LINES)]
    state = cluster.state()
    assert "splitkeeper-e2e-files" in state.pools and "splitkeeper-e2e-kafka" in state.pools
    with Phase("e2e files: DAGs parsed"):
        for dag in (ingest, maintain, recover):
            api.ready(dag)
    faults = [f"stall:{E2E_STALL_S}:0@2", f"stall:{E2E_STALL_S}:1@2"]
    # a per-run override that changes nothing (the file's own value): it goes through spark-submit
    override = {"backlog": {"normal_epoch_records": E2E_EPOCH_RECORDS}}
    with Phase("e2e files: ingest, 3 epochs, a worker killed in epoch 2"):
        first = api.trigger(
            ingest, {"epochs": 3, "until_caught_up": True, "faults": faults, "pipeline": override}
        )
        deadline = time.monotonic() + 300
        while _latest_checkpoint(config) < 1:  # epoch 1 committed: epoch 2 (the stall) comes next
            assert api.run(ingest, first)["state"] in ("queued", "running"), api.failure(ingest, first)
            assert time.monotonic() < deadline, "epoch 1 never committed"
            time.sleep(1)
        # a second writer of the pipeline is triggered while the ingest runs: it queues for the pool
        second = api.trigger(maintain, {})
        pool = api.call("GET", "/api/v2/pools/splitkeeper-e2e-files")
        assert pool["slots"] == 1 and pool["running_slots"] == 1, pool  # run_epochs holds the one slot
        # a second trigger of the ingest DAG itself: max_active_runs=1 keeps the run queued
        again = api.trigger(ingest, {})
        watched = time.monotonic()
        while time.monotonic() - watched < 4:  # epoch 2's region tasks are planned, launched and asleep
            assert api.run(ingest, first)["state"] == "running"
            assert api.run(ingest, again)["state"] == "queued", api.run(ingest, again)
            time.sleep(0.5)
        leaks = _secrets_in_command_lines(cluster)  # spark-submit, the driver, the executors run now
        assert not leaks, f"a secret on a command line: {leaks}"
        worker = state.services["spark-worker-2"]["pid"]
        running = _get_json(f"http://{HOST}:{state.ports['spark_worker_2_ui']}/json/")["executors"]
        master = _get_json(f"http://{HOST}:{state.ports['spark_master_ui']}/json/")
        assert any(e["appid"] in {a["id"] for a in master["activeapps"]} for e in running), (running, master)
        assert _latest_checkpoint(config) == 1  # still in epoch 2
        os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        assert _latest_checkpoint(config) == 1, "epoch 2 ended before the kill"
        writer = api.task(ingest, first, "run_epochs")
        waiting = api.task(maintain, second, "maintain")
        assert writer["state"] == "running" and waiting["state"] in (None, "scheduled", "queued"), waiting
        # the second ingest run is still queued behind the first; it is resolved without running
        # (marked failed through the REST API), so the checkpoints below stay the first run's
        assert api.run(ingest, again)["state"] == "queued" and api.run(ingest, first)["state"] == "running"
        api.call("PATCH", f"/api/v2/dags/{ingest}/dagRuns/{again}", {"state": "failed"})
        assert api.run(ingest, again)["state"] == "failed"
        cluster.start_spark_worker(2)  # the cluster heals; the job goes on without waiting for it
        done = api.wait(ingest, first)
        TIMINGS["e2e files: kill -> ingest run done"] = round(time.monotonic() - killed_at, 1)
        assert done["state"] == "success", api.failure(ingest, first)
    # Params reached the job through spark-submit: epochs=3 ended on checkpoint 3 (before anything
    # else could write), the faults were rendered into its arguments and stalled epoch 2
    _green(api, ingest, first, checkpoint=3)
    args = api.task(ingest, first, "run_epochs")["rendered_fields"]["application_args"]
    assert args[:4] == [
        "--config",
        str(cluster.root / "e2e" / "files.yaml"),
        "--epochs=3",
        "--until-caught-up",
    ]
    assert json.loads(args[args.index("--faults-json") + 1]) == faults
    assert json.loads(args[args.index("--pipeline-json") + 1]) == override
    log = _task_log(cluster, ingest, first, "run_epochs")
    assert f"spark-submit --master spark://{HOST}:{state.ports['spark_master']}" in log
    # the command the hook ran (as it logged it): the override follows --pipeline-json, as one JSON
    # document (the reset-backlog and reader-mode arguments come after it)
    submitted = [e for e in _log_events(log) if e.startswith("Spark-Submit cmd: ")]
    assert submitted, log[-4000:]
    for command in submitted:
        rendered, _ = json.JSONDecoder().raw_decode(command.split(" --pipeline-json ", 1)[1])
        assert rendered == override, command
    never = api.call("GET", f"/api/v2/dags/{ingest}/dagRuns/{again}/taskInstances")["task_instances"]
    # the queued run never ran a task: none was ever tried (marking the run failed gives its
    # unfinished tasks a final state, and a start and end date, without running them)
    assert never and all(t["try_number"] == 0 and t["pid"] is None for t in never), [
        (t["task_id"], t["state"], t["try_number"], t["pid"], t["hostname"]) for t in never
    ]
    assert "Lost executor" in log, log[-4000:]  # the kill reached the job: its tasks ran on the workers
    epoch2 = next(ln for ln in log.splitlines() if '"event":"epoch    2 ' in ln)
    assert float(epoch2.split("read=")[1].split()[0]) >= E2E_STALL_S, epoch2  # the stall
    with Phase("e2e files: the queued maintain run"):
        assert api.wait(maintain, second)["state"] == "success", api.failure(maintain, second)
    writer, waited = api.task(ingest, first, "run_epochs"), api.task(maintain, second, "maintain")
    assert waited["start_date"] >= writer["end_date"], (writer, waited)  # it ran once the writer was done
    with Phase("e2e files: recover with a rescale to 3 (REST trigger)"):
        run = api.trigger(recover, {"mode": "global", "parallelism": 3})
        assert api.wait(recover, run)["state"] == "success", api.failure(recover, run)
    restored = api.xcom(recover, run, "restore_enumerator_state")
    assert (restored["checkpoint_id"], restored["parallelism_before"], restored["parallelism"]) == (3, 2, 3)
    _green(api, recover, run, checkpoint=4)
    from splitkeeper.app import services

    latest = services.status(config).latest_checkpoint
    assert latest is not None and (latest.id, latest.parallelism) == (4, 3), latest
    with Phase("e2e files: sink check"):
        _assert_exactly_once(_sink_rows(config), source)  # 156 lines by the ingest, 44 by the rescaled epoch


def test_e2e_kafka_pipeline_runs_until_caught_up_on_the_workers(cluster, monkeypatch):
    from splitkeeper_tools.kafka_testbed import NumberedProducer, create_topics

    api = AirflowApi(cluster)
    ingest = "splitkeeper_ingest__e2e-kafka"
    config = _e2e_config(cluster, "kafka", monkeypatch)
    bootstrap = cluster.client_env()["SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS"]
    create_topics(bootstrap, {E2E_TOPIC: E2E_PARTITIONS})
    producer = NumberedProducer(bootstrap, [(E2E_TOPIC, p) for p in range(E2E_PARTITIONS)], seed=12)
    producer.produce(300)
    assert not producer.failed
    api.ready(ingest)
    with Phase("e2e kafka: ingest until caught up"):
        run = api.trigger(ingest, {"epochs": 10, "until_caught_up": True})
        assert api.wait(ingest, run)["state"] == "success", api.failure(ingest, run)
    # until_caught_up reached the job: it stopped once caught up (about 150 per partition, 60 an
    # epoch), not after the 10 epochs it was allowed
    checked = _green(api, ingest, run)
    assert 2 <= checked["checkpoint_id"] < 10, checked
    args = api.task(ingest, run, "run_epochs")["rendered_fields"]["application_args"]
    assert args[1:4] == [str(cluster.root / "e2e" / "kafka.yaml"), "--epochs=10", "--until-caught-up"], args
    # the report task's "Run report" link (the splitkeeper plugin), served by the API server itself
    links = api.call("GET", f"/api/v2/dags/{ingest}/dagRuns/{run}/taskInstances/report/links")
    link = links["extra_links"]["Run report"]
    assert link.startswith("/splitkeeper/report/"), links
    with pytest.raises(urllib.error.HTTPError) as anonymous:  # the plugin's pages need a token
        urllib.request.urlopen(f"{cluster.airflow_url()}{link}", timeout=30)
    assert anonymous.value.code == 401
    request = urllib.request.Request(
        f"{cluster.airflow_url()}{link}", headers={"Authorization": f"Bearer {api.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # redirected to that run's kept page
        page = response.read().decode()
    assert response.status == 200 and "e2e-kafka" in page and "chart-timeline" in page
    assert "/runs/" in response.url, response.url
    with Phase("e2e kafka: sink check"):
        _assert_exactly_once(_sink_rows(config), list(producer.delivered.values()))


def test_state_store_sink_and_fence_on_the_object_store(cluster, tmp_path, monkeypatch):
    """The delta-rs state store and the sink on the store (s3://): a checkpoint and an epoch
    commit land, a stale writer is refused by the fence, a fresh store restores the same."""
    from splitkeeper.core.ports import RegionRun
    from splitkeeper.core.types import RegionOutcome
    from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
    from splitkeeper.errors import ConcurrentRunError
    from splitkeeper.sinks.delta.sink import DeltaSink
    from splitkeeper.spark.task import write_staged
    from tests.state.samples import global_

    for key, value in cluster.client_env().items():
        if key.startswith("AWS_"):
            monkeypatch.setenv(key, value)
    base = f"s3://{BUCKET}/checks/store-{uuid.uuid4().hex[:8]}"
    with Phase("check: state store and sink on s3"):
        store = DeltaStateStore(base + "/state", "orders", "files:/in")
        store.write_plan(1, {0: [("s0", 0, 1)]})
        decision = decision_for(global_(1))
        store.write_decision(decision)
        staged = write_staged(
            [(0, 1, "v")], "s0", str(tmp_path / "epoch=1" / "region=0" / "attempt=a" / "part.parquet"),
            epoch=1, region=0,
        )  # fmt: skip
        sink = DeltaSink(base + "/sink", "orders")
        run = RegionRun(region_id=0, outcome=RegionOutcome.ACK, output=staged.path)
        assert sink.commit(1, [run], expected=None, attempt_id=decision.attempt_id).records == 1
        with pytest.raises(ConcurrentRunError):
            sink.commit(2, [], expected=None, attempt_id="stale")  # epoch 1 is there: not expected None
        store.commit_checkpoint(decision)
        fresh = DeltaStateStore(base + "/state", "orders", "files:/in")
        assert fresh.latest_checkpoint() == global_(1) and fresh.decision(1, decision.attempt_id) == decision
        assert DeltaSink(base + "/sink", "orders", read_only=True).committed_attempt(1) == decision.attempt_id


#: The files that must hold credentials (cluster folder relative path -> the credentials each may
#: hold): everything else under the folder holds none (tools/splitkeeper_tools/cluster/local.py).
SECRET_FILES = {
    "credentials.env": "all",
    "spark/daemon.conf": {"spark_auth_secret"},  # the master's and workers' authentication
    "spark/conf/spark-defaults.conf": {"spark_auth_secret", "s3_access_key", "s3_secret_key"},  # clients
    "airflow/passwords.json": {"airflow_admin_password", "airflow_operator_password"},  # the users
}


def test_no_secret_in_any_file_of_the_cluster_folder_nor_on_any_command_line(cluster):
    """After the end-to-end runs: every file under the cluster folder (logs, task logs, Spark work
    folders, PostgreSQL's and the object store's data, the pipelines' staging and reports) and the
    command line of every cluster process, for every credential of the cluster."""
    secrets = {name: value.encode() for name, value in asdict(cluster.credentials()).items()}
    assert all(secrets.values())
    found: dict[str, list[str]] = {}
    held: dict[str, set[str]] = {}  # what the files that must hold credentials were seen to hold
    scanned = 0
    with Phase("check: secrets scan"):
        for path in sorted(cluster.root.rglob("*")):
            if path.is_symlink() or not path.is_file():
                continue
            try:
                data = path.read_bytes()
            except OSError as err:  # a file removed meanwhile (a service still writes)
                if path.exists():
                    raise AssertionError(f"cannot read {path}: {err}") from None
                continue
            scanned += len(data)
            names = [name for name, value in secrets.items() if value in data]
            relative = str(path.relative_to(cluster.root))
            allowed = SECRET_FILES.get(relative, set())
            if relative in SECRET_FILES:
                held[relative] = set(names)
            unexpected = [n for n in names if allowed != "all" and n not in allowed]
            if unexpected:
                found[relative] = unexpected
        leaks = _secrets_in_command_lines(cluster)
    for relative, allowed in SECRET_FILES.items():
        assert (cluster.root / relative).stat().st_mode & 0o777 == 0o600, relative
        # the search finds what is there: each such file holds exactly its credentials
        assert held.get(relative) == (set(secrets) if allowed == "all" else allowed), (relative, held)
    TIMINGS["secrets scan: MB"] = round(scanned / 1e6, 1)
    assert scanned > 10e6, scanned  # the data folders were there to scan
    assert not found, f"credentials in files of the cluster folder: {found}"
    assert not leaks, f"credentials on command lines (pid -> names): {leaks}"


def test_down_stops_everything_and_leaves_no_process(cluster):
    assert cluster.processes()
    with Phase("cluster.sh down"):
        done = _run(["bash", "scripts/cluster.sh", "down", "--dir", str(cluster.root)], timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert cluster.processes() == []
    assert not (cluster.layout.pg_data / "postmaster.pid").exists()
    status = _run(["bash", "scripts/cluster.sh", "status", "--dir", str(cluster.root)], timeout=60)
    assert status.returncode == 3, status.stdout  # nothing running
