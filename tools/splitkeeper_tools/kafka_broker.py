"""A local single-node Apache Kafka broker (KRaft, combined broker+controller).

For local runs and tests: the broker is the real Apache Kafka server, started from
the Maven artifacts that ``scripts/setup.sh`` put in ``.jars/kafka/`` (no Docker, no
tarball). Beyond one machine, point the pipeline at a real Kafka cluster instead.

Layout of ``data_dir`` (all written by :meth:`KafkaBroker.start`):

- ``server.properties``  broker config (127.0.0.1 only)
- ``log4j2.properties``  logging config; the broker's output goes to ``broker.log``
- ``kraft-logs/``        the topic data; kept across restarts of the same data_dir
- ``broker.json``        pid, ports, cluster id: how ``scripts/kafka.sh stop|status``
  (another process) finds the broker; ``pid`` is null once stopped.

``python -m splitkeeper_tools.kafka_broker start|stop|status --data-dir DIR`` is
the command behind ``scripts/kafka.sh``.
"""

from __future__ import annotations

import argparse
import base64
import enum
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from splitkeeper import process
from splitkeeper.errors import EnvironmentNotReadyError, InvalidParameterError, SourceError
from splitkeeper.spark import jars as jarlib

LOG = logging.getLogger(__name__)

HOST = "127.0.0.1"
NODE_ID = 1
DEFAULT_HEAP_OPTS = "-Xmx512m -Xms256m"
STATE_FILE = "broker.json"
LOG_FILE = "broker.log"
_MAIN_CLASS = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"


class BrokerStatus(enum.Enum):
    STOPPED = "stopped"
    RUNNING = "running"


@dataclass(frozen=True, slots=True)
class BrokerState:
    """What ``broker.json`` holds. ``pid`` is None when no broker runs."""

    data_dir: str
    port: int
    controller_port: int
    cluster_id: str
    log_file: str
    pid: int | None = None
    started_at: float | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"


def read_state(data_dir: Path | str) -> BrokerState | None:
    """The state file of ``data_dir``, or None if there is none."""
    path = Path(data_dir) / STATE_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise SourceError(f"cannot read the broker state file {path}: {err}") from err
    return BrokerState(**raw)


def is_broker_process(pid: int | None) -> bool:
    """True if ``pid`` is a live (non-zombie) process running the Kafka broker main class.

    The command-line check keeps a recycled pid from being mistaken for (and
    signalled as) the broker.
    """
    if pid is None or pid <= 0:
        return False
    found = process.stat(pid)
    return found is not None and not found.zombie and _MAIN_CLASS in process.argv(pid)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return process.free_port(HOST)


