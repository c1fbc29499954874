"""Parts of the local cluster that need no running service: credentials, env file, ports, status."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
from datetime import UTC

import pytest

from splitkeeper_tools.cluster.local import (
    PORT_NAMES,
    SERVICES,
    ClusterError,
    ClusterState,
    Credentials,
    LocalCluster,
    ServiceStatus,
    choose_ports,
    format_status,
    scram_sha256,
)
from splitkeeper_tools.cluster.s3 import S3Client


def test_credentials_are_generated_fresh_saved_0600_and_never_shown(tmp_path):
    first, second = Credentials.generate(), Credentials.generate()
    assert not set(first.values()) & set(second.values())
    assert all(len(v) >= 20 for v in first.values())
    path = tmp_path / "credentials.env"
    first.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert Credentials.load(path) == first
    shown = repr(first)
    assert not any(v in shown for v in first.values())
    path.chmod(0o644)
    with pytest.raises(ClusterError, match="readable by others"):
        Credentials.load(path)


def test_the_fernet_key_is_one_airflow_accepts():
    from cryptography.fernet import Fernet

    Fernet(Credentials.generate().airflow_fernet_key.encode())


def test_scram_verifier_matches_postgres_format_and_the_password():
    verifier = scram_sha256("s3cret")
    scheme, rest = verifier.split("$", 1)
    iterations_salt, keys = rest.split("$")
    iterations, salt = iterations_salt.split(":")
    stored, server = keys.split(":")
    assert scheme == "SCRAM-SHA-256" and iterations == "4096" and "s3cret" not in verifier
    salted = hashlib.pbkdf2_hmac("sha256", b"s3cret", base64.b64decode(salt), 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert base64.b64decode(stored) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(server) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()


def test_ports_are_distinct_free_and_reused_when_still_free():
    ports = choose_ports(None)
    assert set(ports) == set(PORT_NAMES) and len(set(ports.values())) == len(PORT_NAMES)
    assert choose_ports(ports) == ports


def _fake_cluster(tmp_path) -> LocalCluster:
    cluster = LocalCluster(tmp_path / "c")
    cluster.root.mkdir()
    creds = Credentials.generate()
    creds.save(cluster.layout.credentials)
    state = ClusterState(root=str(cluster.root), ports=choose_ports(None))
    cluster.layout.state_file.write_text(json.dumps(state.__dict__))
    cluster._state = state
    cluster._creds = creds
    (cluster.root / "airflow").mkdir()
    (cluster.root / "spark").mkdir()
    return cluster


def test_the_env_file_sources_the_credentials_and_holds_no_secret(tmp_path):
    cluster = _fake_cluster(tmp_path)
    cluster._write_config_files(cluster._state)
    text = cluster.layout.env_file.read_text()
    creds = cluster.credentials()
    assert not any(v in text for v in creds.values())
    for private in ("spark/daemon.conf", "spark/conf/spark-defaults.conf", "airflow/passwords.json"):
        assert (cluster.root / private).stat().st_mode & 0o777 == 0o600
    done = subprocess.run(
        ["bash", "-c", f"source {cluster.layout.env_file} && env"], capture_output=True, text=True, check=True
    )
    env = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert env == {**env, **cluster.client_env()}
    conf = dict(item.split("=", 1) for item in env["SPLITKEEPER_SPARK_CONF"].split(";"))
    assert conf["spark.authenticate.secret"] == creds.spark_auth_secret
    assert conf["spark.hadoop.fs.s3a.secret.key"] == creds.s3_secret_key
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://airflow:")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])["port"] == cluster._state.ports["spark_master"]
    from splitkeeper.spark.session import SparkSettings

    settings = SparkSettings.from_env(env)
    assert settings.master.startswith("spark://127.0.0.1:") and settings.uses_s3a


def test_a_spark_only_cluster_gives_its_drivers_the_master_and_authentication_and_no_s3a(tmp_path):
    """``up_spark``'s files and client environment (no process started here)."""
    from splitkeeper.spark.session import SparkSettings
    from splitkeeper_tools.cluster.local import SPARK_PORT_NAMES, SPARK_SERVICES

    cluster = LocalCluster(tmp_path / "c")
    (cluster.root / "spark").mkdir(parents=True)
    cluster._creds = Credentials.generate()
    cluster._creds.save(cluster.layout.credentials)
    state = ClusterState(root=str(cluster.root), ports=choose_ports(None, SPARK_PORT_NAMES), spark_only=True)
    cluster.layout.state_file.write_text(json.dumps(state.__dict__))
    cluster._state = state
    cluster._write_spark_files(state)
    env = cluster.spark_client_env()
    settings = SparkSettings.from_env(env)
    conf = dict(settings.extra_conf)
    assert settings.master == cluster.spark_master_url() == f"spark://127.0.0.1:{state.ports['spark_master']}"
    assert conf["spark.authenticate"] == "true"
    assert conf["spark.authenticate.secret"] == cluster._creds.spark_auth_secret
    assert not settings.uses_s3a and not any(k.startswith("AWS_") for k in env)
    text = cluster.layout.env_file.read_text()  # the env file: Spark only, no secret
    assert "SPLITKEEPER_SPARK_MASTER" in text and "AIRFLOW" not in text
    assert not any(v in text for v in cluster._creds.values())
    assert [s.name for s in cluster.status()] == list(SPARK_SERVICES)  # none running
    assert not any(s.running for s in cluster.status())


