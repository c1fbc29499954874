"""The local cluster of ``scripts/cluster.sh up|status|down``: every service on 127.0.0.1, no Docker.

What runs (each its own process group, its output in ``<dir>/logs/<service>.log``):

=====================  ==================================================================
postgres               PostgreSQL (Debian's server programs), a private ``initdb`` data dir;
                       as root the server runs as the ``postgres`` user (it refuses root)
object-store           versitygw (posix backend) on ``<dir>/s3``; bucket ``splitkeeper``
kafka                  the project's KRaft broker (:mod:`splitkeeper_tools.kafka_broker`)
spark-master           ``pyspark/bin/spark-class ...deploy.master.Master``, Spark auth on
spark-worker-N         ``...deploy.worker.Worker`` registered with that master
airflow-api-server     UI + REST API v2 + execution API; simple auth manager, generated users
airflow-scheduler      LocalExecutor (tasks run as its children); health check server
airflow-dag-processor  parses the repository's ``dags/``
airflow-triggerer      deferrable tasks
=====================  ==================================================================

Files of ``<dir>`` (default ``<repo>/var/cluster``, or ``$SPLITKEEPER_CLUSTER_DIR``):

- ``credentials.env`` (0600): every secret, generated once per cluster folder (the Spark
  authentication secret, the S3 keys, the PostgreSQL passwords, Airflow's Fernet key, JWT
  secret and user passwords);
- ``env``: ``source`` it to point splitkeeper (and the ``airflow`` CLI) at the cluster; it
  sources ``credentials.env`` and holds no secret itself;
- ``cluster.json``: ports, pids and start-up timings (no secret);
- ``spark/client.conf`` (0600): the same Spark settings as a properties file, for
  ``spark-submit`` (``SPARK_CONF_DIR``), ``spark/daemon.conf`` (0600): the master's and
  workers' settings (authentication);
- ``logs/``, ``postgres/``, ``s3/``, ``kafka/``, ``spark/``, ``airflow/``: logs and data.

Every process gets ``SPLITKEEPER_CLUSTER_MARK`` in its environment (children inherit it):
``down`` stops the services in order, then ends any process still carrying the mark, so no
process is left behind (an Airflow task, a Spark executor). No value of
``credentials.env`` appears in a command line (``ps``), an error or a log line this module
writes; log tails shown on failure are scrubbed of them.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import string
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from splitkeeper import process, resources
from splitkeeper.errors import SplitkeeperError
from splitkeeper.spark import jars as jarlib
from splitkeeper.spark.runner import SHARED_DISK_CONF
from splitkeeper_tools.cluster.s3 import S3Client, S3Error

HOST = "127.0.0.1"
BUCKET = "splitkeeper"
REGION = "us-east-1"
ENV_DIR = "SPLITKEEPER_CLUSTER_DIR"
ENV_TOOLS_DIR = "SPLITKEEPER_TOOLS_DIR"
MARK = "SPLITKEEPER_CLUSTER_MARK"
SCHEDULES_ENV = "SPLITKEEPER_AIRFLOW_SCHEDULES"  # "0" at `up`: only triggered DAG runs
SETUP_FIX = "bash scripts/setup.sh cluster"
#: the cluster's own DAGs (the hand-triggered check of where a task runs), linked into its DAG folder
CLUSTER_DAGS = Path(__file__).resolve().parent / "dags"

#: Airflow users of the simple auth manager: name -> role (admin, op, user, viewer).
AIRFLOW_USERS = {"admin": "admin", "operator": "op"}

SERVICES = (
    "postgres",
    "object-store",
    "kafka",
    "spark-master",
    "spark-worker-1",
    "spark-worker-2",
    "airflow-api-server",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
)
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")
SPARK_PORT_NAMES = ("spark_master", "spark_master_ui", "spark_worker_1_ui", "spark_worker_2_ui")
#: Variables ``up`` hands from its own environment to the Airflow services (the DAGs read them).
AIRFLOW_PASS_THROUGH = (
    "SPLITKEEPER_PIPELINE_CONFIG",
    "SPLITKEEPER_REPORTS_DIR",
    "SPLITKEEPER_EXPECTATIONS_DIR",
)
S3A_CREDENTIALS_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
# A dag processor or triggerer heartbeat this recent counts as alive (the scheduler's own default).
HEARTBEAT_WINDOW_S = 30.0
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")


def _checkout() -> Path:
    """The source checkout: the local cluster runs its scripts, tools and DAG folder from there."""
    return resources.require_checkout("the local cluster (scripts/cluster.sh)")


class ClusterError(SplitkeeperError):
    """The local cluster could not be started, probed or stopped; the message says which service."""

    code = "CLUSTER_ERROR"


# ---------------------------------------------------------------------------------------
# Credentials
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    """Every secret of one cluster folder. ``repr`` shows no value."""

    spark_auth_secret: str = field(repr=False)
    s3_access_key: str = field(repr=False)
    s3_secret_key: str = field(repr=False)
    pg_superuser_password: str = field(repr=False)
    airflow_db_password: str = field(repr=False)
    airflow_fernet_key: str = field(repr=False)
    airflow_jwt_secret: str = field(repr=False)
    airflow_api_secret_key: str = field(repr=False)
    airflow_admin_password: str = field(repr=False)
    airflow_operator_password: str = field(repr=False)

    @staticmethod
    def variable(name: str) -> str:
        """The shell variable of field ``name`` in ``credentials.env``."""
        return f"SPLITKEEPER_CLUSTER_{name.upper()}"

    @classmethod
    def generate(cls) -> Credentials:
        def token() -> str:
            return secrets.token_urlsafe(32)  # [A-Za-z0-9_-]: safe in URLs, shells and Spark conf

        return cls(
            spark_auth_secret=token(),
            s3_access_key="SK" + secrets.token_hex(9).upper(),
            s3_secret_key=token(),
            pg_superuser_password=token(),
            airflow_db_password=token(),
            airflow_fernet_key=base64.urlsafe_b64encode(os.urandom(32)).decode(),
            airflow_jwt_secret=token(),
            airflow_api_secret_key=token(),
            airflow_admin_password=token(),
            airflow_operator_password=token(),
        )

    def as_env(self) -> dict[str, str]:
        return {self.variable(k): v for k, v in asdict(self).items()}

    def values(self) -> list[str]:
        return list(asdict(self).values())

    def save(self, path: Path) -> None:
        """Write ``credentials.env``, readable by the owner only (0600 from its creation)."""
        text = "# Generated by scripts/cluster.sh for this cluster folder. Secret: keep it 0600.\n" + "".join(
            f"{k}='{v}'\n" for k, v in self.as_env().items()
        )
        _write_private(path, text)

    @classmethod
    def load(cls, path: Path) -> Credentials:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ClusterError(f"{path} is readable by others (mode {mode:o}); chmod 600 it")
        values: dict[str, str] = {}
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep and not key.startswith("#"):
                values[key.strip()] = value.strip().strip("'")
        try:
            return cls(**{name: values[cls.variable(name)] for name in cls.__dataclass_fields__})
        except KeyError as err:
            raise ClusterError(
                f"{path} lacks {err.args[0]}; remove the cluster folder or restore it"
            ) from None


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte, replacing it atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


def scram_sha256(password: str, iterations: int = 4096) -> str:
    """PostgreSQL's SCRAM-SHA-256 verifier of ``password``: CREATE ROLE gets this, never the password."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


# ---------------------------------------------------------------------------------------
# Layout, ports, state
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def credentials(self) -> Path:
        return self.root / "credentials.env"

    @property
    def env_file(self) -> Path:
        return self.root / "env"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pg_data(self) -> Path:
        return self.root / "postgres" / "data"

    @property
    def pg_run(self) -> Path:
        return self.root / "postgres" / "run"

    @property
    def s3_data(self) -> Path:
        return self.root / "s3"

    @property
    def kafka(self) -> Path:
        return self.root / "kafka"

    @property
    def spark(self) -> Path:
        return self.root / "spark"

    @property
    def airflow_home(self) -> Path:
        return self.root / "airflow"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"


PORT_NAMES = (
    "postgres",
    "s3",
    "kafka",
    "spark_master",
    "spark_master_ui",
    "spark_worker_1_ui",
    "spark_worker_2_ui",
    "airflow_api",
    "airflow_scheduler_health",
)


