"""docker-compose.yml, the deployment beyond one machine (protocol section 7), checked without Docker.

The YAML is parsed and its structure checked: the services (the same as scripts/cluster.sh
starts), depends_on targets and conditions, healthchecks, volumes, that every host path it
mounts or builds from exists in the repository, that every command names a script, module or
Airflow subcommand that exists, and that the environment points splitkeeper at the cluster's
Spark master, object store and Kafka. Security properties: every secret is required (no
default), every published port is bound to 127.0.0.1, the Spark master is not published,
Airflow and Spark authentication are on. Versions: images that exist (no MinIO image: the
object store is built from the Go module scripts/cluster.sh builds), the versions of
the hashed locks and the poms, and an Airflow image without the test tools. The Dockerfiles'
COPY sources must exist and survive their .dockerignore. When a compose CLI is installed
(``docker compose`` or ``docker-compose``; it needs no engine for this) ``config -q``
validates the file against the Compose schema too.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
PROJECT_IN_IMAGE = PurePosixPath("/opt/splitkeeper")

AIRFLOW_SERVICES = {
    "airflow-init",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
SPARK_SERVICES = {"spark-master", "spark-worker-1", "spark-worker-2"}
STORE_SERVICES = {"object-store", "object-store-init"}
REQUIRED = AIRFLOW_SERVICES | SPARK_SERVICES | STORE_SERVICES | {"postgres", "kafka", "kafka-init"}
#: Every secret the deployment takes from .env: each must be required (${VAR:?...}), never defaulted.
SECRETS = {
    "SPARK_AUTH_SECRET",
    "S3_ACCESS_KEY",
    "S3_SECRET_KEY",
    "POSTGRES_PASSWORD",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_ADMIN_PASSWORD",
    "AIRFLOW_OPERATOR_PASSWORD",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def interpolate(value: Any) -> Any:
    """Compose variable substitution with every variable unset: ``${X:-d}`` -> d, a required
    ``${X:?message}`` -> ``<X>`` (what .env would supply), ``$$`` -> ``$``."""
    if isinstance(value, str):
        value = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?[^}]*\}", lambda m: f"<{m.group(1)}>", value)
        value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)
        return value.replace("$$", "$")
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return interpolate(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


def as_list(command: Any) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def bind_mounts(service: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Container path -> host path (in the repository) of every bind mount of a service."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith(("./", "../", "/")):
            mounts[PurePosixPath(target)] = (ROOT / source).resolve()
    return mounts


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """Where a container path of the service comes from in the repository (bind mount or image copy)."""
    path = PurePosixPath(container_path)
    for target, source in sorted(bind_mounts(service).items(), key=lambda m: -len(str(m[0]))):
        if path == target or target in path.parents:
            return source / path.relative_to(target)
    if "build" in service and (path == PROJECT_IN_IMAGE or PROJECT_IN_IMAGE in path.parents):
        return ROOT / path.relative_to(PROJECT_IN_IMAGE)
    return None


def env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


# ---------------------------------------------------------------------------------------
# Structure
# ---------------------------------------------------------------------------------------


def test_every_part_of_the_deployment_is_a_service(services):
    assert set(services) >= REQUIRED, sorted(REQUIRED - set(services))
    airflow_commands = {
        name: as_list(services[name].get("command")) for name in AIRFLOW_SERVICES - {"airflow-init"}
    }
    assert airflow_commands == {
        "airflow-api-server": ["api-server"],
        "airflow-scheduler": ["scheduler"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer"],
    }
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert "broker,controller" in env(services["kafka"])["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert env(services["airflow-scheduler"])["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env(services["airflow-scheduler"])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
        "postgresql+psycopg2://airflow:"
    )
    workers = [as_list(services[w]["command"]) for w in ("spark-worker-1", "spark-worker-2")]
    assert all(
        "org.apache.spark.deploy.worker.Worker" in c and "spark://spark-master:7077" in c for c in workers
    )


def test_the_services_are_those_the_cluster_script_starts(services):
    from splitkeeper_tools.cluster.local import SERVICES

    assert set(SERVICES) <= set(services), sorted(set(SERVICES) - set(services))
    assert set(services) - set(SERVICES) == {"airflow-init", "kafka-init", "object-store-init"}
    store = services["object-store"]
    assert store["build"]["dockerfile"] == "docker/versitygw/Dockerfile"
    assert not any("minio" in str(s.get("image", "")) for s in services.values())


def test_depends_on_targets_exist_and_their_conditions_can_be_met(services):
    graph: dict[str, set[str]] = {}
    for name, service in services.items():
        depends = service.get("depends_on", {})
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        graph[name] = set(depends)
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target}"
            condition = spec.get("condition", "service_started")
            assert condition in CONDITIONS, f"{name} -> {target}: {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (
                    f"{name} waits for {target} to be healthy: no healthcheck"
                )
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", (
                    f"{target} is waited for to finish: restart must be no"
                )
    # no cycles: every service can start
    started: set[str] = set()
    while len(started) < len(graph):
        ready = {s for s, deps in graph.items() if s not in started and deps <= started}
        assert ready, f"dependency cycle among {sorted(set(graph) - started)}"
        started |= ready
    assert {"airflow-init", "postgres"} <= graph["airflow-scheduler"]
    assert {"spark-master", "kafka-init", "object-store-init"} <= graph["airflow-scheduler"]


def test_long_running_services_have_healthchecks_and_one_shot_jobs_do_not_restart(services):
    for name, service in services.items():
        if service.get("restart") == "no":
            assert "ports" not in service, f"one-shot {name} publishes ports"
            continue
        check = service.get("healthcheck")
        assert check and as_list(check["test"])[0] in ("CMD", "CMD-SHELL"), f"{name} has no healthcheck"
        assert service.get("restart") in ("unless-stopped", "always"), name
    assert {n for n, s in services.items() if s.get("restart") == "no"} == {
        "airflow-init",
        "kafka-init",
        "object-store-init",
    }


def test_volumes_are_declared_and_bind_mounts_exist_in_the_repository(compose, services):
    declared = set(compose.get("volumes", {}))
    used: set[str] = set()
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith(("./", "../", "/")):
                assert (ROOT / source).exists(), (
                    f"{name} mounts {source}, which does not exist in the repository"
                )
            else:
                assert source in declared, f"{name} uses volume {source}, not declared under volumes:"
                used.add(source)
    assert used == declared, f"declared but unused: {sorted(declared - used)}"
    scheduler = bind_mounts(services["airflow-scheduler"])
    for folder in ("dags", "jobs", "expectations", "splitkeeper"):
        assert scheduler[PROJECT_IN_IMAGE / folder] == ROOT / folder
    # the staging volume is shared by the driver (scheduler) and the executors (workers)
    for name in ("airflow-scheduler", *SPARK_SERVICES):
        assert "staging:/var/splitkeeper/staging" in services[name]["volumes"], name


def _dockerignore_allows(ignore: Path, source: str) -> bool:
    """Whether a path survives a .dockerignore (last matching pattern wins; '!' re-includes)."""
    allowed = True
    path = source.rstrip("/")
    for line in ignore.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/"):
            allowed = negate
    return allowed


def test_builds_use_existing_dockerfiles_whose_copy_sources_exist(services):
    builds = {name: s["build"] for name, s in services.items() if "build" in s}
    assert set(builds) == AIRFLOW_SERVICES | SPARK_SERVICES | STORE_SERVICES
    for name, build in builds.items():
        context = ROOT / build["context"]
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
        for line in dockerfile.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
                continue
            sources = [w for w in words[1:-1] if not w.startswith("--")]
            for source in sources:
                assert (context / source).exists(), f"{dockerfile.name} copies {source}, missing in {context}"
                if ignore.exists():
                    assert _dockerignore_allows(ignore, source), f"{ignore.name} excludes {source}"


def test_commands_name_scripts_modules_and_airflow_subcommands_that_exist(services):
    from airflow.cli.cli_config import core_commands

    airflow_subcommands = {c.name for c in core_commands}
    checked_paths = []
    for name, service in services.items():
        argv = as_list(service.get("entrypoint")) + as_list(service.get("command"))
        if name in AIRFLOW_SERVICES and "entrypoint" not in service:
            assert argv[0] in airflow_subcommands, f"{name}: airflow {argv[0]} is no Airflow 3 command"
        for i, word in enumerate(argv):
            if word == "-m" and i + 1 < len(argv):
                assert importlib.util.find_spec(argv[i + 1]) is not None, f"{name}: no module {argv[i + 1]}"
            source = host_path(service, word) if word.startswith("/") else None
            if source is not None:
                assert source.is_file(), f"{name} runs {word}, but {source} does not exist"
                checked_paths.append(source)
        check = as_list(service.get("healthcheck", {}).get("test"))
        if len(check) == 2 and check[0] == "CMD-SHELL" and check[1].startswith("airflow "):
            assert shlex.split(check[1])[1] in airflow_subcommands, f"{name} healthcheck: {check[1]}"
    assert ROOT / "docker/airflow/init.sh" in checked_paths
    assert ROOT / "docker/spark/daemon.sh" in checked_paths
    assert os.access(ROOT / "docker/spark/daemon.sh", os.X_OK)


# ---------------------------------------------------------------------------------------
# What the environment points splitkeeper at
# ---------------------------------------------------------------------------------------


def test_environment_points_splitkeeper_at_the_cluster_object_storage_and_kafka(services):
    from splitkeeper.config.settings import load_config
    from splitkeeper.spark.session import SparkSettings

    scheduler = services["airflow-scheduler"]
    variables = env(scheduler)
    settings = SparkSettings.from_env(variables)
    assert settings.master == "spark://spark-master:7077"
    conf = dict(settings.extra_conf)
    store = env(services["object-store"])
    assert conf["spark.hadoop.fs.s3a.endpoint"] == variables["AWS_ENDPOINT_URL"] == "http://object-store:7070"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    access, secret = conf["spark.hadoop.fs.s3a.access.key"], conf["spark.hadoop.fs.s3a.secret.key"]
    assert access == variables["AWS_ACCESS_KEY_ID"] == store["ROOT_ACCESS_KEY_ID"] == "<S3_ACCESS_KEY>"
    assert secret == variables["AWS_SECRET_ACCESS_KEY"] == store["ROOT_SECRET_ACCESS_KEY"]
    assert secret == "<S3_SECRET_KEY>"
    # Spark authentication: the driver's conf and the daemons' environment carry the same secret
    assert conf["spark.authenticate"] == "true"
    daemon_secret = env(services["spark-master"])["SPARK_AUTH_SECRET"]
    assert conf["spark.authenticate.secret"] == daemon_secret == "<SPARK_AUTH_SECRET>"
    assert settings.uses_s3a  # the session factory adds the s3a jar group
    # executors run the Python 3.11 of the Spark image; in the Airflow image the same path
    # links to Airflow's Python 3.11, so the driver's PYSPARK_PYTHON is valid on both sides
    spark_dockerfile = (ROOT / "docker/spark/Dockerfile").read_text(encoding="utf-8")
    airflow_dockerfile = (ROOT / "docker/airflow/Dockerfile").read_text(encoding="utf-8")
    assert variables["PYSPARK_PYTHON"] == conf["spark.pyspark.python"] == "/opt/splitkeeper/venv/bin/python"
    assert "python3.11 -m venv /opt/splitkeeper/venv" in spark_dockerfile
    assert 'ln -s "$(command -v python)" /opt/splitkeeper/venv/bin/python' in airflow_dockerfile
    assert env(services["spark-worker-1"])["PYSPARK_PYTHON"] == variables["PYSPARK_PYTHON"]
    assert variables["SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    assert "PLAINTEXT://kafka:9092" in env(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    init = as_list(services["object-store-init"]["command"])
    bucket = init[-1]
    assert init[:3] == ["-m", "splitkeeper_tools.cluster.s3", "create-bucket"]
    # the Airflow image is the product only: the one-shot job gets the checkout's tools mounted
    assert "./tools:/opt/splitkeeper/tools:ro" in services["object-store-init"]["volumes"]
    assert env(services["object-store-init"])["PYTHONPATH"] == "/opt/splitkeeper/tools"
    assert variables["SPLITKEEPER_LAKE_ROOT"] == f"s3a://{bucket}"
    for var in ("SPLITKEEPER_EXPECTATIONS_DIR",):
        assert host_path(scheduler, variables[var]).is_dir(), var

    config_file = host_path(scheduler, variables["SPLITKEEPER_PIPELINE_CONFIG"])
    config = load_config(config_file)
    assert config.state.path.startswith(f"s3a://{bucket}/") and config.sink.path.startswith(
        f"s3a://{bucket}/"
    )
    assert config.source.bootstrap_servers == variables["SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS"]
    assert config.staging.path.startswith("/var/splitkeeper/staging/")
    kafka_init = as_list(services["kafka-init"]["command"])
    assert kafka_init[kafka_init.index("--topic") + 1] in config.source.topics


def test_images_match_the_pinned_spark_airflow_and_hadoop_versions():
    import airflow
    import pyspark

    spark = (ROOT / "docker/spark/Dockerfile").read_text(encoding="utf-8")
    assert f"ARG SPARK_IMAGE=apache/spark:{pyspark.__version__}-scala2.13-java17-ubuntu" in spark
    airflow_dockerfile = (ROOT / "docker/airflow/Dockerfile").read_text(encoding="utf-8")
    assert f"ARG AIRFLOW_IMAGE=apache/airflow:slim-{airflow.__version__}-python3.11" in airflow_dockerfile
    hadoop = re.search(r"<hadoop.version>([^<]+)</hadoop.version>", (ROOT / "jvm/s3a.xml").read_text())
    bundled = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    assert hadoop and bundled and bundled[0].name == f"hadoop-client-api-{hadoop.group(1)}.jar"
    for dockerfile in ("docker/spark/Dockerfile", "docker/airflow/Dockerfile"):
        assert "-f jvm/s3a.xml" in (ROOT / dockerfile).read_text(), dockerfile  # the jars setup.sh fetches


def test_images_exist_and_match_the_pinned_kafka_and_object_store_versions(services):
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", (ROOT / "jvm/kafka-broker.xml").read_text())
    assert kafka
    assert services["kafka"]["image"] == services["kafka-init"]["image"] == f"apache/kafka:{kafka.group(1)}"
    images = {s["image"] for s in services.values() if "build" not in s}
    assert images == {"postgres:16", f"apache/kafka:{kafka.group(1)}"}
    bases = set()
    for dockerfile in ROOT.glob("docker/*/Dockerfile"):
        bases |= set(re.findall(r"^ARG [A-Z_]+_IMAGE=(\S+)$", dockerfile.read_text(), flags=re.M))
    # images that exist on Docker Hub today (minio/minio and minio/mc were removed in 2026)
    assert bases == {
        "apache/spark:4.1.1-scala2.13-java17-ubuntu",
        "apache/airflow:slim-3.1.8-python3.11",
        "maven:3.9-eclipse-temurin-17",
        "golang:1.25-bookworm",
        "debian:bookworm-slim",
    }
    # the object store: the Go module and version scripts/setup.sh builds for scripts/cluster.sh
    versitygw = (ROOT / "docker/versitygw/Dockerfile").read_text()
    assert "COPY scripts/versitygw.version ./" in versitygw
    assert "go install -trimpath -ldflags='-s -w' \"$spec\"" in versitygw
    lines = (ROOT / "scripts/versitygw.version").read_text().splitlines()
    pin = [ln for ln in lines if ln and not ln.startswith("#")]
    assert len(pin) == 1
    assert re.fullmatch(r"github\.com/versity/versitygw/cmd/versitygw@v\d+\.\d+\.\d+", pin[0])
    go_minor = re.search(r"golang:(\d+\.\d+)", versitygw)
    assert go_minor and tuple(map(int, go_minor.group(1).split("."))) >= (1, 25)  # versitygw's go.mod


# ---------------------------------------------------------------------------------------
# Security: secrets, ports, authentication
# ---------------------------------------------------------------------------------------


def test_every_secret_is_required_and_none_has_a_default():
    raw = COMPOSE.read_text(encoding="utf-8").replace("$$", "")  # $$ is a literal $ for the container
    references = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?])?([^}]*)\}", raw)
    used = {name for name, _op, _rest in references}
    assert used == SECRETS, f"unexpected variables: {sorted(used ^ SECRETS)}"
    defaulted = sorted({name for name, op, _rest in references if op != ":?"})
    assert not defaulted, f"secrets with a default (or optional): {defaulted}"
    assert "ALL_ADMINS: ${" not in raw  # authentication cannot be switched off from .env


def test_published_ports_are_bound_to_loopback_and_spark_and_postgres_are_not_published(services):
    published = {name: s.get("ports", []) for name, s in services.items() if s.get("ports")}
    assert set(published) == {"airflow-api-server", "kafka", "object-store"}
    for name, ports in published.items():
        for port in ports:
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond 127.0.0.1"
    for name in (*SPARK_SERVICES, "postgres"):
        assert "ports" not in services[name], name
    kafka = env(services["kafka"])
    assert "EXTERNAL://127.0.0.1:29092" in kafka["KAFKA_ADVERTISED_LISTENERS"]


def test_airflow_and_spark_authentication_are_on(services):
    for name in AIRFLOW_SERVICES - {"airflow-init"}:
        variables = env(services[name])
        assert variables["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "false", name
        assert variables["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin,operator:op"
        assert variables["AIRFLOW__API_AUTH__JWT_SECRET"] == "<AIRFLOW_JWT_SECRET>"
        assert variables["AIRFLOW__CORE__FERNET_KEY"] == "<AIRFLOW_FERNET_KEY>"
        assert "AIRFLOW_ADMIN_PASSWORD" not in variables  # only airflow-init sees the users' passwords
        passwords = variables["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
        assert any(v.endswith(f":{PurePosixPath(passwords).parent}") for v in services[name]["volumes"])
    init = env(services["airflow-init"])
    assert init["AIRFLOW_ADMIN_PASSWORD"] == "<AIRFLOW_ADMIN_PASSWORD>"
    init_sh = (ROOT / "docker/airflow/init.sh").read_text()
    assert "umask 077" in init_sh and "AIRFLOW_OPERATOR_PASSWORD" in init_sh
    daemon = (ROOT / "docker/spark/daemon.sh").read_text()
    assert "spark.authenticate true" in daemon and "umask 077" in daemon and "--properties-file" in daemon
    for name in SPARK_SERVICES:
        assert as_list(services[name]["command"])[0] == "/opt/splitkeeper/docker/spark/daemon.sh"


def _installed(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def _lock_pins(name: str) -> dict[str, str]:
    """name -> version of a hashed lock of locks/."""
    pins = {}
    for line in (ROOT / "locks" / name).read_text(encoding="utf-8").splitlines():
        if m := re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line):
            pins[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return pins


def test_the_airflow_image_installs_the_runtime_pins_of_the_lock_and_no_test_tool():
    """locks/airflow.txt is exactly the closure of the runtime packages' dependencies (computed from
    the installed metadata), and the image installs that lock, hashed, with no resolution."""
    from importlib import metadata

    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    lock = _lock_pins("airflow.txt")
    assert not {"pytest", "hypothesis", "ruff", "mypy", "import-linter"} & set(lock)
    roots = [
        "apache-airflow",
        "apache-airflow-providers-apache-spark",
        "pyspark",
        "pyspark-client",
        "delta-spark",
        "great-expectations",
        "confluent-kafka",
        "deltalake",
        "psycopg2-binary",
        "asyncpg",
        "pyyaml",
        "pandas",
        "pyarrow",
        "prometheus-client",  # the metrics extra (OpenTelemetry comes with Airflow)
        "fastavro",  # decode.kind avro (splitkeeper.records.decode)
        "sqlglot",  # an upsert sink's delete predicate (splitkeeper.records.upsert)
        "rich",  # the demo's live progress (airflow extra)
    ]
    not_installed = [
        r for r in roots if importlib.util.find_spec(r.replace("-", "_")) is None and not _installed(r)
    ]
    assert not not_installed, f"{not_installed} pinned but not installed: run `bash scripts/setup.sh`"
    seen: set[tuple[str, frozenset[str]]] = set()
    stack = [(r, frozenset()) for r in roots]
    while stack:
        name, extras = stack.pop()
        if (norm(name), extras) in seen:
            continue
        seen.add((norm(name), extras))
        for raw in metadata.distribution(name).requires or []:
            req = Requirement(raw)
            if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
                continue
            stack.append((req.name, frozenset(req.extras)))
    runtime = {name for name, _extras in seen}
    # the universal lock also pins what other platforms and Pythons need (colorama on Windows, ...)
    assert runtime <= set(lock), f"runtime packages the lock misses: {sorted(runtime - set(lock))}"
    dockerfile = (ROOT / "docker/airflow/Dockerfile").read_text()
    assert "pip install --no-cache-dir --require-hashes --no-deps -r /opt/splitkeeper/locks/airflow.txt" in (
        dockerfile
    )
    assert (
        "COPY --chown=airflow:0 locks/bootstrap.txt locks/airflow.txt /opt/splitkeeper/locks/" in dockerfile
    )
    assert "requirements.lock" not in dockerfile and "test.txt" not in dockerfile


# ---------------------------------------------------------------------------------------
# The Compose schema, when a compose CLI is installed
# ---------------------------------------------------------------------------------------


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_compose_cli_validates_the_file():
    cli = compose_cli()
    if cli is None:
        pytest.skip(
            "no compose CLI here: `docker compose` (plugin) and `docker-compose` are both missing; "
            "the structure tests above still ran. Install one (apt-get install -y docker-compose) to validate"
        )
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    missing = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env=clean,
    )
    assert missing.returncode != 0 and "in .env" in missing.stderr  # the secrets are required
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**clean, **{name: f"test-{name.lower()}" for name in SECRETS}},
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------
# The Spark image: what the executors import
# ---------------------------------------------------------------------------------------

#: Where the executors' code starts: the region task and its payload (spark.task, pickled by the
#: runner), the regions runner, every source kind's reader (the kinds' registry loads them with
#: importlib, so each module is named), the staging writer and the transforms.
EXECUTOR_ENTRY_MODULES = [
    "splitkeeper.spark.runner",
    "splitkeeper.spark.regions",
    *(
        f"splitkeeper.sources.{p.parent.name}.{p.stem}".removesuffix(".__init__")
        for p in sorted((ROOT / "splitkeeper/sources").glob("*/*.py"))
    ),
    "splitkeeper.spark.task",
    "splitkeeper.transforms",
]
#: What the Spark image itself brings to every executor's Python: SPARK_HOME/python (pyspark, py4j).
PROVIDED_BY_THE_SPARK_IMAGE = {"pyspark", "py4j"}


def _module_file(module: str) -> Path | None:
    path = ROOT.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _import_time_imports(module: str, source: Path) -> list[str]:
    """Every module an import of ``module`` imports: the module-level ``import``/``from`` statements,
    inside ``if``/``try``/``with`` too, but not under ``if TYPE_CHECKING:`` (never executed);
    ``from a import b`` yields ``a`` and ``a.b`` (b may be a submodule)."""
    import ast

    package = module if source.name == "__init__.py" else module.rpartition(".")[0]
    found: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    name = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    name = str(node.module)
                found.append(name)
                found.extend(f"{name}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                test = node.test
                if (
                    getattr(test, "id", None) == "TYPE_CHECKING"
                    or getattr(test, "attr", None) == "TYPE_CHECKING"
                ):
                    visit(node.orelse)
                else:
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(part)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(source.read_text(encoding="utf-8")).body)
    return [name for name in found if name != "__future__"]


def executor_third_party_imports() -> dict[str, set[str]]:
    """Top-level third-party module -> the splitkeeper modules importing it, over every
    splitkeeper module an executor imports (the entry modules, their packages' ``__init__``, and
    whatever splitkeeper module they import at module level, transitively)."""
    import sys

    seen: set[str] = set()
    third_party: dict[str, set[str]] = {}
    stack = list(EXECUTOR_ENTRY_MODULES)
    while stack:
        module = stack.pop()
        source = _module_file(module)
        if module in seen or source is None:  # seen, or `from pkg import name` naming no module
            continue
        seen.add(module)
        parts = module.split(".")
        stack.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # the packages' __init__
        for name in _import_time_imports(module, source):
            top = name.split(".")[0]
            if top == "splitkeeper":
                stack.append(name)
            elif top not in sys.stdlib_module_names:
                third_party.setdefault(top, set()).add(module)
    assert {"splitkeeper.spark.task", "splitkeeper.sources.files.source"} <= seen
    return third_party


def spark_image_pins() -> dict[str, str]:
    """Distribution -> version of every pin docker/spark/Dockerfile installs: locks/executor.txt
    (and locks/bootstrap.txt's setuptools), hashed, with no resolution."""
    dockerfile = (ROOT / "docker/spark/Dockerfile").read_text(encoding="utf-8")
    assert "--require-hashes --no-deps" in dockerfile
    assert "-r /opt/splitkeeper/locks/bootstrap.txt -r /opt/splitkeeper/locks/executor.txt" in dockerfile
    assert "--upgrade pip" not in dockerfile  # the bundled pip only installs pins
    return _lock_pins("executor.txt")


def test_the_spark_image_installs_every_third_party_package_the_executors_import():
    """The region tasks run on the Spark image's Python (/opt/splitkeeper/venv): every third-party
    package their modules import when loaded must be pinned there, with its own dependencies
    (the splitkeeper package itself is installed with --no-deps)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    imported = executor_third_party_imports()
    # the walk sees the imports that matter (numpy: the file reader's line boundaries)
    assert {"numpy", "pyarrow", "confluent_kafka"} <= set(imported), imported
    owners = metadata.packages_distributions()
    needed: set[str] = set()
    for module in set(imported) - PROVIDED_BY_THE_SPARK_IMAGE:
        assert module in owners, f"{module} (imported by {sorted(imported[module])}) is not installed here"
        needed.add(norm(owners[module][0]))
    stack = list(needed)  # and what those distributions require (no extras: none is asked for)
    while stack:
        for raw in metadata.distribution(stack.pop()).requires or []:
            req = Requirement(raw)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            if norm(req.name) not in needed:
                needed.add(norm(req.name))
                stack.append(norm(req.name))
    pins = spark_image_pins()
    missing = sorted(needed - set(pins))
    assert not missing, (
        f"the executors import {missing} but docker/spark/Dockerfile does not install them "
        f"(imported by: { {m: sorted(v) for m, v in imported.items()} })"
    )
    lock = _lock_pins("runtime.txt")
    assert all(pins[name] == lock[name] for name in needed)  # the runtime lock's versions
