"""``chaos --store s3``: the state and the sink on the project's local S3 server, through a fault proxy.

:class:`ChaosStore` starts versitygw (the object store of the local cluster, built by
``scripts/setup.sh cluster``) on a free port of 127.0.0.1, with keys of its own, in
``<workdir>/s3``, creates the bucket, and puts a
:class:`~splitkeeper_tools.fault_proxy.FaultProxy` in front of it whose
:class:`~splitkeeper_tools.fault_proxy.FaultSchedule` is drawn from ``--seed``: each request of a
driver (delta-rs, pyarrow, the store probe) meets, at ``--store-fault-rate`` each, a 503 SlowDown,
a reset connection (no answer) or an answer :data:`DELAY_S` late. The drivers get the proxy's
address (:meth:`ChaosStore.driver_env`); the chaos command itself, which verifies, reads the store
directly (:meth:`ChaosStore.direct_env`), so the verdict does not depend on the faults.

What the drivers survive is their storage clients' retries (:mod:`splitkeeper.delta.storage`
rule 4) and splitkeeper's own (counted in ``splitkeeper_store_retries_total``). Half the resets
(:data:`RESET_AFTER`) come after the request reached the store: done, its answer lost. On a Delta
commit (a put with ``If-None-Match``) that is the lost answer the fence re-reads the table for
(``splitkeeper.delta.fence`` step 5: landed, the commit stands; not landed, ``[STATE_ERROR]``
and the next run's recovery settles the epoch); the result counts them apart
(:meth:`~splitkeeper_tools.fault_proxy.FaultProxy.conditional_resets`). Drivers that fail on
the store are found in their logs by :func:`store_failures` and reported.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from splitkeeper_tools.chaos.processes import RunOutcome, say
from splitkeeper_tools.fault_proxy import FaultProxy, FaultSchedule

STORES = ("local", "s3")
BUCKET = "chaos"
REGION = "us-east-1"
DEFAULT_FAULT_RATE = 0.01
MAX_FAULT_RATE = 0.1  # of each kind: a driver must still get most of its requests through
DELAY_S = 0.5  # well within every client timeout: a slow answer, not a lost one
RESET_AFTER = 0.5  # of the resets: after the store did the request (its answer lost)
#: What a driver that failed because of the store wrote last (delta-rs, pyarrow, the probe).
STORE_ERROR_MARKS = (
    "Generic S3 error",
    "SlowDown",
    "SLOW_DOWN",
    "injected by the fault proxy",
    "NETWORK_CONNECTION",
    "could not be probed",
    "connection error",
    "Connection reset",
)


def versitygw_binary() -> Path | None:
    """The versitygw the cluster setup built (``.tools/versitygw/bin/versitygw``), None when absent."""
    from splitkeeper_tools.cluster.local import tools_root

    binary = tools_root() / "versitygw" / "bin" / "versitygw"
    return binary if binary.is_file() and os.access(binary, os.X_OK) else None


class ChaosStore:
    """versitygw plus the fault proxy (see the module doc); :meth:`start`, then :meth:`stop`."""

    def __init__(
        self, workdir: Path, seed: int, fault_rate: float, prefix: str, options: Sequence[str] = ()
    ) -> None:
        self.workdir = workdir
        self.options = tuple(options)  # more versitygw options (its bucket events: versitygw_launch)
        self.fault_rate = fault_rate
        self.prefix = prefix
        self.access_key = "chaos" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.schedule = FaultSchedule(
            seed=seed,
            slowdown=fault_rate,
            reset=fault_rate,
            delay=fault_rate,
            delay_s=DELAY_S,
            reset_after=RESET_AFTER,
        )
        self.endpoint = ""
        self.proxy: FaultProxy | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def location(self, name: str) -> str:
        return f"s3://{BUCKET}/{self.prefix}/{name}"

    def start(self) -> None:
        from splitkeeper_tools.cluster.local import versitygw_launch
        from splitkeeper_tools.cluster.s3 import S3Client, S3Error
        from splitkeeper_tools.kafka_broker import free_port

        assert versitygw_binary() is not None, "checked by the command before anything started"
        data = self.workdir / "s3"
        data.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        argv, env = versitygw_launch(
            f"127.0.0.1:{port}", data, self.access_key, self.secret_key, self.options
        )
        log = (self.workdir / "logs" / "versitygw.log").open("ab")
        self._proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        client = S3Client(self.endpoint, self.access_key, self.secret_key, REGION)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_buckets()
                break
            except (OSError, S3Error):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"versitygw did not start at {self.endpoint}; see {self.workdir / 'logs'}"
                    ) from None
                time.sleep(0.2)
        client.create_bucket(BUCKET)
        self.proxy = FaultProxy(self.endpoint, fault=self.schedule, keep_seen=False).start()
        say(
            f"object store versitygw at {self.endpoint} (bucket {BUCKET}); the drivers reach it through "
            f"the fault proxy {self.proxy.url}: 503 SlowDown, reset connections and {DELAY_S:g}s delays, "
            f"{self.fault_rate:.1%} of the requests each"
        )

    def _env(self, endpoint: str) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def driver_env(self) -> dict[str, str]:
        """The environment a driver gets: the store through the fault proxy."""
        assert self.proxy is not None
        return self._env(self.proxy.url)

    def store_env(self) -> dict[str, str]:
        """The store itself (not the proxy), for the chaos command's own reads."""
        return self._env(self.endpoint)

    def direct_env(self) -> dict[str, str]:
        """The environment of the verification: the store itself, and S3A for Spark's reads of the sink."""
        from splitkeeper_tools.cluster.local import s3a_conf

        conf = s3a_conf(self.endpoint, self.access_key, self.secret_key)
        return {
            **self._env(self.endpoint),
            "SPLITKEEPER_SPARK_CONF": ";".join(f"{k}={v}" for k, v in conf.items()),
        }

    def counts(self) -> dict[str, int]:
        return {"requests": 0} if self.proxy is None else self.proxy.counts()

    def conditional_resets(self) -> dict[str, int]:
        return {} if self.proxy is None else self.proxy.conditional_resets()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def driver_retries(state_path: str, env: dict[str, str] | None = None) -> tuple[str, dict[str, int]] | None:
    """What a driver's metrics file (``<state>/metrics.prom``, read through ``env``'s store, not the
    proxy) says of its retries: ``(the file's text, splitkeeper_store_retries_total per operation)``;
    None when no file was written."""
    from prometheus_client.parser import text_string_to_metric_families

    from splitkeeper.app.metrics import metrics_path
    from splitkeeper.delta.storage import filesystem

    fs, inner = filesystem(metrics_path(state_path), env)
    if fs.get_file_info(inner).type.name != "File":
        return None
    with fs.open_input_stream(inner) as handle:
        text = bytes(handle.read()).decode("utf-8")
    found: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "splitkeeper_store_retries_total":
                found[sample.labels["operation"]] = int(sample.value)
    return text, found


def store_failures(runs: Sequence[RunOutcome]) -> list[dict[str, Any]]:
    """The driver runs that ended in an error of the store (not SIGKILLed, not refused by the
    lease): each with the last line of its log that names the store error."""
    failed = []
    for run in runs:
        if run.returncode in (0, -9, None):
            continue
        lines = [ln for ln in run.stderr.splitlines() if any(m in ln for m in STORE_ERROR_MARKS)]
        if lines:
            failed.append({"run": run.label, "exit": run.returncode, "error": lines[-1].strip()[:300]})
    return failed
