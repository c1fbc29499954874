"""Locations and object-store options (splitkeeper.delta.storage), and the state and sink on a real
S3-compatible store is the local cluster's (tests/cluster: two writers racing on it, the state store,
sink and fence on it)."""

from __future__ import annotations

import os

from splitkeeper.delta import storage


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
        "max_retries": "10",  # transient errors (503 SlowDown, resets) retried with backoff
        "retry_timeout": "120s",
        "AWS_S3_ALLOW_UNSAFE_RENAME": "false",
    }
    explicit = storage.storage_options(
        "s3://b/t", {"AWS_ENDPOINT_URL": "https://s3.example", "AWS_REGION": "eu-west-1"}
    )
    assert explicit is not None and explicit["AWS_REGION"] == "eu-west-1" and "AWS_ALLOW_HTTP" not in explicit
