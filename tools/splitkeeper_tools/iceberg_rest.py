"""Apache Iceberg's REST catalog test server, for local runs and tests of ``sink.kind: iceberg``
with ``sink.catalog: {type: rest, uri: ...}``.

The server is Iceberg's own (``org.apache.iceberg.rest.RESTCatalogServer`` from
``iceberg-open-api``'s test fixtures, what the ``apache/iceberg-rest-fixture`` image runs),
started from the Maven artifacts ``bash scripts/setup.sh iceberg-rest`` put in
``.jars/iceberg-rest/`` (``jvm/iceberg-rest.xml``). It keeps its catalog in an SQLite file
(Iceberg's JDBC catalog) and the tables under a local warehouse folder; it writes the tables'
metadata files (Hadoop's local FileIO) and a client such as pyiceberg writes the data files
and manifests in the same folder (the table locations the server returns are ``file://``).

Layout of ``data_dir``: ``catalog.db`` (the catalog), ``warehouse/`` (the tables),
``server.log`` (the server's output).

The server listens on every interface (it has no host setting): for tests on one machine.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from splitkeeper import process
from splitkeeper.errors import EnvironmentNotReadyError, StateError
from splitkeeper.spark import jars as jarlib

LOG = logging.getLogger(__name__)

HOST = "127.0.0.1"
MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
LOG_FILE = "server.log"
_SERVER_JAR = "iceberg-open-api"


def classpath(root: Path | None = None) -> str:
    """The ``java -cp`` value running the server: ``<root>/iceberg-rest/*``.

    Raises EnvironmentNotReadyError (naming ``bash scripts/setup.sh iceberg-rest``) unless the
    folder holds the server's jar."""
    group = jarlib.JarGroup.ICEBERG_REST
    if jarlib.find_jar(jarlib.list_jars(group, root), _SERVER_JAR) is None:
        raise EnvironmentNotReadyError(
            f"no {_SERVER_JAR} jar in {jarlib.group_dir(group, root)}; run `{jarlib.ICEBERG_REST_SETUP_FIX}`"
        )
    return str(jarlib.group_dir(group, root) / "*")


class IcebergRestCatalog:
    """One REST catalog server on ``127.0.0.1:<port>`` (a free port unless given), its catalog and
    warehouse in ``data_dir``. :meth:`start` returns once ``GET /v1/config`` answers; use it as a
    context manager to stop it on exit."""

    def __init__(
        self, data_dir: Path | str, port: int | None = None, *, jars_dir: Path | None = None
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self._jars_dir = jars_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        """``http://127.0.0.1:<port>``: what ``sink.catalog.uri`` names."""
        if self.port is None:
            raise StateError(f"the Iceberg REST catalog in {self.data_dir} is not started; call start()")
        return f"http://{HOST}:{self.port}"

    @property
    def warehouse(self) -> Path:
        return self.data_dir / "warehouse"

    @property
    def log_file(self) -> Path:
        return self.data_dir / LOG_FILE

    def catalog_properties(self) -> dict[str, str]:
        """What ``pyiceberg.catalog.load_catalog`` (and ``sink.catalog``, with a name) take for it."""
        return {"type": "rest", "uri": self.uri}

    def start(self, timeout_s: float = 60.0) -> IcebergRestCatalog:
        """Launch the server and wait until ``GET /v1/config`` answers 200. Raises StateError when
        the process exits or does not answer within ``timeout_s`` (it is then stopped; see
        ``server.log``)."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        cp = classpath(self._jars_dir)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        if self.port is None:
            self.port = process.free_port(HOST)
        env = {
            **os.environ,
            "CATALOG_WAREHOUSE": self.warehouse.as_uri(),
            "CATALOG_URI": f"jdbc:sqlite:{self.data_dir / 'catalog.db'}",
            "CATALOG_REST_PORT": str(self.port),  # -> rest.port
        }
        cmd = [jarlib.java_executable(), "-Xmx256m", "-cp", cp, MAIN_CLASS]
        LOG.info("starting the Iceberg REST catalog on %s (data %s)", self.uri, self.data_dir)
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise StateError(
                    f"the Iceberg REST catalog exited with status {self._proc.returncode} before it "
                    f"answered; see {self.log_file}:\n{_tail(self.log_file)}"
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/v1/config", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = err
            time.sleep(0.2)
        raise StateError(
            f"the Iceberg REST catalog did not answer GET {self.uri}/v1/config within {timeout_s:.0f}s "
            f"({last}); see {self.log_file}:\n{_tail(self.log_file)}"
        )

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server, SIGKILL after ``timeout_s``; a no-op when it does not run."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if process.stop(proc.send_signal, lambda: proc.poll() is None, timeout_s):
            LOG.warning(
                "Iceberg REST catalog pid %d ignored SIGTERM for %.0fs; sent SIGKILL", proc.pid, timeout_s
            )

    def kill(self, timeout_s: float = 20.0) -> None:
        """SIGKILL the server (a crash, for fault tests); :meth:`start` starts it again on the same
        catalog, warehouse and port."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def __enter__(self) -> IcebergRestCatalog:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