def choose_ports(previous: Mapping[str, int] | None, names: tuple[str, ...] = PORT_NAMES) -> dict[str, int]:
    """The previous run's ports where still free (stable URLs across restarts), else new free ones."""
    previous = previous or {}
    ports: dict[str, int] = {}
    for name in names:
        port = previous.get(name)
        if port and port not in ports.values() and process.port_is_free(HOST, port):
            ports[name] = port
    missing = [n for n in names if n not in ports]
    fresh = [p for p in process.free_ports(HOST, len(missing) + len(ports)) if p not in ports.values()]
    ports.update(zip(missing, fresh, strict=False))
    return ports


@dataclass
class Proc:
    """A process the cluster started: its pid, its start time (``/proc/<pid>/stat`` field 22,
    so a recycled pid is never mistaken for it) and its process group."""

    pid: int
    start_ticks: int
    pgid: int

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.start_ticks

    @classmethod
    def of(cls, pid: int) -> Proc:
        ticks = _start_ticks(pid)
        if ticks is None:
            raise ClusterError(f"process {pid} exited right after it started")
        return cls(pid=pid, start_ticks=ticks, pgid=os.getpgid(pid))


def _start_ticks(pid: int) -> int | None:
    """``pid``'s start time (clock ticks since boot); None when it is gone (a zombie counts as gone)."""
    found = process.stat(pid)
    return None if found is None or found.zombie else found.start_ticks


@dataclass
class ClusterState:
    """``cluster.json``: what ``up`` started, so ``status`` and ``down`` (other processes) find it."""

    root: str
    ports: dict[str, int]
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "1g"
    executor_memory: str = "768m"
    services: dict[str, dict[str, int]] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: float | None = None
    pools: list[str] = field(default_factory=list)  # the writer pools up created (one per pipeline)
    #: started by :meth:`LocalCluster.up_spark`: the Spark master and workers only (no object store,
    #: so the Spark settings carry no S3A)
    spark_only: bool = False

    def proc(self, service: str) -> Proc | None:
        raw = self.services.get(service)
        return Proc(**raw) if raw else None


@dataclass(frozen=True)
class ServiceStatus:
    """One line of ``status``: ``healthy`` is the result of a real probe, ``detail`` says what it saw."""

    name: str
    port: int | None
    pid: int | None
    running: bool
    healthy: bool
    detail: str


# ---------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------


def spark_home() -> Path:
    """pyspark's folder: a Spark distribution's ``bin/`` and ``jars/`` (its ``sbin/`` has no
    start-master/start-worker scripts, so the daemons start through ``bin/spark-class``)."""
    return jarlib.pyspark_jars_dir().parent


def tools_root() -> Path:
    override = os.environ.get(ENV_TOOLS_DIR, "").strip()
    return Path(override).expanduser().resolve() if override else _checkout() / ".tools"


def versitygw_binary() -> Path:
    binary = tools_root() / "versitygw" / "bin" / "versitygw"
    if not binary.is_file():
        raise ClusterError(f"the object store is not built ({binary} missing); run `{SETUP_FIX}`")
    return binary


def versitygw_launch(
    address: str, data: Path, access_key: str, secret_key: str, options: Sequence[str] = ()
) -> tuple[list[str], dict[str, str]]:
    """The command line and the environment additions that start versitygw (posix backend on
    ``data``) at ``address`` (``host:port``): the root credentials go through its environment,
    never its command line. The cluster's object store and ``chaos --store s3`` both use it.
    ``options``: more of its global options (``--event-kafka-url <broker> --event-kafka-topic <t>``:
    its bucket events to Kafka)."""
    argv = [str(versitygw_binary()), "--port", address, "--quiet", *options, "posix", str(data)]
    env = {"ROOT_ACCESS_KEY_ID": access_key, "ROOT_SECRET_ACCESS_KEY": secret_key, "VGW_REGION": REGION}
    return argv, env


def _isolated_start(kept: Sequence[str]) -> str:
    """The shell line that starts a Spark worker in its mount namespace (:func:`worker_isolation`):
    each folder of ``kept`` (``$1``... ``$N``) is opened before a private tmpfs hides the rest of
    /tmp, then bound back in (``--no-canonicalize``: the open folder, not its name, which the tmpfs
    now hides); then the worker's command line (the arguments after them)."""
    fds = [(i + 3, f'"${i + 1}"') for i in range(len(kept))]
    opened = " ".join(f"{fd}<{arg}" for fd, arg in fds)
    steps = [f"exec {opened}"] if fds else []
    steps.append("mount -t tmpfs -o mode=1777 splitkeeper-worker-tmp /tmp")
    if fds:
        steps.append("mkdir -p " + " ".join(arg for _fd, arg in fds))
        steps += [f"mount --no-canonicalize --bind /proc/self/fd/{fd} {arg}" for fd, arg in fds]
        steps.append("exec " + " ".join(f"{fd}<&-" for fd, _arg in fds))
        steps.append(f"shift {len(fds)}")
    steps.append('exec "$@"')
    return " && ".join(steps)


def _under_tmp(folders: Sequence[Path]) -> list[str]:
    """The folders of ``folders`` under /tmp (the others stay visible anyway), none inside another."""
    tmp = Path("/tmp").resolve()
    found = sorted({f.resolve() for f in folders if f.resolve().is_relative_to(tmp) and f.resolve() != tmp})
    kept: list[Path] = []
    for folder in found:  # sorted: a folder comes before the folders inside it
        if not any(folder.is_relative_to(k) for k in kept):
            kept.append(folder)
    return [str(k) for k in kept]


#: The ``unshare`` command lines tried, in order: as root, then in a user namespace (unprivileged).
UNSHARE_TRIES = (
    ("unshare", "--mount", "--propagation", "private"),
    ("unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"),
)
_isolation: dict[str, tuple[str, ...]] = {}


def worker_isolation(keep: Path) -> list[str]:
    """The prefix of a Spark worker's command line that runs it in a mount namespace of its own
    with a private /tmp (only ``keep``, the cluster's folder, and what the worker runs from, the
    checkout, the virtual environment and Spark's folder, stay visible there when under /tmp): its
    executors see no other folder of the driver's under /tmp, and the cluster's Spark conf says
    they share no disk (``spark.splitkeeper.executors.sharedDisk=false``: a local staging folder is
    refused), so a pipeline's staged files go through the object store. The cluster's folder stays
    visible for the workers' own files and the end-to-end test's local files source. The first of
    :data:`UNSHARE_TRIES` that works here is used (probed once per process); ClusterError naming
    what was tried when none does."""
    if "argv" not in _isolation:
        tried: list[str] = []
        for unshare in UNSHARE_TRIES:
            probe = [*unshare, "sh", "-c", "mount -t tmpfs splitkeeper-probe /tmp"]
            try:
                done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                tried.append(f"`{shlex.join(probe)}`: {err}")
                continue
            if done.returncode == 0:
                _isolation["argv"] = unshare
                break
            tried.append(f"`{shlex.join(probe)}`: exit {done.returncode} {done.stderr.strip()[:200]}")
        else:
            raise ClusterError(
                "the Spark workers start in a mount namespace of their own (a private /tmp: they share "
                "no local folder with the driver), and none could be made here; tried "
                + "; ".join(tried)
                + ". Run as root, or allow unprivileged user namespaces (sysctl "
                "kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0)"
            )
    # what the worker itself runs from stays visible: the checkout (the jars, an editable install),
    # the virtual environment and Spark's own folder (a CI clone may sit under /tmp)
    kept = _under_tmp([keep, _checkout(), Path(sys.prefix), spark_home()])
    return [*_isolation["argv"], "sh", "-c", _isolated_start(kept), "splitkeeper-worker", *kept]


def executor_store_env(env: Mapping[str, str]) -> dict[str, str]:
    """``spark.executorEnv.*`` settings that give the executors the object store's ``AWS_*`` variables
    (``env``): their region tasks write the staged files there (:mod:`splitkeeper.staging` rule 5)."""
    return {f"spark.executorEnv.{key}": value for key, value in env.items() if key.startswith("AWS_")}


