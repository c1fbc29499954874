"""The Google Cloud Storage and Azure Blob Storage emulators of the ``gs://`` and ``abfss://`` tests.

- :class:`FakeGcs`: fake-gcs-server (``bash scripts/setup.sh fake-gcs``: ``go install``, pinned in
  ``scripts/fake-gcs-server.version``, into ``.tools/fake-gcs-server/bin/``), plain HTTP, its
  objects under ``<workdir>/data``. A client reaches it with ``STORAGE_EMULATOR_HOST``.
- :class:`Azurite`: Azurite's Blob service (``bash scripts/setup.sh azurite``: ``npm ci`` of
  ``scripts/azurite/``, into ``.tools/azurite/``, run with ``node``), its blobs under
  ``<workdir>/data``, the development account ``devstoreaccount1``. A client reaches it with
  ``AZURE_STORAGE_USE_EMULATOR=true`` and ``AZURITE_BLOB_STORAGE_URL``.

Each listens on 127.0.0.1 on a free port, creates one bucket (container) at :meth:`start`, and
says in :meth:`env` the variables :func:`splitkeeper.delta.storage.filesystem` reads for it;
:meth:`location` is a URI in that bucket. Use them as context managers (stopped on exit); the
server's output is ``<workdir>/server.log``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from splitkeeper import process
from splitkeeper.delta.storage import AZURITE_ACCOUNT

LOG = logging.getLogger(__name__)

HOST = "127.0.0.1"
BUCKET = "drops"
LOG_FILE = "server.log"


def fake_gcs_binary() -> Path | None:
    """``.tools/fake-gcs-server/bin/fake-gcs-server``, None when it is not built."""
    from splitkeeper_tools.cluster.local import tools_root

    binary = tools_root() / "fake-gcs-server" / "bin" / "fake-gcs-server"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


def azurite_script() -> Path | None:
    """``.tools/azurite/node_modules/.bin/azurite-blob``, None when Azurite or ``node`` is missing."""
    from splitkeeper_tools.cluster.local import tools_root

    script = tools_root() / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return script if script.exists() and shutil.which("node") else None


class _Emulator:
    """One emulator process on ``127.0.0.1:<port>`` with its data in ``workdir/data``."""

    name = "emulator"

    def __init__(self, workdir: Path | str, prefix: str = "test") -> None:
        self.workdir = Path(workdir).resolve()
        self.prefix = prefix
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, f"{self.name} is not started"
        return f"http://{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.workdir / LOG_FILE

    def _argv(self, data: Path) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """The server answers HTTP (any status)."""
        try:
            with urllib.request.urlopen(self.url + self._probe_path, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except (urllib.error.URLError, OSError):
            return False

    _probe_path = "/"

    def _create_bucket(self) -> None:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def location(self, name: str) -> str:
        raise NotImplementedError

    def filesystem(self) -> tuple[Any, str]:
        """The product's file system of this store (:func:`~splitkeeper.delta.storage.filesystem`
        with :meth:`env`) and the bucket's path in it."""
        from splitkeeper.delta.storage import filesystem

        return filesystem(self.location(""), env=self.env())

    def start(self, timeout_s: float = 30.0) -> Self:
        """Launch it, wait until it answers, create the bucket. RuntimeError (with its log's tail)
        when it exits or does not answer within ``timeout_s``."""
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port = process.free_port(HOST)
        with open(self.log_file, "ab") as out:
            self._proc = subprocess.Popen(
                self._argv(data), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        try:
            while not self._ready():
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_file.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{self.name} did not start at {self.url}; {self.log_file}:\n{tail}")
                time.sleep(0.1)
            self._create_bucket()
        except BaseException:
            self.stop()
            raise
        LOG.info("%s at %s (data %s)", self.name, self.url, data)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        process.stop(proc.send_signal, lambda: proc.poll() is None, timeout_s)
        proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class FakeGcs(_Emulator):
    """fake-gcs-server (see the module doc)."""

    name = "fake-gcs-server"
    _probe_path = "/storage/v1/b"

    def _argv(self, data: Path) -> list[str]:
        binary = fake_gcs_binary()
        assert binary is not None, "bash scripts/setup.sh fake-gcs"
        (self.workdir / "seed").mkdir(exist_ok=True)  # no objects to load at start
        return [
            str(binary),
            "-scheme", "http",
            "-host", HOST,
            "-port", str(self.port),
            "-backend", "filesystem",
            "-filesystem-root", str(data),
            "-data", str(self.workdir / "seed"),
            "-log-level", "warn",
        ]  # fmt: skip

    def _create_bucket(self) -> None:
        import pyarrow.fs as pafs

        endpoint = f"{HOST}:{self.port}"  # a bucket's create needs a project: only here
        fs = pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=endpoint, project_id="test")
        fs.create_dir(BUCKET)

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.url}

    def location(self, name: str) -> str:
        return "/".join(p for p in (f"gs://{BUCKET}", self.prefix, name) if p)


class Azurite(_Emulator):
    """Azurite's Blob service (see the module doc)."""

    name = "Azurite"

    def _argv(self, data: Path) -> list[str]:
        script = azurite_script()
        assert script is not None, "bash scripts/setup.sh azurite"
        return [
            str(shutil.which("node")),
            str(script),
            "--blobHost", HOST,
            "--blobPort", str(self.port),
            "--location", str(data),
            "--silent",
            "--skipApiVersionCheck",  # pyarrow's Azure SDK may speak a newer API version
            "--disableTelemetry",
        ]  # fmt: skip

    def _create_bucket(self) -> None:
        fs, inner = self.filesystem()
        fs.create_dir(inner.split("/", 1)[0])

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.url}

    def location(self, name: str) -> str:
        root = f"abfss://{BUCKET}@{AZURITE_ACCOUNT}.dfs.core.windows.net"
        return "/".join(p for p in (root, self.prefix, name) if p)
