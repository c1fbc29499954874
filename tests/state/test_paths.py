"""Paths are paths: spaces, non-ASCII characters, ``~`` and relative paths in the state, sink,
staging and source locations, end to end on a small files pipeline (the real driver, store and
sink, without Spark), and the S3 URIs built from such locations."""

from __future__ import annotations

from pathlib import Path

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta import storage
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.errors import InvalidParameterError

from .samples import LocalPipeline, assert_sink_is_input


@pytest.mark.parametrize("folder", ["st ate", "état", "a b/ü ß 数据"])
def test_a_pipeline_under_a_folder_with_spaces_or_non_ascii_runs_restarts_and_commits_every_line(
    tmp_path, folder
):
    pipeline = LocalPipeline(tmp_path / folder)  # state, sink, staging and source all under it
    pipeline.write_input(files=2, lines=30)
    pipeline.run(1)  # the first epoch: before the fix, the next restore read /st%20ate/...
    again = pipeline.run()  # a restart: restore, then every epoch to the end
    assert again.state.checkpoint_ids()
    assert pipeline.driver(read_only=True).state.latest_checkpoint() is not None
    assert_sink_is_input(pipeline)


def test_a_pipeline_under_a_relative_path_runs_restarts_and_commits_every_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pipeline = LocalPipeline(Path("rel ative"))
    pipeline.write_input(files=2, lines=30)
    pipeline.run(1)
    pipeline.run()
    assert not pipeline.root.is_absolute()
    assert_sink_is_input(pipeline)


def test_home_paths_in_the_config_and_the_store_are_the_home_folder(tmp_path, monkeypatch):
    home = tmp_path / "hö me"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    config = config_from_mapping(
        {
            "name": "orders",
            "parallelism": 2,
            "source": {"kind": "files", "path": "~/in put", "format": "lines"},
            "state": {"path": "~/st ate"},
            "sink": {"path": "~/sí nk"},
            "staging": {"path": "~/stag ing"},
        },
        base_dir=tmp_path,
    )
    assert config.source.path == str(home / "in put")
    assert (config.state.path, config.sink.path, config.staging.path) == (
        str(home / "st ate"),
        str(home / "sí nk"),
        str(home / "stag ing"),
    )
    store = DeltaStateStore("~/st ate", "orders", "files:/in")  # a caller without the config
    assert store.root == str(home / "st ate")
    assert (home / "st ate" / "checkpoints" / "_delta_log").is_dir()
    assert not Path("~").exists()


@pytest.mark.parametrize(
    ("location", "bucket_key"),
    [
        ("s3a://bucket/st ate/checkpoints", "bucket/st ate/checkpoints"),
        ("s3://bucket/état/数据", "bucket/état/数据"),
        ("s3://bucket/100%25", "bucket/100%25"),  # a key a user wrote is never decoded
    ],
)
def test_s3_locations_keep_their_keys_as_written(location, bucket_key):
    uri = storage.table_uri(location)
    assert uri == "s3://" + bucket_key
    assert storage.spark_uri(location) == "s3a://" + bucket_key
    assert storage.join(uri, "_delta_log") == f"s3://{bucket_key}/_delta_log"
    assert storage.filesystem(location, env={})[1] == bucket_key


@pytest.mark.parametrize(
    ("reported", "location"),
    [
        ("file:///tmp/st%20ate/%C3%A9tat/", "/tmp/st ate/état"),
        ("s3://bucket/st%20ate/%E6%95%B0/", "s3://bucket/st ate/数"),
        ("/plain/100%25", "/plain/100%25"),
    ],
)
def test_a_location_delta_rs_reports_is_decoded_once(reported, location):
    assert storage.delta_location(reported) == location
    if location.startswith("/tmp"):
        assert storage.filesystem(storage.delta_location(reported))[1] == location


def test_home_and_relative_local_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    monkeypatch.chdir(tmp_path)
    assert storage.table_uri("~/st ate") == str(tmp_path / "h" / "st ate")
    assert storage.table_uri("rel/é") == str(tmp_path / "rel" / "é")
    assert storage.table_uri("file:///a%20b/%C3%A9") == "/a b/é"