def s3a_conf(endpoint: str, access_key: str, secret_key: str) -> dict[str, str]:
    """Spark's S3A settings for a path-style, plain-HTTP S3 server at ``endpoint`` (the project's
    versitygw) with static keys: the cluster's clients and the chaos verification both use it."""
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.aws.credentials.provider": S3A_CREDENTIALS_PROVIDER,
        "spark.hadoop.fs.s3a.access.key": access_key,
        "spark.hadoop.fs.s3a.secret.key": secret_key,
    }


def postgres_bin() -> Path:
    """The folder of PostgreSQL's server programs: on PATH, else Debian's newest /usr/lib/postgresql/*/bin."""
    names = ("initdb", "pg_ctl", "pg_isready")
    found = shutil.which("initdb")
    if found and all(shutil.which(n) for n in names):
        return Path(found).resolve().parent
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.name.split(".")],
        reverse=True,
    )
    for folder in candidates:
        if all((folder / n).exists() for n in names):
            return folder
    raise ClusterError(f"PostgreSQL's server programs (initdb, pg_ctl) are not installed; run `{SETUP_FIX}`")


def _airflow_cli() -> str:
    cli = Path(sys.executable).with_name("airflow")
    if not cli.exists():
        raise ClusterError(f"no airflow command beside {sys.executable}; run `bash scripts/setup.sh`")
    return str(cli)


# ---------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------


