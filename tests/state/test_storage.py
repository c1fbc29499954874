"""Locations and object-store options (splitkeeper.state.storage), and the state and sink on a real
S3-compatible store when one is configured (``SPLITKEEPER_TEST_S3_URI``, marked ``s3``)."""

from __future__ import annotations

import os
import uuid

import pytest

from splitkeeper.state import storage


def test_s3a_is_mapped_to_s3_for_delta_rs_and_back_for_spark(tmp_path):
    assert storage.table_uri("s3a://bucket/lake/state/") == "s3://bucket/lake/state"
    assert storage.table_uri("s3://bucket/x") == "s3://bucket/x"
    assert storage.spark_uri("s3://bucket/x") == "s3a://bucket/x"
    assert storage.table_uri(f"file://{tmp_path}/t") == f"{tmp_path}/t"
    assert storage.table_uri("relative/t") == os.path.abspath("relative/t")
    assert storage.spark_uri(str(tmp_path)) == str(tmp_path)
    assert storage.join("s3://b/state", "checkpoints") == "s3://b/state/checkpoints"


def test_local_tables_get_no_options_and_s3_tables_get_the_environment_and_safe_commits():
    assert storage.storage_options("/tmp/state") is None
    env = {
        "SPLITKEEPER_S3A_ENDPOINT": "http://minio:9000",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # must not switch commits to unsafe
    }
    options = storage.storage_options("s3a://bucket/state", env)
    assert options == {
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
        "aws_conditional_put": "etag",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
    }
    explicit = storage.storage_options(
        "s3://b/t", {"AWS_ENDPOINT_URL": "https://s3.example", "AWS_REGION": "eu-west-1"}
    )
    assert explicit is not None and explicit["AWS_REGION"] == "eu-west-1" and "AWS_ALLOW_HTTP" not in explicit


S3_URI = os.environ.get("SPLITKEEPER_TEST_S3_URI", "")
needs_s3 = pytest.mark.skipif(
    not S3_URI,
    reason="no S3-compatible store configured: set SPLITKEEPER_TEST_S3_URI=s3://bucket/prefix and AWS_*",
)


@pytest.mark.s3
@needs_s3
def test_two_writer_processes_on_s3_one_lands_by_the_conditional_put():
    import multiprocessing

    import pyarrow as pa
    from deltalake import DeltaTable

    from . import workers

    uri = S3_URI.rstrip("/") + f"/fence-{uuid.uuid4().hex}"
    DeltaTable.create(
        uri, pa.schema([pa.field("writer", pa.string())]), storage_options=storage.storage_options(uri)
    )
    for version in (1, 2, 3):  # three rounds: the race is real each time
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(2)
        results = context.Queue()
        tags = (f"a{version}", f"b{version}")
        procs = [
            context.Process(
                target=workers.fenced_writer, args=(uri, version, version - 1 or None, tag, barrier, results)
            )
            for tag in tags
        ]
        for p in procs:
            p.start()
        outcomes = {tag: kind for tag, kind, _detail in (results.get(timeout=180) for _ in procs)}
        for p in procs:
            p.join(timeout=60)
        assert sorted(outcomes.values()) == ["committed", "conflict"], outcomes
    table = DeltaTable(uri, storage_options=storage.storage_options(uri))
    assert table.transaction_version("orders") == 3 and table.version() == 3
    assert table.to_pyarrow_table().num_rows == 3  # one row per round: no loser's row is visible


@pytest.mark.s3
@needs_s3
def test_state_store_sink_and_fence_on_an_s3_compatible_store(tmp_path):
    from splitkeeper.core.ports import RegionRun
    from splitkeeper.core.types import RegionOutcome
    from splitkeeper.errors import ConcurrentRunError
    from splitkeeper.runtime.sink import DeltaSink
    from splitkeeper.runtime.staging import write_staged
    from splitkeeper.state.checkpoints import DeltaStateStore, decision_for

    from .samples import global_

    base = S3_URI.rstrip("/") + f"/test-{uuid.uuid4().hex}"
    store = DeltaStateStore(base.replace("s3://", "s3a://") + "/state", "orders", "files:/in")
    store.write_plan(1, {0: [("s0", 0, 1)]})
    decision = decision_for(global_(1))
    store.write_decision(decision)
    staged = write_staged(
        [(0, 1, "v")],
        "s0",
        str(tmp_path / "epoch=1" / "region=0" / "attempt=a" / "part.parquet"),
        epoch=1,
        region=0,
    )
    sink = DeltaSink(base + "/sink", "orders")
    run = RegionRun(region_id=0, outcome=RegionOutcome.ACK, output=staged.path)
    assert sink.commit(1, [run], expected=None, attempt_id=decision.attempt_id).records == 1
    with pytest.raises(ConcurrentRunError):
        sink.commit(2, [], expected=None, attempt_id="stale")
    store.commit_checkpoint(decision)
    fresh = DeltaStateStore(base + "/state", "orders", "files:/in")
    assert fresh.latest_checkpoint() == global_(1) and fresh.decision(1, decision.attempt_id) == decision
    assert DeltaSink(base + "/sink", "orders", read_only=True).committed_attempt(1) == decision.attempt_id