def _options(fs):
    """The options a pyarrow file system was built with (what it pickles)."""
    return fs.__reduce__()[1][0]


@pytest.mark.parametrize(
    ("env", "scheme", "endpoint"),
    [
        ({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:4443"}, "http", "127.0.0.1:4443"),
        ({"STORAGE_EMULATOR_HOST": "localhost:4443/"}, "http", "localhost:4443"),  # no scheme: http
        ({"CLOUD_STORAGE_EMULATOR_ENDPOINT": "https://gcs.test:9"}, "https", "gcs.test:9"),
    ],
)
def test_a_gcs_emulator_in_the_environment_is_reached_without_credentials(env, scheme, endpoint):
    fs, path = storage.filesystem("gs://bucket/in/", env={**env, "GOOGLE_CLOUD_PROJECT": "p"})
    options = _options(fs)
    assert path == "bucket/in"
    assert (options["anonymous"], options["scheme"], options["endpoint_override"]) == (True, scheme, endpoint)
    assert options["project_id"] == "p"
    assert _options(storage.filesystem("gs://bucket/in", env={})[0])["anonymous"] is False


def test_a_check_of_a_gcs_store_gives_up_in_seconds_and_a_read_rides_out_two_minutes():
    check = _options(storage.filesystem("gs://b/in", env={}, attempts=2)[0])["retry_time_limit"]
    read = _options(storage.filesystem("gs://b/in", env={})[0])["retry_time_limit"]
    assert (check.total_seconds(), read.total_seconds()) == (storage.GCS_CHECK_RETRY_S, storage.GCS_RETRY_S)


@pytest.mark.parametrize(
    ("location", "env", "account", "path"),
    [
        ("abfss://drops@acct.dfs.core.windows.net/in/", {}, "acct", "drops/in"),
        ("abfss://drops/in", {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}, "acct", "drops/in"),
        ("abfss://drops@acct.dfs.core.windows.net", {"AZURE_STORAGE_ACCOUNT_NAME": "other"}, "acct", "drops"),
    ],
)
def test_an_abfss_location_names_its_container_and_account(location, env, account, path):
    fs, inner = storage.filesystem(location, env={**env, "AZURE_STORAGE_ACCOUNT_KEY": "a2V5"})
    options = _options(fs)
    assert (inner, options["account_name"], options["account_key"]) == (path, account, "a2V5")
    assert options["blob_storage_authority"] == ".blob.core.windows.net"  # Azure itself, https


def test_azurite_in_the_environment_is_its_url_with_the_development_account_and_key():
    env = {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": "http://127.0.0.1:10123"}
    options = _options(storage.filesystem("abfss://drops/in", env=env)[0])
    assert (options["account_name"], options["account_key"]) == (storage.AZURITE_ACCOUNT, storage.AZURITE_KEY)
    for service in ("blob", "dfs"):
        assert options[f"{service}_storage_authority"] == "127.0.0.1:10123"
        assert options[f"{service}_storage_scheme"] == "http"


@pytest.mark.parametrize(
    ("location", "env", "name"),
    [
        ("abfss://drops/in", {}, "location"),  # no account anywhere
        ("gs://bucket/in", {"STORAGE_EMULATOR_HOST": "ftp://127.0.0.1:1"}, "STORAGE_EMULATOR_HOST"),
        (
            "abfss://drops/in",
            {"AZURE_STORAGE_USE_EMULATOR": "1", "AZURITE_BLOB_STORAGE_URL": "file:///x"},
            "AZURITE_BLOB_STORAGE_URL",
        ),
    ],
)
def test_a_store_location_or_endpoint_that_cannot_be_reached_is_refused_naming_it(location, env, name):
    with pytest.raises(InvalidParameterError) as err:
        storage.filesystem(location, env=env)
    assert err.value.name == name and str(err.value).startswith(f"[INVALID_PARAMETER] {name}=")