def new_cluster_id() -> str:
    """A fresh KRaft cluster id: a random UUID in URL-safe base64 without padding (22 chars).

    Like Kafka's own ``Uuid.randomUuid`` it never starts with ``-``: command-line
    parsers take such a value for an option (1 id in 64 would otherwise do so).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


class KafkaBroker:
    """One local broker process bound to ``data_dir``.

    ``start`` and ``stop`` may each be called more than once (a second call is a
    no-op); use it as a context manager to stop it on exit. Not thread-safe: one
    owner drives it. ``port=None`` reuses the port of a previous run of the same
    ``data_dir`` when free, else picks a free one.
    """

    def __init__(
        self,
        data_dir: Path | str,
        port: int | None = None,
        *,
        jars_dir: Path | None = None,
        heap_opts: str | None = None,
        java: str | None = None,
        extra_properties: dict[str, str] | None = None,
        sasl_users: dict[str, str] | None = None,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise InvalidParameterError("port", port, "a TCP port 1..65535, or None for a free one")
        self.data_dir = Path(data_dir).resolve()
        self._requested_port = port
        self._jars_dir = jars_dir
        self._heap_opts = heap_opts or os.environ.get("KAFKA_HEAP_OPTS") or DEFAULT_HEAP_OPTS
        self._java = java or jarlib.java_executable()
        self._extra = dict(extra_properties or {})
        self._sasl_users = dict(sasl_users or {})
        self._sasl_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._state: BrokerState | None = None

    # -- public API ---------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>``; only valid after :meth:`start`."""
        if self._state is None:
            raise SourceError(f"the Kafka broker in {self.data_dir} is not started; call start() first")
        return self._state.bootstrap_servers

    @property
    def sasl_bootstrap_servers(self) -> str:
        """``127.0.0.1:<port>`` of the SASL_PLAINTEXT listener (PLAIN mechanism, ``sasl_users``)."""
        if self._state is None or self._sasl_port is None:
            raise SourceError(
                f"the Kafka broker in {self.data_dir} has no SASL listener: create it with sasl_users "
                "and start() it"
            )
        return f"{HOST}:{self._sasl_port}"

    @property
    def pid(self) -> int | None:
        return self._state.pid if self._state else None

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE

    def status(self) -> BrokerStatus:
        state = read_state(self.data_dir)
        return BrokerStatus.RUNNING if state and is_broker_process(state.pid) else BrokerStatus.STOPPED

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        """Format the storage if needed, launch the broker and wait until it answers.

        Returns when an admin client lists topics. Raises SourceError if another
        broker already runs from this data_dir, if the process exits, or if it is not
        ready within ``timeout_s`` (the process is then killed; see ``broker.log``).
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        previous = read_state(self.data_dir)
        if previous and is_broker_process(previous.pid):
            raise SourceError(
                f"a Kafka broker already runs from {self.data_dir} (pid {previous.pid}, "
                f"{previous.bootstrap_servers}); stop it with `bash scripts/kafka.sh stop`",
                pid=previous.pid,
            )
        classpath = jarlib.kafka_classpath(self._jars_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port, controller_port = self._choose_ports(previous)
        meta = self.data_dir / "kraft-logs" / "meta.properties"
        cluster_id = _read_cluster_id(meta) or new_cluster_id()
        config = self._write_config(port, controller_port)
        self._write_log_config()
        if not meta.exists():
            self._format_storage(classpath, cluster_id, config)

        cmd = [
            self._java,
            *shlex.split(self._heap_opts),
            *self._jvm_opts(),
            "-cp",
            classpath,
            _MAIN_CLASS,
            str(config),
        ]
        LOG.info("starting Kafka broker on %s:%d (data %s)", HOST, port, self.data_dir)
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._state = BrokerState(
            data_dir=str(self.data_dir),
            port=port,
            controller_port=controller_port,
            cluster_id=cluster_id,
            log_file=str(self.log_file),
            pid=self._proc.pid,
            started_at=time.time(),
        )
        self._write_state(self._state)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the broker (controlled shutdown), SIGKILL after ``timeout_s``.

        Stops the broker of this data_dir even if another process started it (via
        ``broker.json``). A no-op when none runs. On return the process is gone.
        """
        state = self._state or read_state(self.data_dir)
        if state is None:
            return
        pid = state.pid
        if self._proc is not None:
            _terminate_child(self._proc, timeout_s)
            self._proc = None
        elif is_broker_process(pid):
            assert pid is not None
            _terminate_pid(pid, timeout_s)
        stopped = BrokerState(**{**asdict(state), "pid": None, "started_at": None})
        self._write_state(stopped)
        self._state = None

    def kill(self, timeout_s: float = 30.0) -> int | None:
        """SIGKILL the broker this object started: a crash, no controlled shutdown (fault tests).

        Returns the process's exit status (``-9``), or None when this object runs no broker. On
        return the process is gone; :meth:`start` starts it again on the same data (log recovery
        included) and, when free, the same ports.
        """
        if self._proc is None or self._state is None:
            return None
        self._proc.kill()
        status = self._proc.wait(timeout=timeout_s)
        self._proc = None
        self._state = BrokerState(**{**asdict(self._state), "pid": None, "started_at": None})
        self._write_state(self._state)
        return status

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------

    def _choose_ports(self, previous: BrokerState | None) -> tuple[int, int]:
        if self._requested_port is not None:
            port = self._requested_port
        elif previous and process.port_is_free(HOST, previous.port):
            port = previous.port
        else:
            port = free_port()
        kept = previous.controller_port if previous else None
        if kept is not None and kept != port and process.port_is_free(HOST, kept):
            controller_port = kept
        else:
            controller_port = free_port()
            while controller_port == port:
                controller_port = free_port()
        return port, controller_port

    def _write_config(self, port: int, controller_port: int) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "kraft-logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
        }
        if self._sasl_users:  # a second listener: SASL_PLAINTEXT with the PLAIN mechanism, on loopback
            self._sasl_port = free_port()
            while self._sasl_port in (port, controller_port):
                self._sasl_port = free_port()
            sasl = f"SASL_PLAINTEXT://{HOST}:{self._sasl_port}"
            users = " ".join(f'user_{name}="{secret}"' for name, secret in sorted(self._sasl_users.items()))
            props.update(
                {
                    "listeners": f"{props['listeners']},{sasl}",
                    "advertised.listeners": f"{props['advertised.listeners']},{sasl}",
                    "listener.security.protocol.map": f"{props['listener.security.protocol.map']},"
                    "SASL_PLAINTEXT:SASL_PLAINTEXT",
                    "sasl.enabled.mechanisms": "PLAIN",
                    "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                        f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
                    ),
                }
            )
        props.update(self._extra)
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _write_log_config(self) -> None:
        (self.data_dir / "log4j2.properties").write_text(
            "\n".join(
                [
                    "status = warn",
                    "appender.out.type = Console",
                    "appender.out.name = out",
                    "appender.out.layout.type = PatternLayout",
                    "appender.out.layout.pattern = [%d] %p %m (%c)%n",
                    "rootLogger.level = info",
                    "rootLogger.appenderRef.out.ref = out",
                    "logger.state.name = state.change.logger",
                    "logger.state.level = warn",
                    "",
                ]
            )
        )

    def _jvm_opts(self) -> list[str]:
        return [
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
        ]

    def _format_storage(self, classpath: str, cluster_id: str, config: Path) -> None:
        cmd = [
            self._java,
            "-Xmx256m",
            *self._jvm_opts(),
            "-cp",
            classpath,
            _STORAGE_TOOL,
            "format",
            # One token: an id kept from an older data dir may still start with "-".
            f"--cluster-id={cluster_id}",
            "--config",
            str(config),
            "--ignore-formatted",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SourceError(
                f"formatting Kafka storage in {self.data_dir} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}",
                command=" ".join(cmd),
            )

    def _wait_ready(self, timeout_s: float) -> None:
        assert self._proc is not None and self._state is not None
        deadline = time.monotonic() + timeout_s
        port = self._state.port
        while True:
            if self._proc.poll() is not None:
                raise SourceError(
                    f"the Kafka broker exited with code {self._proc.returncode} during start-up; "
                    f"last log lines:\n{_tail(self.log_file)}",
                    log_file=str(self.log_file),
                )
            if time.monotonic() > deadline:
                raise SourceError(
                    f"the Kafka broker on {HOST}:{port} was not ready within {timeout_s:.0f}s; "
                    f"last log lines:\n{_tail(self.log_file)}",
                    log_file=str(self.log_file),
                )
            if _accepts_connections(port) and _lists_topics(self._state.bootstrap_servers):
                LOG.info("Kafka broker ready on %s (pid %s)", self._state.bootstrap_servers, self._proc.pid)
                return
            time.sleep(0.25)

    def _write_state(self, state: BrokerState) -> None:
        path = self.data_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp.replace(path)


def _read_cluster_id(meta: Path) -> str | None:
    try:
        for line in meta.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "cluster.id":
                return value.strip()
    except FileNotFoundError:
        return None
    return None


def _accepts_connections(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _lists_topics(bootstrap: str) -> bool:
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError as err:
        raise EnvironmentNotReadyError(
            f"confluent-kafka is not installed ({err}); run `{jarlib.SETUP_FIX}`"
        ) from err
    quiet = logging.getLogger("splitkeeper_tools.kafka_broker.librdkafka")
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": quiet}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=2)
    except Exception:  # KafkaException while the broker is still starting
        return False
    return True


def _terminate_child(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None and process.stop(proc.send_signal, lambda: proc.poll() is None, timeout_s):
        LOG.warning("Kafka broker pid %d ignored SIGTERM for %.0fs; sent SIGKILL", proc.pid, timeout_s)


def _terminate_pid(pid: int, timeout_s: float) -> None:
    if process.stop(lambda sig: os.kill(pid, sig), lambda: is_broker_process(pid), timeout_s):
        LOG.warning("Kafka broker pid %d ignored SIGTERM for %.0fs; sent SIGKILL", pid, timeout_s)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    """``scripts/kafka.sh`` entry point: start | stop | status."""
    parser = argparse.ArgumentParser(prog="bash scripts/kafka.sh", description="Local Kafka broker (KRaft).")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=None, help="broker port (default: see --preferred-port)")
    parser.add_argument(
        "--preferred-port",
        type=int,
        default=9092,
        help="without --port: the previous run's port if free, else this one if free, else any free port",
    )
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for start/stop")
    args = parser.parse_args(argv)
    port = args.port
    if port is None and args.action == "start":
        previous = read_state(args.data_dir)
        if previous is None and process.port_is_free(HOST, args.preferred_port):
            port = args.preferred_port
    broker = KafkaBroker(args.data_dir, port=port)
    try:
        if args.action == "start":
            if broker.status() is BrokerStatus.RUNNING:
                state = read_state(args.data_dir)
                assert state is not None
                print(f"already running: pid {state.pid}, bootstrap.servers={state.bootstrap_servers}")
                return 0
            broker.start(timeout_s=args.timeout)
            print(
                f"started: pid {broker.pid}, bootstrap.servers={broker.bootstrap_servers}, "
                f"log {broker.log_file}"
            )
        elif args.action == "stop":
            was = broker.status()
            broker.stop(timeout_s=args.timeout)
            print("stopped" if was is BrokerStatus.RUNNING else "not running")
        else:
            state = read_state(args.data_dir)
            if broker.status() is BrokerStatus.RUNNING and state is not None:
                print(
                    f"running: pid {state.pid}, bootstrap.servers={state.bootstrap_servers}, "
                    f"log {state.log_file}"
                )
            else:
                print(f"stopped (data dir {args.data_dir.resolve()})")
                return 3
    except (SourceError, EnvironmentNotReadyError) as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