class LocalCluster:
    """One cluster folder. ``up``/``down`` may be called from different processes (state in
    ``cluster.json``). ``up`` keeps the folder's credentials and data across restarts."""

    def __init__(self, root: Path | str | None = None) -> None:
        if root is None:
            override = os.environ.get(ENV_DIR, "").strip()
            root = Path(override) if override else _checkout() / "var" / "cluster"
        self.layout = Layout(Path(root).expanduser().resolve())
        self.mark = hashlib.sha256(str(self.layout.root).encode()).hexdigest()[:16]
        self._lock = threading.Lock()
        self._state: ClusterState | None = None
        self._creds: Credentials | None = None

    # -- public API ------------------------------------------------------------------

    @property
    def root(self) -> Path:
        return self.layout.root

    def state(self) -> ClusterState | None:
        try:
            raw = json.loads(self.layout.state_file.read_text())
        except FileNotFoundError:
            return None
        return ClusterState(**raw)

    def credentials(self) -> Credentials:
        if self._creds is None:
            self._creds = Credentials.load(self.layout.credentials)
        return self._creds

    def client_env(self) -> dict[str, str]:
        """What ``source <dir>/env`` exports, resolved (secrets included): for subprocesses."""
        state = self._require_state()
        return self._resolve(self._client_env_template(state))

    def airflow_url(self) -> str:
        return f"http://{HOST}:{self._require_state().ports['airflow_api']}"

    def up(
        self,
        *,
        workers: int = 2,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        executor_memory: str = "768m",
        timeout_s: float = 300.0,
        say: Callable[[str], None] = print,
    ) -> ClusterState:
        """Start every service (those that can, in parallel) and wait until each answers its probe.

        A cluster already fully up is left as it is. On a failure everything started is
        stopped again and ClusterError names the service, with its log's last lines.
        """
        if workers != 2:
            raise ClusterError("this cluster runs exactly 2 Spark workers")
        previous = self.state()
        if previous and any(self._running(previous, s) for s in SERVICES):
            statuses = self.status()
            if all(s.healthy for s in statuses):
                say(f"already up: {self.root}")
                return previous
            say("some services are down or unhealthy: restarting the whole cluster")
            self.down(say=say)
            previous = self.state()
        t0 = time.monotonic()
        layout = self.layout
        state = self._begin(
            previous,
            (layout.s3_data, layout.kafka, layout.spark, layout.airflow_home),
            PORT_NAMES,
            worker_cores=worker_cores,
            worker_memory=worker_memory,
            executor_memory=executor_memory,
        )
        self._write_config_files(state)
        state.pools = self._writer_pools()  # a pipeline config that does not load fails here, early

        def chain(*steps: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                for step in steps:
                    step()

            return run

        branches = {
            "postgres+airflow": chain(
                self._timed("postgres", self._start_postgres),
                self._timed("airflow-db-migrate", self._airflow_db_migrate),
                self._timed("airflow", self._start_airflow),
            ),
            "object-store": self._timed("object-store", self._start_object_store),
            "kafka": self._timed("kafka", self._start_kafka),
            "spark": self._timed("spark", self._start_spark),
        }
        errors: list[str] = []
        with ThreadPoolExecutor(max_workers=len(branches), thread_name_prefix="cluster-up") as pool:
            futures = {name: pool.submit(fn) for name, fn in branches.items()}
            deadline = time.monotonic() + timeout_s
            for name, future in futures.items():
                try:
                    future.result(timeout=max(1.0, deadline - time.monotonic()))
                except Exception as err:  # noqa: BLE001 - collected and reported together
                    errors.append(f"{name}: {self._scrub(str(err))}")
        if errors:
            say("start-up failed; stopping what was started")
            self.down(say=lambda _msg: None)
            raise ClusterError("the cluster did not come up:\n" + "\n".join(errors))
        state.timings_s["up"] = round(time.monotonic() - t0, 1)
        self._save_state()
        say(f"up in {state.timings_s['up']:.1f}s: {self.root}")
        return state

    def up_spark(
        self,
        *,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        executor_memory: str = "768m",
        timeout_s: float = 90.0,
        say: Callable[[str], None] = print,
    ) -> dict[str, str]:
        """Start only the Spark master and its 2 workers (Spark authentication on, loopback), in
        this folder, and return what a Spark driver needs to use them (:meth:`spark_client_env`).

        The same daemons and settings as :meth:`up` (``spark/daemon.conf``, ``spark/conf``,
        ``cluster.json``, the mark), without PostgreSQL, Airflow, the object store or Kafka: the
        Spark settings carry no S3A. :meth:`down` stops them and their executors. Raises
        ClusterError when a service of this folder is running already, or Spark does not come up
        (what was started is stopped again).
        """
        previous = self.state()
        if previous and any(self._running(previous, s) for s in SERVICES):
            raise ClusterError(f"services of {self.root} are running already: `down` them first")
        t0 = time.monotonic()
        state = self._begin(
            previous,
            (self.layout.spark,),
            SPARK_PORT_NAMES,
            worker_cores=worker_cores,
            worker_memory=worker_memory,
            executor_memory=executor_memory,
            spark_only=True,
        )
        self._write_spark_files(state)
        try:
            self._timed("spark", lambda: self._start_spark(timeout_s))()
        except Exception as err:
            self.down(say=lambda _msg: None)
            raise ClusterError(f"Spark did not come up: {self._scrub(str(err))}") from None
        state.timings_s["up"] = round(time.monotonic() - t0, 1)
        self._save_state()
        say(
            f"Spark master {self.spark_master_url()} and 2 workers ({worker_cores} core(s) each) up in "
            f"{state.timings_s['up']:.1f}s: {self.root}"
        )
        return self.spark_client_env()

    def _begin(
        self,
        previous: ClusterState | None,
        folders: tuple[Path, ...],
        port_names: tuple[str, ...],
        **fields: Any,
    ) -> ClusterState:
        """The start of :meth:`up` and :meth:`up_spark`: the folder, its logs and ``folders``, this
        folder's credentials (generated once), and a new state of ``fields`` with ports (the previous
        run's where still free) and its start time, recorded in ``cluster.json``."""
        for folder in (self.layout.root, self.layout.logs, *folders):
            folder.mkdir(parents=True, exist_ok=True)
        if self.layout.credentials.exists():
            self._creds = Credentials.load(self.layout.credentials)
        else:
            self._creds = Credentials.generate()
            self._creds.save(self.layout.credentials)
        state = ClusterState(
            root=str(self.layout.root),
            ports=choose_ports(previous.ports if previous else None, port_names),
            started_at=time.time(),
            **fields,
        )
        self._state = state
        self._save_state()
        return state

    def spark_master_url(self) -> str:
        return f"spark://{HOST}:{self._require_state().ports['spark_master']}"

    def spark_client_env(self) -> dict[str, str]:
        """What a Spark driver in another process needs to run on this cluster's master, resolved
        (the Spark authentication secret included): ``SPLITKEEPER_SPARK_MASTER``,
        ``SPLITKEEPER_SPARK_CONF``, the loopback and the Python of the executors."""
        state = self._require_state()
        return self._resolve(self._spark_env_template(state, self._ref))

    def status(self) -> list[ServiceStatus]:
        """Each service: running (its recorded process is alive) and healthy (its probe answered)."""
        state = self.state()
        if state is None:
            return [ServiceStatus(s, None, None, False, False, "never started") for s in SERVICES]
        services = SPARK_SERVICES if state.spark_only else SERVICES
        probes: dict[str, Callable[[], str]] = {
            "postgres": lambda: self._probe_postgres(state),
            "object-store": lambda: self._probe_s3(state),
            "kafka": lambda: self._probe_kafka(state),
            "spark-master": lambda: self._probe_spark_master(state),
            "spark-worker-1": lambda: self._probe_spark_worker(state, 1),
            "spark-worker-2": lambda: self._probe_spark_worker(state, 2),
            "airflow-api-server": lambda: self._probe_airflow_api(state),
            "airflow-scheduler": lambda: self._probe_airflow_scheduler(state),
            "airflow-dag-processor": lambda: self._probe_airflow_job(state, "dag_processor"),
            "airflow-triggerer": lambda: self._probe_airflow_job(state, "triggerer"),
        }
        ports = {
            "postgres": "postgres",
            "object-store": "s3",
            "kafka": "kafka",
            "spark-master": "spark_master",
            "spark-worker-1": "spark_worker_1_ui",
            "spark-worker-2": "spark_worker_2_ui",
            "airflow-api-server": "airflow_api",
            "airflow-scheduler": "airflow_scheduler_health",
        }

        def one(name: str) -> ServiceStatus:
            proc = self._service_proc(state, name)
            port = state.ports.get(ports[name]) if name in ports else None
            if proc is None or not proc.alive():
                return ServiceStatus(name, port, None, False, False, "not running")
            try:
                detail = probes[name]()
            except Exception as err:  # noqa: BLE001 - a failed probe is a status, not a crash
                return ServiceStatus(
                    name, port, proc.pid, True, False, self._scrub(f"{type(err).__name__}: {err}")
                )
            return ServiceStatus(name, port, proc.pid, True, True, detail)

        if any(self._service_proc(state, s) for s in services) and self._creds is None:
            with contextlib.suppress(FileNotFoundError, ClusterError):
                self._creds = Credentials.load(self.layout.credentials)
        with ThreadPoolExecutor(max_workers=len(services), thread_name_prefix="cluster-status") as pool:
            return list(pool.map(one, services))

    def down(self, *, say: Callable[[str], None] = print, purge: bool = False) -> list[str]:
        """Stop every service (Airflow first, PostgreSQL last), then any process still carrying
        this cluster's mark or in a service's process group. Returns what was stopped. Raises
        ClusterError if a process of the cluster survives. ``purge`` also deletes the folder."""
        state = self.state()
        stopped: list[str] = []
        t0 = time.monotonic()
        if state is not None:
            self._state = state
            with ThreadPoolExecutor(max_workers=4, thread_name_prefix="cluster-down") as pool:
                airflow = [pool.submit(self._stop_group, state, s) for s in AIRFLOW_SERVICES]
                spark = [
                    pool.submit(self._stop_group, state, s)
                    for s in ("spark-worker-1", "spark-worker-2", "spark-master")
                ]
                others = [
                    pool.submit(self._stop_kafka, state),
                    pool.submit(self._stop_group, state, "object-store"),
                ]
                for future in (*airflow, *spark, *others):
                    name = future.result()
                    if name:
                        stopped.append(name)
            if self._stop_postgres(state):
                stopped.append("postgres")
        leftovers = self._sweep(state)
        if leftovers:
            say(f"ended {len(leftovers)} leftover process(es) of this cluster: {leftovers}")
        left = self.processes()
        if left:
            raise ClusterError(f"processes of this cluster are still alive after down: {left}")
        if state is not None:
            state.services = {}
            state.timings_s["down"] = round(time.monotonic() - t0, 1)
            self._state = state
            self._save_state()
        if purge and self.root.exists():
            shutil.rmtree(self.root)
        say(f"down: stopped {', '.join(stopped) if stopped else 'nothing (nothing was running)'}")
        return stopped

    def processes(self) -> list[int]:
        """Pids of live processes of this cluster: those carrying its mark (services and their
        children), and the members of the recorded services' process groups."""
        stats = {pid: stat for pid, stat in process.processes() if not stat.zombie}
        found = {pid for pid in stats if pid != os.getpid() and self._has_mark(pid)}
        found |= set(self._recorded_groups(self._state or self.state()))
        # and their descendants (PostgreSQL's backends each start a session of their own)
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat.ppid, []).append(pid)
        stack = list(found)
        while stack:
            for child in children.get(stack.pop(), []):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return sorted(found)

    # -- environment -----------------------------------------------------------------

    def _require_state(self) -> ClusterState:
        state = self._state or self.state()
        if state is None:
            raise ClusterError(f"no cluster in {self.root}; run `bash scripts/cluster.sh up`")
        return state

    def _resolve(self, template: Mapping[str, str]) -> dict[str, str]:
        """Fill ``${SPLITKEEPER_CLUSTER_*}`` references with the secrets."""
        values = self.credentials().as_env()
        return {k: string.Template(v).substitute(values) for k, v in template.items()}

    @staticmethod
    def _ref(name: str) -> str:
        """A secret of ``credentials.env`` as a ``${SPLITKEEPER_CLUSTER_*}`` reference."""
        return "${" + Credentials.variable(name) + "}"

    def _spark_env_template(self, state: ClusterState, ref: Callable[[str], str]) -> dict[str, str]:
        """What a Spark driver of this cluster gets (the in-process pyspark of ``splitkeeper run``),
        secrets as references."""
        return {
            "SPLITKEEPER_SPARK_MASTER": f"spark://{HOST}:{state.ports['spark_master']}",
            "SPLITKEEPER_SPARK_CONF": ";".join(
                f"{k}={v}" for k, v in self._spark_client_conf(state, ref).items()
            ),
            "SPLITKEEPER_SPARK_SHUFFLE_PARTITIONS": "4",
            # the driver (and spark-submit) stay on the loopback interface
            "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def _client_env_template(self, state: ClusterState) -> dict[str, str]:
        """The client environment, secrets as ``${SPLITKEEPER_CLUSTER_*}`` references (the ``env`` file)."""
        ref = self._ref
        ports = state.ports
        jars = jarlib.jars_root()
        spark_jars = ",".join(
            str(p)
            for group in (jarlib.JarGroup.SPARK, *(() if state.spark_only else (jarlib.JarGroup.S3A,)))
            for p in sorted(jarlib.group_dir(group, jars).glob("*.jar"))
        )
        spark = {
            "SPLITKEEPER_CLUSTER_DIR": str(self.root),
            **self._spark_env_template(state, ref),
            "SPLITKEEPER_SPARK_JARS": spark_jars,
            "SPARK_CONF_DIR": str(self.layout.spark / "conf"),
        }
        if state.spark_only:
            return spark
        s3_endpoint = f"http://{HOST}:{ports['s3']}"
        return {
            **spark,
            "SPLITKEEPER_LAKE_ROOT": f"s3a://{BUCKET}",
            "SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS": f"{HOST}:{ports['kafka']}",
            "SPLITKEEPER_AIRFLOW_URL": f"http://{HOST}:{ports['airflow_api']}",
            "SPLITKEEPER_AIRFLOW_USER": "operator",
            "SPLITKEEPER_AIRFLOW_PASSWORD": ref("airflow_operator_password"),
            # delta-rs (deltalake) reads the AWS_* variables; it commits with If-None-Match
            **self._store_env(s3_endpoint, ref),
        }

    def _spark_client_conf(self, state: ClusterState, ref: Callable[[str], str]) -> dict[str, str]:
        s3 = f"http://{HOST}:{state.ports.get('s3')}"
        return {
            "spark.authenticate": "true",
            "spark.authenticate.secret": ref("spark_auth_secret"),
            "spark.driver.host": HOST,
            "spark.driver.bindAddress": HOST,
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.executorEnv.PYTHONPATH": str(_checkout()),
            "spark.executor.memory": state.executor_memory,
            "spark.executor.cores": "1",
            # a 2-core cluster: Delta's default of 50 snapshot partitions makes every small scan 50 tasks
            "spark.databricks.delta.snapshotPartitions": "4",
            # each worker has a private /tmp (worker_isolation): a pipeline stages on the object store
            SHARED_DISK_CONF: "false",
            **({} if state.spark_only else s3a_conf(s3, ref("s3_access_key"), ref("s3_secret_key"))),
            **({} if state.spark_only else executor_store_env(self._store_env(s3, ref))),
        }

    @staticmethod
    def _store_env(endpoint: str, ref: Callable[[str], str]) -> dict[str, str]:
        """The ``AWS_*`` variables of the cluster's object store (delta-rs and pyarrow read them)."""
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": ref("s3_access_key"),
            "AWS_SECRET_ACCESS_KEY": ref("s3_secret_key"),
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def _dag_folder(self) -> Path:
        """The cluster's DAG folder: links to the product's DAGs (``dags/``) and to the cluster's own
        ``splitkeeper_cluster_check`` (shipped with the tools, not the product). Airflow follows them."""
        folder = self.layout.airflow_home / "dags"
        folder.mkdir(parents=True, exist_ok=True)
        sources = [*sorted(resources.dags_dir().glob("splitkeeper_*.py")), *sorted(CLUSTER_DAGS.glob("*.py"))]
        for source in sources:
            link = folder / source.name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(source)
        return folder

    def _airflow_env_template(self, state: ClusterState) -> dict[str, str]:
        """Airflow's configuration (``AIRFLOW__*``), secrets as references."""

        def ref(name: str) -> str:
            return "${" + Credentials.variable(name) + "}"

        ports = state.ports
        home = self.layout.airflow_home
        api = f"http://{HOST}:{ports['airflow_api']}"
        return {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self._dag_folder()),
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__FERNET_KEY": ref("airflow_fernet_key"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api}/execution/",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                f"{u}:{r}" for u, r in AIRFLOW_USERS.items()
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": (
                f"postgresql+psycopg2://airflow:{ref('airflow_db_password')}@{HOST}:{ports['postgres']}/airflow"
            ),
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(ports["airflow_api"]),
            "AIRFLOW__API__BASE_URL": api,
            "AIRFLOW__API__SECRET_KEY": ref("airflow_api_secret_key"),
            "AIRFLOW__API_AUTH__JWT_SECRET": ref("airflow_jwt_secret"),
            # `up` with SPLITKEEPER_AIRFLOW_SCHEDULES=0: the scheduler runs triggered runs only (no
            # run per schedule interval; the end-to-end test drives every run through the REST API)
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(os.environ.get(SCHEDULES_ENV, "1").strip() != "0"),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": HOST,
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(ports["airflow_scheduler_health"]),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.layout.logs / "airflow-tasks"),
            # the DAGs' Spark jobs (SparkSubmitOperator) reach the standalone master
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps(
                {"conn_type": "spark", "host": f"spark://{HOST}", "port": ports["spark_master"]}
            ),
        }

    def _write_config_files(self, state: ClusterState) -> None:
        layout = self.layout
        creds = self.credentials()
        self._write_spark_files(state)
        # Airflow: the passwords of the generated users (the simple auth manager reads this file)
        passwords = {"admin": creds.airflow_admin_password, "operator": creds.airflow_operator_password}
        _write_private(layout.airflow_home / "passwords.json", json.dumps(passwords) + "\n")
        self._write_env_file({**self._client_env_template(state), **self._airflow_env_template(state)})

    def _write_spark_files(self, state: ClusterState) -> None:
        layout = self.layout
        creds = self.credentials()
        # Spark daemons: authentication, loopback; Spark clients (spark-submit): everything.
        conf_dir = layout.spark / "conf"
        conf_dir.mkdir(parents=True, exist_ok=True)
        daemon = {
            "spark.authenticate": "true",
            "spark.authenticate.secret": creds.spark_auth_secret,
            "spark.master.rest.enabled": "false",
            "spark.worker.cleanup.enabled": "true",
            "spark.worker.cleanup.interval": "600",
        }
        _write_private(layout.spark / "daemon.conf", "".join(f"{k} {v}\n" for k, v in daemon.items()))
        client = self._resolve(self._spark_client_conf(state, lambda n: "${" + Credentials.variable(n) + "}"))
        _write_private(conf_dir / "spark-defaults.conf", "".join(f"{k} {v}\n" for k, v in client.items()))
        (conf_dir / "log4j2.properties").write_text(
            "rootLogger.level = info\n"
            "rootLogger.appenderRef.stdout.ref = console\n"
            "appender.console.type = Console\n"
            "appender.console.name = console\n"
            "appender.console.target = SYSTEM_ERR\n"
            "appender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex\n"
        )
        if state.spark_only:
            self._write_env_file(self._client_env_template(state))

    def _write_env_file(self, env: Mapping[str, str]) -> None:
        """The env file: sources credentials.env, holds no secret itself."""
        layout = self.layout
        lines = [
            "# splitkeeper local cluster (bash scripts/cluster.sh up). Point splitkeeper, spark-submit,",
            "# deltalake and the airflow CLI at it with:  source " + str(layout.env_file),
            f". '{layout.credentials}'",
        ]
        for key, value in env.items():
            if "${" not in value:
                lines.append(f"export {key}={shlex.quote(value)}")
                continue
            if any(ch in value for ch in '"\\`'):  # a reference to a secret: double quotes, nothing else
                raise ClusterError(f"{key} holds a character the env file cannot quote")
            lines.append(f'export {key}="{value}"')
        layout.env_file.write_text("\n".join(lines) + "\n")

    def _base_env(self) -> dict[str, str]:
        """The services' environment: this one minus any splitkeeper/Spark/Airflow settings, plus the mark."""
        drop = ("SPLITKEEPER_", "AIRFLOW", "SPARK_", "PYSPARK_", "AWS_", "KAFKA_", "PYTHONPATH")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["SPLITKEEPER_JARS_DIR"] = str(jarlib.jars_root())
        env[MARK] = self.mark
        return env

    def _scrub(self, text: str) -> str:
        """``text`` with every secret of this cluster replaced."""
        creds = self._creds
        if creds is None:
            with contextlib.suppress(Exception):
                creds = Credentials.load(self.layout.credentials)
        if creds is None:
            return text
        for value in creds.values():
            if value:
                text = text.replace(value, "***")
        return text

    # -- processes -------------------------------------------------------------------

    def _timed(self, name: str, step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.monotonic()
            step()
            with self._lock:
                assert self._state is not None
                self._state.timings_s[name] = round(time.monotonic() - t0, 1)

        return run

    def _save_state(self) -> None:
        with self._lock:
            assert self._state is not None
            path = self.layout.state_file
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(asdict(self._state), indent=2) + "\n")
            tmp.replace(path)

    def _record(self, service: str, proc: Proc) -> None:
        with self._lock:
            assert self._state is not None
            self._state.services[service] = asdict(proc)
        self._save_state()

    def _spawn(self, service: str, argv: list[str], env: Mapping[str, str], cwd: Path | None = None) -> Proc:
        log = self.layout.log(service)
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {service}\n".encode())
            out.flush()
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=str(cwd or self.root),
                start_new_session=True,
            )
        proc = Proc(pid=child.pid, start_ticks=_start_ticks(child.pid) or 0, pgid=child.pid)
        self._record(service, proc)
        return proc

    def _wait(self, service: str, proc: Proc | None, probe: Callable[[], bool], timeout_s: float) -> None:
        """Poll ``probe`` (short intervals) until it is true; fail early when the process dies."""
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while True:
            with contextlib.suppress(Exception):
                if probe():
                    return
            if proc is not None and not proc.alive():
                raise ClusterError(
                    f"{service} exited during start-up; last log lines:\n{self._tail(service)}"
                )
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{service} did not become ready within {timeout_s:.0f}s; "
                    f"last log lines:\n{self._tail(service)}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _tail(self, service: str, lines: int = 25) -> str:
        try:
            text = self.layout.log(service).read_text(errors="replace")
        except OSError:
            return "(no log)"
        return self._scrub("\n".join(text.splitlines()[-lines:]))

    def _running(self, state: ClusterState, service: str) -> bool:
        proc = self._service_proc(state, service)
        return proc is not None and proc.alive()

    def _service_proc(self, state: ClusterState, service: str) -> Proc | None:
        return state.proc(service)

    def _stop_group(self, state: ClusterState, service: str, timeout_s: float = 30.0) -> str | None:
        """SIGTERM the service's process group, SIGKILL it after ``timeout_s``."""
        proc = state.proc(service)
        if proc is None or not self._group_members(proc):
            return None
        process.stop(
            lambda sig: os.killpg(proc.pgid, sig),
            lambda: bool(self._group_members(proc)),
            timeout_s,
            kill_wait_s=0.2,
        )
        return service

    def _group_members(self, proc: Proc) -> list[int]:
        """Live processes of ``proc``'s process group, when the group is provably this cluster's:
        its leader is still the process we started (same start time), or a member carries the
        mark. (Airflow and PostgreSQL rewrite their process titles over their environment, so
        the mark alone does not find every one of their processes.)"""
        members = [pid for pid, stat in process.processes() if stat.pgid == proc.pgid and not stat.zombie]
        if not members:
            return []
        if proc.alive() or any(self._has_mark(pid) for pid in members):
            return members
        return []

    def _has_mark(self, pid: int) -> bool:
        return process.environ_value(pid, MARK) == self.mark

    def _recorded_groups(self, state: ClusterState | None) -> list[int]:
        """Live members of every recorded service's process group."""
        if state is None:
            return []
        found: set[int] = set()
        for service in state.services:
            proc = state.proc(service)
            if proc is not None:
                found.update(self._group_members(proc))
        return sorted(found)

    def _sweep(self, state: ClusterState | None) -> list[int]:
        """End every process still carrying the mark or in a recorded group (SIGTERM, then SIGKILL)."""

        def left() -> list[int]:
            return sorted(set(self.processes()) | set(self._recorded_groups(state)))

        def send(sig: signal.Signals) -> None:
            for pid in left():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

        pids = left()
        process.stop(send, lambda: bool(left()), 5.0, kill_wait_s=5.0)
        return pids

    # -- PostgreSQL ------------------------------------------------------------------

    def _as_postgres(self) -> list[str]:
        """Command prefix running a PostgreSQL program as a user it accepts (never root)."""
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise ClusterError(
                "running as root, and PostgreSQL refuses root: no 'postgres' user exists to run it as "
                f"(`{SETUP_FIX}` installs Debian's postgresql package, which creates it)"
            ) from None
        return ["runuser", "-u", "postgres", "--"]

    def _chown_postgres(self, *paths: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            for path in paths:
                os.chown(path, user.pw_uid, user.pw_gid)

    def _start_postgres(self) -> None:
        layout, state, creds = self.layout, self._require_state(), self.credentials()
        binaries = postgres_bin()
        prefix = self._as_postgres()
        env = self._base_env()
        data = layout.pg_data
        data.parent.mkdir(parents=True, exist_ok=True)
        layout.pg_run.mkdir(parents=True, exist_ok=True)
        log = layout.log("postgres")
        log.touch()
        self._chown_postgres(data.parent, layout.pg_run, log)
        if prefix:
            probe = subprocess.run([*prefix, "test", "-w", str(data.parent)], env=env, check=False)
            if probe.returncode != 0:
                raise ClusterError(
                    f"the postgres user cannot reach {data.parent} (a parent folder is not searchable "
                    f"by others?); set {ENV_DIR} to a folder it can reach, e.g. under /var/tmp"
                )
        if not (data / "PG_VERSION").exists():
            shutil.rmtree(data, ignore_errors=True)
            pwfile = data.parent / ".initdb-password"
            _write_private(pwfile, creds.pg_superuser_password + "\n")
            self._chown_postgres(pwfile)
            try:
                done = subprocess.run(
                    [
                        *prefix,
                        str(binaries / "initdb"),
                        "-D",
                        str(data),
                        "-U",
                        "postgres",
                        f"--pwfile={pwfile}",
                        "--auth-local=peer",
                        "--auth-host=scram-sha-256",
                        "-E",
                        "UTF8",
                        "--no-locale",
                        "--no-sync",
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
            finally:
                pwfile.unlink(missing_ok=True)
            if done.returncode != 0:
                raise ClusterError(f"initdb failed: {self._scrub((done.stderr or done.stdout)[-2000:])}")
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={state.ports['postgres']}",
                f"-c unix_socket_directories={layout.pg_run}",
                "-c max_connections=100",
                "-c shared_buffers=64MB",
                "-c synchronous_commit=off",
            ]
        )
        started = subprocess.run(
            [
                *prefix,
                str(binaries / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            start_new_session=True,
        )
        if started.returncode != 0:
            raise ClusterError(
                f"pg_ctl start failed: {self._scrub(started.stderr or started.stdout)}\n"
                f"{self._tail('postgres')}"
            )
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        self._record("postgres", Proc.of(pid))
        self._create_airflow_database()

    def _create_airflow_database(self) -> None:
        import psycopg2

        state, creds = self._require_state(), self.credentials()
        conn = psycopg2.connect(
            host=HOST,
            port=state.ports["postgres"],
            user="postgres",
            password=creds.pg_superuser_password,
            dbname="postgres",
            connect_timeout=10,
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                verifier = scram_sha256(creds.airflow_db_password)  # the server never sees the password
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = 'airflow'")
                if cur.fetchone():
                    cur.execute("ALTER ROLE airflow WITH LOGIN PASSWORD %s", (verifier,))
                else:
                    cur.execute("CREATE ROLE airflow WITH LOGIN PASSWORD %s", (verifier,))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow'")
                if not cur.fetchone():
                    cur.execute("CREATE DATABASE airflow OWNER airflow")
        finally:
            conn.close()

    def _stop_postgres(self, state: ClusterState) -> bool:
        proc = state.proc("postgres")
        if proc is None or not proc.alive():
            return False
        try:
            done = subprocess.run(
                [
                    *self._as_postgres(),
                    str(postgres_bin() / "pg_ctl"),
                    "-D",
                    str(self.layout.pg_data),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    "30",
                    "stop",
                ],
                env=self._base_env(),
                capture_output=True,
                text=True,
                check=False,
            )
            ok = done.returncode == 0
        except ClusterError:
            ok = False
        if not ok:
            self._stop_group(state, "postgres", timeout_s=10)
        return True

    def _probe_postgres(self, state: ClusterState) -> str:
        port = state.ports["postgres"]
        done = subprocess.run(
            [str(postgres_bin() / "pg_isready"), "-h", HOST, "-p", str(port), "-d", "airflow", "-t", "3"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(f"pg_isready: {done.stdout.strip() or done.stderr.strip()}")
        return f"pg_isready: accepting connections on {HOST}:{port}"

    # -- object store ----------------------------------------------------------------

    def _s3(self, state: ClusterState) -> S3Client:
        creds = self.credentials()
        return S3Client(
            f"http://{HOST}:{state.ports['s3']}", creds.s3_access_key, creds.s3_secret_key, REGION
        )

    def _start_object_store(self) -> None:
        state, creds = self._require_state(), self.credentials()
        argv, env = versitygw_launch(
            f"{HOST}:{state.ports['s3']}", self.layout.s3_data, creds.s3_access_key, creds.s3_secret_key
        )
        proc = self._spawn("object-store", argv, {**self._base_env(), **env})
        client = self._s3(state)
        self._wait("object-store", proc, lambda: isinstance(client.list_buckets(), list), 30)
        client.create_bucket(BUCKET)

    def _probe_s3(self, state: ClusterState) -> str:
        buckets = self._s3(state).list_buckets()
        if BUCKET not in buckets:
            raise ClusterError(f"ListBuckets answered without bucket {BUCKET!r}: {buckets}")
        return f"S3 ListBuckets: {', '.join(buckets)}"

    # -- Kafka -----------------------------------------------------------------------

    def _start_kafka(self) -> None:
        state = self._require_state()
        log = self.layout.log("kafka")
        link = self.layout.log("kafka-broker")
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        link.symlink_to(self.layout.kafka / "broker.log")
        with open(log, "ab") as out:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "splitkeeper_tools.kafka_broker",
                    "start",
                    "--data-dir",
                    str(self.layout.kafka),
                    "--port",
                    str(state.ports["kafka"]),
                    "--timeout",
                    "120",
                ],
                env=self._base_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
                cwd=str(_checkout()),
            )
        if done.returncode != 0:
            raise ClusterError(f"the Kafka broker did not start; last log lines:\n{self._tail('kafka')}")
        from splitkeeper_tools.kafka_broker import read_state

        broker = read_state(self.layout.kafka)
        if broker is None or broker.pid is None:
            raise ClusterError("the Kafka broker started but wrote no pid")
        self._record("kafka", Proc.of(broker.pid))

    def _stop_kafka(self, state: ClusterState) -> str | None:
        proc = state.proc("kafka")
        if proc is None or not proc.alive():
            return None
        from splitkeeper_tools.kafka_broker import KafkaBroker

        KafkaBroker(self.layout.kafka).stop(timeout_s=30)
        return "kafka"

    def _probe_kafka(self, state: ClusterState) -> str:
        import logging

        from confluent_kafka.admin import AdminClient

        quiet = logging.getLogger("splitkeeper_tools.cluster.librdkafka")
        quiet.propagate = False
        conf: dict[str, Any] = {"bootstrap.servers": f"{HOST}:{state.ports['kafka']}", "logger": quiet}
        admin = AdminClient(conf)
        metadata = admin.list_topics(timeout=5)
        return f"Kafka metadata: {len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)"

    # -- Spark -----------------------------------------------------------------------

    def _spark_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        home = spark_home()
        return {
            **self._base_env(),
            "SPARK_HOME": str(home),
            "SPARK_CONF_DIR": str(self.layout.spark / "conf"),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": "512m",
            "SPARK_NO_DAEMONIZE": "1",
            "PYSPARK_PYTHON": sys.executable,
            **(extra or {}),
        }

    def _start_spark(self, timeout_s: float = 90.0) -> None:
        """The master, then its 2 workers; each within ``timeout_s``."""
        state = self._require_state()
        ports = state.ports
        spark_class = str(spark_home() / "bin" / "spark-class")
        conf = str(self.layout.spark / "daemon.conf")
        master = self._spawn(
            "spark-master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                HOST,
                "--port",
                str(ports["spark_master"]),
                "--webui-port",
                str(ports["spark_master_ui"]),
                "--properties-file",
                conf,
            ],
            self._spark_env(),
        )
        self._wait(
            "spark-master", master, lambda: self._master_json(state).get("status") == "ALIVE", timeout_s
        )
        workers = {i: self._spawn_worker(state, i) for i in (1, 2)}
        for i, proc in workers.items():
            self._wait_worker(state, i, proc, timeout_s)

    def _spawn_worker(self, state: ClusterState, i: int) -> Proc:
        work = self.layout.spark / f"worker-{i}"
        local = self.layout.spark / f"local-{i}"
        work.mkdir(parents=True, exist_ok=True)
        local.mkdir(parents=True, exist_ok=True)
        return self._spawn(
            f"spark-worker-{i}",
            [
                *worker_isolation(self.root),
                str(spark_home() / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                HOST,
                "--webui-port",
                str(state.ports[f"spark_worker_{i}_ui"]),
                "--cores",
                str(state.worker_cores),
                "--memory",
                state.worker_memory,
                "--work-dir",
                str(work),
                "--properties-file",
                str(self.layout.spark / "daemon.conf"),
                f"spark://{HOST}:{state.ports['spark_master']}",
            ],
            self._spark_env({"SPARK_LOCAL_DIRS": str(local), "SPARK_WORKER_DIR": str(work)}),
        )

    def _wait_worker(self, state: ClusterState, i: int, proc: Proc, timeout_s: float) -> None:
        def registered() -> bool:
            return self._worker_entry(state, i) is not None

        self._wait(f"spark-worker-{i}", proc, registered, timeout_s)

    def start_spark_worker(self, i: int, timeout_s: float = 90.0) -> int:
        """(Re)start Spark worker ``i`` (1 or 2) of a running cluster, e.g. after a test killed it;
        returns its pid once the master lists it ALIVE."""
        if i not in (1, 2):
            raise ClusterError(f"no spark-worker-{i}: the cluster has workers 1 and 2")
        state = self._require_state()
        self._state = state
        self.credentials()
        if self._running(state, f"spark-worker-{i}"):
            raise ClusterError(
                f"spark-worker-{i} is already running (pid {state.services[f'spark-worker-{i}']['pid']})"
            )
        proc = self._spawn_worker(state, i)
        self._wait_worker(state, i, proc, timeout_s)
        return proc.pid

    def _master_json(self, state: ClusterState) -> dict[str, Any]:
        return _get_json(f"http://{HOST}:{state.ports['spark_master_ui']}/json/")

    def _worker_entry(self, state: ClusterState, i: int) -> dict[str, Any] | None:
        """The master's view of worker ``i`` (matched by its UI port), when ALIVE."""
        port = state.ports[f"spark_worker_{i}_ui"]
        for worker in self._master_json(state).get("workers", []):
            if str(worker.get("webuiaddress", "")).endswith(f":{port}") and worker.get("state") == "ALIVE":
                return worker
        return None

    def _probe_spark_master(self, state: ClusterState) -> str:
        info = self._master_json(state)
        if info.get("status") != "ALIVE":
            raise ClusterError(f"master status {info.get('status')}")
        alive = [w for w in info.get("workers", []) if w.get("state") == "ALIVE"]
        ui = state.ports["spark_master_ui"]
        return f"master ALIVE, {len(alive)} worker(s) ALIVE, {info.get('cores', 0)} cores (UI :{ui})"

    def _probe_spark_worker(self, state: ClusterState, i: int) -> str:
        entry = self._worker_entry(state, i)
        if entry is None:
            raise ClusterError("not registered with the master (or not ALIVE)")
        with urllib.request.urlopen(f"http://{HOST}:{state.ports[f'spark_worker_{i}_ui']}/", timeout=3):
            pass
        return f"registered ALIVE: {entry.get('cores')} core(s), {entry.get('memory')} MiB"

    # -- Airflow ---------------------------------------------------------------------

    def _airflow_env(self) -> dict[str, str]:
        state = self._require_state()
        env = {
            **self._base_env(),
            **self._resolve(self._client_env_template(state)),
            **self._resolve(self._airflow_env_template(state)),
        }
        env["PYTHONPATH"] = str(_checkout())  # the DAG files import splitkeeper from this checkout
        # what the DAGs' tasks run: the pipeline and where reports go, from the caller of `up`
        for name in AIRFLOW_PASS_THROUGH:
            if os.environ.get(name):
                env[name] = os.environ[name]
        return env

    def _airflow_db_migrate(self) -> None:
        import airflow

        stamp = self.layout.airflow_home / ".migrated"
        if stamp.exists() and stamp.read_text().strip() == airflow.__version__:
            return
        log = self.layout.log("airflow-db-migrate")
        with open(log, "ab") as out:
            done = subprocess.run(
                [_airflow_cli(), "db", "migrate"],
                env=self._airflow_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=600,
                cwd=str(self.root),
            )
        if done.returncode != 0:
            raise ClusterError(
                f"airflow db migrate failed; last log lines:\n{self._tail('airflow-db-migrate')}"
            )
        stamp.write_text(airflow.__version__ + "\n")

    def _start_airflow(self) -> None:
        state = self._require_state()
        env = self._airflow_env()
        cli = _airflow_cli()
        commands = {
            "airflow-api-server": [
                cli,
                "api-server",
                "--host",
                HOST,
                "--port",
                str(state.ports["airflow_api"]),
                "--workers",
                "1",
            ],
            # --skip-serve-logs: the log servers bind every interface; the api-server reads task
            # logs from the local log folder instead (one machine).
            "airflow-scheduler": [cli, "scheduler", "--skip-serve-logs"],
            "airflow-dag-processor": [cli, "dag-processor"],
            "airflow-triggerer": [cli, "triggerer", "--skip-serve-logs"],
        }
        procs = {name: self._spawn(name, argv, env) for name, argv in commands.items()}
        self._wait(
            "airflow-api-server", procs["airflow-api-server"], lambda: bool(self._airflow_health(state)), 180
        )
        self._wait(
            "airflow-scheduler",
            procs["airflow-scheduler"],
            lambda: _http_ok(f"http://{HOST}:{state.ports['airflow_scheduler_health']}/health"),
            180,
        )
        for service, key in (
            ("airflow-dag-processor", "dag_processor"),
            ("airflow-triggerer", "triggerer"),
            ("airflow-scheduler", "scheduler"),
        ):

            def healthy(key: str = key) -> bool:
                with contextlib.suppress(ClusterError):
                    return bool(self._probe_airflow_job(state, key))
                return False

            self._wait(service, procs[service], healthy, 180)
        self._create_pools(state)

    def _writer_pools(self) -> list[str]:
        """The writer pool of every pipeline ``$SPLITKEEPER_PIPELINE_CONFIG`` names (as the DAGs name
        it, :func:`splitkeeper.airflow.wiring.pool_name`); each config is loaded with the
        environment the Airflow services get, so ``${SPLITKEEPER_KAFKA_BOOTSTRAP_SERVERS}`` resolves."""
        from splitkeeper.airflow.wiring import config_paths, pool_name
        from splitkeeper.config.settings import load_config
        from splitkeeper.errors import ConfigError

        env = self._airflow_env()
        pools = []
        for path in config_paths(env):
            try:
                config = load_config(path, env=env)
            except ConfigError as err:
                raise ClusterError(
                    f"SPLITKEEPER_PIPELINE_CONFIG names {path}, which does not load: {self._scrub(str(err))}"
                ) from None
            pools.append(pool_name(config.name))
        return pools

    def _create_pools(self, state: ClusterState) -> None:
        """Create (or reset to one slot) the writer pool of each configured pipeline, through the
        REST API as ``admin``: without its pool, the scheduler never starts a writing task."""
        if not state.pools:
            return
        base = f"http://{HOST}:{state.ports['airflow_api']}"
        creds = self.credentials()
        _status, token = _request_json(
            "POST",
            f"{base}/auth/token",
            {"username": "admin", "password": creds.airflow_admin_password},
        )
        for name in state.pools:
            body = {"name": name, "slots": 1, "description": "one writer per pipeline (splitkeeper)"}
            status, answer = _request_json("POST", f"{base}/api/v2/pools", body, token["access_token"])
            if status == 409:  # it exists (a restart): one slot again
                status, answer = _request_json(
                    "PATCH", f"{base}/api/v2/pools/{name}", body, token["access_token"]
                )
            if status not in (200, 201):
                raise ClusterError(f"creating Airflow pool {name} failed: HTTP {status} {answer}")
        self._save_state()

    def _airflow_health(self, state: ClusterState) -> dict[str, Any]:
        return _get_json(f"http://{HOST}:{state.ports['airflow_api']}/api/v2/monitor/health")

    def _probe_airflow_api(self, state: ClusterState) -> str:
        health = self._airflow_health(state)
        if health["metadatabase"]["status"] != "healthy":
            raise ClusterError("the metadata database is unhealthy")
        url = f"http://{HOST}:{state.ports['airflow_api']}/api/v2/dags"
        try:
            with urllib.request.urlopen(url, timeout=5):
                raise ClusterError("GET /api/v2/dags answered without credentials: authentication is OFF")
        except urllib.error.HTTPError as err:
            if err.code not in (401, 403):
                raise
        base = url.rsplit("/api", 1)[0]
        return f"REST API v2 up, metadata DB healthy, unauthenticated request refused (auth on) ({base})"

    def _probe_airflow_scheduler(self, state: ClusterState) -> str:
        health_url = f"http://{HOST}:{state.ports['airflow_scheduler_health']}/health"
        if not _http_ok(health_url):
            raise ClusterError(f"{health_url} did not answer 200")
        job = self._airflow_health(state)["scheduler"]
        if job["status"] != "healthy":
            raise ClusterError(f"scheduler heartbeat stale ({job.get('latest_scheduler_heartbeat')})")
        return "health check 200, heartbeat fresh, LocalExecutor"

    def _probe_airflow_job(self, state: ClusterState, key: str) -> str:
        service = "airflow-" + key.replace("_", "-")
        job = self._airflow_health(state)[key]
        beat = job.get(f"latest_{key}_heartbeat")
        if job["status"] == "healthy":
            return f"heartbeat fresh ({beat})"
        age = _heartbeat_age_s(beat)
        if age is not None and age < HEARTBEAT_WINDOW_S:
            # Airflow judges the dag processor by 2.1 heartbeats (10.5 s): one slow parse loop on
            # a loaded 2-core machine misses it. The cluster gives it the scheduler's 30 s.
            return (
                f"heartbeat {age:.0f} s old (within {HEARTBEAT_WINDOW_S:.0f} s; Airflow says {job['status']})"
            )
        raise ClusterError(
            f"{key} heartbeat stale or missing: last {beat or 'never'}"
            + (f", {age:.0f} s ago" if age is not None else "")
            + f" (allowed {HEARTBEAT_WINDOW_S:.0f} s); its log: {self.layout.log(service)}"
        )


def _heartbeat_age_s(beat: str | None) -> float | None:
    """Seconds since an Airflow heartbeat (ISO 8601 with offset), None when there is none."""
    if not beat:
        return None
    from datetime import UTC, datetime

    return (datetime.now(UTC) - datetime.fromisoformat(beat)).total_seconds()


def _get_json(url: str, timeout_s: float = 3.0) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def _request_json(
    method: str, url: str, body: Mapping[str, Any], token: str | None = None, timeout_s: float = 30.0
) -> tuple[int, Any]:
    """(status, decoded JSON answer) of one JSON request; an HTTP error is a status, not an exception."""
    request = urllib.request.Request(
        url,
        method=method,
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token else {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")[:500]


def _http_ok(url: str, timeout_s: float = 3.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


# ---------------------------------------------------------------------------------------
# CLI: scripts/cluster.sh
# ---------------------------------------------------------------------------------------


def format_status(statuses: list[ServiceStatus]) -> str:
    rows = [("service", "port", "pid", "health", "detail")]
    for s in statuses:
        health = "healthy" if s.healthy else ("UNHEALTHY" if s.running else "stopped")
        rows.append((s.name, str(s.port or "-"), str(s.pid or "-"), health, s.detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "\n".join("  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bash scripts/cluster.sh", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "status", "down"])
    parser.add_argument(
        "--dir", type=Path, default=None, help=f"cluster folder (default: ${ENV_DIR} or var/cluster)"
    )
    parser.add_argument("--json", action="store_true", help="status: print JSON")
    parser.add_argument(
        "--purge", action="store_true", help="down: also delete the cluster folder (data, credentials)"
    )
    parser.add_argument("--worker-cores", type=int, default=1)
    parser.add_argument("--worker-memory", default="1g")
    parser.add_argument("--executor-memory", default="768m")
    parser.add_argument("--timeout", type=float, default=300.0, help="up: seconds to wait for every service")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.dir)

    def say(message: str) -> None:
        print(f"[cluster] {message}", flush=True)

    try:
        if args.action == "up":
            state = cluster.up(
                worker_cores=args.worker_cores,
                worker_memory=args.worker_memory,
                executor_memory=args.executor_memory,
                timeout_s=args.timeout,
                say=say,
            )
            timings = ", ".join(f"{k} {v:.1f}s" for k, v in state.timings_s.items())
            say(f"timings: {timings}")
            if state.pools:
                say(f"Airflow writer pools (1 slot each): {', '.join(state.pools)}")
            say(f"point splitkeeper at it: source {cluster.layout.env_file}")
            say(f"credentials (0600): {cluster.layout.credentials}; logs: {cluster.layout.logs}")
            statuses = cluster.status()
            print(format_status(statuses))
            return 0 if all(s.healthy for s in statuses) else 1
        if args.action == "status":
            statuses = cluster.status()
            if args.json:
                print(json.dumps([asdict(s) for s in statuses], indent=2))
            else:
                print(format_status(statuses))
            if not any(s.running for s in statuses):
                return 3
            return 0 if all(s.healthy for s in statuses) else 1
        cluster.down(say=say, purge=args.purge)
        return 0
    except (ClusterError, S3Error) as err:
        print(f"[cluster] ERROR: {err}", file=sys.stderr)
        return 1


@contextlib.contextmanager
def running_cluster(root: Path | str, **up_kwargs: Any) -> Iterator[LocalCluster]:
    """``up`` on enter, ``down`` on exit (tests, scripts)."""
    cluster = LocalCluster(root)
    cluster.up(**up_kwargs)
    try:
        yield cluster
    finally:
        cluster.down()
