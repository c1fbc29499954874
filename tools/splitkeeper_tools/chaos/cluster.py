"""``chaos --profile cluster``: every driver on a Spark standalone master with 2 workers.

:class:`ChaosCluster` starts only the Spark part of the project's local cluster
(:meth:`~splitkeeper_tools.cluster.local.LocalCluster.up_spark`: master and 2 workers, Spark
authentication on, loopback, in ``<workdir>/cluster``), and :meth:`ChaosCluster.down` stops them
and every executor (the cluster's mark). Each driver gets the cluster's client settings
(:meth:`ChaosCluster.driver_env`, not echoed: they hold the authentication secret) plus three of
the chaos run's own:

- ``spark.cores.max`` :data:`APP_CORES` on workers of :data:`WORKER_CORES` cores each: a driver
  takes half the cluster (one 1-core executor on each worker), so a second driver running at the
  same time (the takeover of a SIGSTOPped one, whose executors stay registered) gets executors too;
- ``spark.scheduler.minRegisteredResourcesRatio`` 1: a driver's Spark context waits (at most
  Spark's 30 s) for both its executors before the first epoch's region jobs, so a region timeout
  does not count an executor's start;
- ``spark.executorEnv.SPLITKEEPER_CHAOS_DRIVER``: the driver's tag
  (:data:`~splitkeeper_tools.chaos.processes.DRIVER_TAG_ENV`) on its executors and their Python
  workers, by which the worker SIGKILL finds the worker running the slow region's task;
- ``spark.executorEnv.AWS_*``: the object store (through the fault proxy, as the drivers reach it):
  the region tasks write their staged files there. Each worker runs in a mount namespace of its own
  with a private /tmp (:func:`~splitkeeper_tools.cluster.local.worker_isolation`), so the executors
  share nothing with the drivers but the store, the broker and the network.

:meth:`ChaosCluster.evidence` says where the drivers ran: the master's URL and the applications
and executors the workers' work folders hold (one folder per executor each driver got).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from splitkeeper_tools.chaos.processes import DRIVER_TAG_ENV, say

WORKER_CORES = 2
WORKER_MEMORY = "2g"  # two 768m executors (the cluster's executor memory) fit on each worker
APP_CORES = 2


def spark_unavailable() -> str | None:
    """Why a Spark standalone master cannot be started here (None: it can): pyspark's Spark
    distribution (``bin/spark-class``) missing."""
    from splitkeeper_tools.cluster.local import spark_home

    try:
        spark_class = spark_home() / "bin" / "spark-class"
    except Exception as err:  # noqa: BLE001 - pyspark not installed: the reason is the answer
        return f"pyspark's Spark distribution cannot be found ({err})"
    return None if spark_class.is_file() else f"{spark_class} is missing"


class ChaosCluster:
    """The Spark master and 2 workers of one chaos run (see the module doc)."""

    def __init__(self, workdir: Path) -> None:
        from splitkeeper_tools.cluster.local import LocalCluster

        self.cluster = LocalCluster(workdir / "cluster")
        self.master_url = ""
        self._env: dict[str, str] = {}

    def start(self) -> None:
        self._env = self.cluster.up_spark(
            worker_cores=WORKER_CORES, worker_memory=WORKER_MEMORY, say=lambda m: say(f"cluster: {m}")
        )
        self.master_url = self.cluster.spark_master_url()
        say(
            f"every driver runs on the Spark standalone master {self.master_url} (2 workers of "
            f"{WORKER_CORES} cores, {APP_CORES} cores a driver; work folders {self.cluster.layout.spark})"
        )

    def driver_env(self, tag: str, store_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of the driver tagged ``tag``: the cluster's client settings and the chaos
        run's (see the module doc); ``store_env``: the object store's ``AWS_*`` variables, which its
        executors get too (they write the staged files there)."""
        from splitkeeper_tools.cluster.local import executor_store_env

        assert self._env, "start() first"
        extra = {
            "spark.cores.max": str(APP_CORES),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            f"spark.executorEnv.{DRIVER_TAG_ENV}": tag,
            **executor_store_env(store_env or {}),
        }
        conf = ";".join([self._env["SPLITKEEPER_SPARK_CONF"], *(f"{k}={v}" for k, v in extra.items())])
        return {**self._env, "SPLITKEEPER_SPARK_CONF": conf}

    def evidence(self) -> dict[str, Any]:
        """Where the drivers ran: the master, and per worker the applications (drivers) whose
        executors it ran (``<work dir>/app-*/<executor id>``)."""
        spark = self.cluster.layout.spark
        by_worker: dict[str, dict[str, int]] = {}
        apps: set[str] = set()
        for i in (1, 2):
            found = sorted(p for p in (spark / f"worker-{i}").glob("app-*") if p.is_dir())
            apps.update(p.name for p in found)
            executors = sum(1 for p in found for e in p.iterdir() if e.is_dir())
            by_worker[f"spark-worker-{i}"] = {"applications": len(found), "executors": executors}
        return {
            "master": self.master_url,
            "workers": by_worker,
            "applications": len(apps),
            "work_folder": str(spark),
        }

    def stop(self) -> None:
        """Stop the master, the workers and any executor left (the cluster's ``down``)."""
        if self.cluster.state() is not None:
            self.cluster.down(say=lambda m: say(f"cluster: {m}"))