def test_log_tails_are_scrubbed_of_every_secret(tmp_path):
    cluster = _fake_cluster(tmp_path)
    cluster.layout.logs.mkdir()
    creds = cluster.credentials()
    cluster.layout.log("x").write_text(f"password={creds.airflow_db_password} key {creds.s3_secret_key}\n")
    tail = cluster._tail("x")
    assert creds.airflow_db_password not in tail and creds.s3_secret_key not in tail and "***" in tail


def test_status_of_a_folder_never_started_and_its_table(tmp_path):
    statuses = LocalCluster(tmp_path / "none").status()
    assert [s.name for s in statuses] == list(SERVICES)
    assert not any(s.running or s.healthy for s in statuses)
    table = format_status([ServiceStatus("postgres", 5432, 10, True, True, "ok"), *statuses[1:]])
    assert table.splitlines()[0].split()[:4] == ["service", "port", "pid", "health"]
    assert "healthy" in table.splitlines()[1] and "stopped" in table.splitlines()[2]


def test_s3_client_repr_hides_the_secret_key():
    client = S3Client("http://127.0.0.1:1", "AK", "very-secret-key")
    assert "very-secret-key" not in repr(client)


def test_airflow_services_get_the_pipeline_of_the_caller_and_nothing_stale(tmp_path, monkeypatch):
    cluster = _fake_cluster(tmp_path)
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", "/data/pipeline.yaml")
    monkeypatch.setenv("AIRFLOW__CORE__DAGS_FOLDER", "/somewhere/else")  # e.g. left by another test
    monkeypatch.setenv("SPLITKEEPER_SPARK_MASTER", "local[2]")
    env = cluster._airflow_env()
    assert env["SPLITKEEPER_PIPELINE_CONFIG"] == "/data/pipeline.yaml"
    assert (
        env["AIRFLOW__CORE__DAGS_FOLDER"].endswith("/dags")
        and env["AIRFLOW__CORE__DAGS_FOLDER"] != "/somewhere/else"
    )
    assert env["SPLITKEEPER_SPARK_MASTER"].startswith("spark://127.0.0.1:")
    assert env["SPLITKEEPER_CLUSTER_MARK"] == cluster.mark


def test_writer_pools_are_named_per_configured_pipeline_and_a_config_that_does_not_load_stops_up(
    tmp_path, monkeypatch
):
    cluster = _fake_cluster(tmp_path)
    good = tmp_path / "kafka.yaml"  # the Kafka address comes from the cluster's environment
    good.write_text(
        "name: orders\nsource: {kind: kafka, bootstrap_servers: '${SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS}', "
        "topics: [t]}\nstate: {path: state}\nsink: {path: sink}\n"
    )
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", str(good))
    monkeypatch.delenv("SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("SPLITKEEPER_AIRFLOW_SCHEDULES", raising=False)
    assert cluster._writer_pools() == ["splitkeeper-orders"]
    assert cluster._airflow_env()["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] == "True"
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nsource: {kind: files, path: '${NOT_SET_ANYWHERE}'}\nstate: {path: s}\nsink: {path: k}\n"
    )
    monkeypatch.setenv("SPLITKEEPER_PIPELINE_CONFIG", f"{good}{os.pathsep}{bad}")
    with pytest.raises(ClusterError, match="bad.yaml, which does not load: .*NOT_SET_ANYWHERE"):
        cluster._writer_pools()
    monkeypatch.setenv("SPLITKEEPER_AIRFLOW_SCHEDULES", "0")  # only triggered runs
    assert cluster._airflow_env()["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] == "False"


def test_a_dag_processor_heartbeat_is_judged_by_its_age_in_a_30_s_window(tmp_path, monkeypatch):
    """Airflow calls the dag processor unhealthy 10.5 s after a heartbeat (2.1 beats); one slow
    parse loop on a loaded machine misses that, so the cluster allows the scheduler's 30 s and
    still names a processor that is really gone."""
    from datetime import datetime, timedelta

    cluster = LocalCluster(tmp_path)
    ago = {"s": 12.0}

    def health(state):
        beat = (datetime.now(UTC) - timedelta(seconds=ago["s"])).isoformat()
        return {"dag_processor": {"status": "unhealthy", "latest_dag_processor_heartbeat": beat}}

    monkeypatch.setattr(cluster, "_airflow_health", health)
    assert "12 s old (within 30 s; Airflow says unhealthy)" in cluster._probe_airflow_job(
        None, "dag_processor"
    )
    ago["s"] = 45.0
    with pytest.raises(
        ClusterError, match=r"dag_processor heartbeat stale or missing: .*45 s ago \(allowed 30 s\)"
    ):
        cluster._probe_airflow_job(None, "dag_processor")
