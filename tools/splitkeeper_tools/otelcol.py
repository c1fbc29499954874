"""A local OpenTelemetry Collector: what a pipeline's ``metrics.otlp_endpoint`` sends to, for tests
and local use.

The binary is ``scripts/otelcol`` (a Go module: the OTLP receiver and the contrib Prometheus
exporter, versions pinned in its ``go.mod``/``go.sum``), built by ``scripts/setup.sh`` into
``.tools/otelcol/bin/otelcol`` (``$SPLITKEEPER_TOOLS_DIR`` overrides ``.tools``).
:class:`LocalCollector` starts it on free loopback ports: OTLP/HTTP in, Prometheus text out
(``/metrics``), what a real Prometheus scrapes.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from splitkeeper import process, resources
from splitkeeper.errors import EnvironmentNotReadyError

__all__ = ["HOST", "LocalCollector", "collector_binary"]

HOST = "127.0.0.1"
ENV_TOOLS_DIR = "SPLITKEEPER_TOOLS_DIR"
SETUP_FIX = "bash scripts/setup.sh otelcol"

_CONFIG = """\
receivers:
  otlp:
    protocols:
      http:
        endpoint: {host}:{otlp}
exporters:
  prometheus:
    endpoint: {host}:{prometheus}
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [prometheus]
"""


def collector_binary() -> Path:
    """``.tools/otelcol/bin/otelcol``, or EnvironmentNotReadyError naming the setup command."""
    override = os.environ.get(ENV_TOOLS_DIR, "").strip()
    root = Path(override).expanduser() if override else resources.require_checkout("the collector") / ".tools"
    binary = root / "otelcol" / "bin" / "otelcol"
    if not binary.is_file():
        raise EnvironmentNotReadyError(
            f"the OpenTelemetry Collector is not built ({binary} missing); run `{SETUP_FIX}`",
            folder=str(binary.parent),
        )
    return binary


class LocalCollector:
    """One collector process on free loopback ports; a context manager (stopped on exit).

    ``otlp_endpoint`` is what ``metrics.otlp_endpoint`` takes; :meth:`scrape` reads the
    Prometheus text its exporter serves.
    """

    def __init__(self, work_dir: str | os.PathLike[str], binary: Path | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.binary = binary or collector_binary()
        self.otlp_port, self.prometheus_port = process.free_ports(HOST, 2)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def otlp_endpoint(self) -> str:
        return f"http://{HOST}:{self.otlp_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{HOST}:{self.prometheus_port}/metrics"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "otelcol.log"

    def start(self, timeout_s: float = 30.0) -> LocalCollector:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "otelcol.yaml"
        config.write_text(
            _CONFIG.format(host=HOST, otlp=self.otlp_port, prometheus=self.prometheus_port), encoding="utf-8"
        )
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                [str(self.binary), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while True:  # ready once both ports answer
            if self._proc.poll() is not None:
                raise EnvironmentNotReadyError(
                    f"the collector exited with {self._proc.returncode}: {self._tail()}",
                    folder=str(self.work_dir),
                )
            if not process.port_is_free(HOST, self.otlp_port) and self._answers():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise EnvironmentNotReadyError(
                    f"the collector did not listen within {timeout_s:g}s: {self._tail()}",
                    folder=str(self.work_dir),
                )
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            self.scrape()
        except (urllib.error.URLError, OSError):
            return False
        return True

    def _tail(self) -> str:
        try:
            return " | ".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-5:])
        except OSError:
            return "(no log)"

    def scrape(self) -> str:
        """The Prometheus text the collector serves now."""
        with urllib.request.urlopen(self.prometheus_url, timeout=5) as response:
            return bytes(response.read()).decode("utf-8")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def __enter__(self) -> LocalCollector:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
