"""The cluster profile shares no disk between a driver and its executors (issue 38, item 5).

The Spark part of the local cluster (``LocalCluster.up_spark``: master and 2 workers) starts each
worker in a mount namespace of its own with a private /tmp
(:func:`~splitkeeper_tools.cluster.local.worker_isolation`). A Kafka pipeline whose state and sink
are on the object store (versitygw) runs there as a ``splitkeeper run`` process: its region tasks
write the staged files to the store (the default ``<state>/_staging``), so the driver and the
executors share nothing but the store, the broker and the network; the sink then holds every message
once, by content. The same pipeline with a local staging folder is refused before any task runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from splitkeeper.sinks.delta.read import read_sink
from tests.runtime.helpers import splitkeeper_subprocess
from tests.runtime.test_kafka_source import create_topic, messages, produce

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kafka]


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[Any]:
    from splitkeeper_tools.cluster.local import LocalCluster

    cluster = LocalCluster(tmp_path / "cluster")
    cluster.up_spark(worker_cores=1, worker_memory="1g", say=lambda _m: None)
    try:
        yield cluster
    finally:
        cluster.down(say=lambda _m: None)


def _driver_env(cluster: Any, store: Any) -> dict[str, str]:
    """What a driver on the cluster gets: its client settings, and the store for its executors."""
    from splitkeeper_tools.cluster.local import executor_store_env

    env = cluster.spark_client_env()
    extra = executor_store_env(store.store_env())
    env["SPLITKEEPER_SPARK_CONF"] = ";".join(
        [env["SPLITKEEPER_SPARK_CONF"], *(f"{k}={v}" for k, v in extra.items())]
    )
    return {**env, **store.store_env()}


def test_a_pipeline_on_workers_with_a_private_tmp_stages_on_the_store_and_refuses_a_local_folder(
    spark_cluster: Any, s3_store: Any, kafka_broker: Any, tmp_path: Path
) -> None:
    workers = [spark_cluster.state().services[f"spark-worker-{i}"]["pid"] for i in (1, 2)]
    mark = tmp_path / "driver-only"
    mark.write_text("the driver's /tmp")
    for pid in workers:  # each worker's /tmp is its own: the driver's files are not there
        seen = Path(f"/proc/{pid}/root") / str(mark).lstrip("/")
        assert not seen.exists(), f"spark worker {pid} sees {mark}"
        assert os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 2)
    produced = {p: messages(p, 40) for p in (0, 1)}
    produce(bootstrap, topic, produced)
    mapping = {
        "name": "shared-nothing",
        "parallelism": 2,
        "source": {
            "kind": "kafka",
            "bootstrap_servers": bootstrap,
            "topics": [topic],
            "starting": "earliest",
        },
        "backlog": {"backlog_epoch_records": 30, "normal_epoch_records": 30},
        "checkpoint": {"region_timeout_s": 120},
        "state": {"path": s3_store.location("shared-nothing/state")},
        "sink": {"path": s3_store.location("shared-nothing/sink")},
    }
    env = _driver_env(spark_cluster, s3_store)

    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({**mapping, "staging": {"path": str(tmp_path / "staging")}}))
    refused = splitkeeper_subprocess(["run", "--config", str(local), "--until-caught-up"], **env)
    assert refused.returncode != 0
    assert "[CONFIG_ERROR] staging.path=" in refused.stderr and "share no disk" in refused.stderr
    assert not (tmp_path / "staging").exists()  # no task ran

    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(mapping))
    done = splitkeeper_subprocess(["run", "--config", str(config), "--until-caught-up"], timeout_s=600, **env)
    assert done.returncode == 0, done.stderr[-4000:]
    values = sorted(
        v.decode() for v in read_sink(mapping["sink"]["path"], ["value"]).column("value").to_pylist()
    )
    assert values == sorted(m for items in produced.values() for m in items)  # every message once
    assert list((spark_cluster.layout.spark).glob("worker-*/app-*")), "the executors ran on the workers"
