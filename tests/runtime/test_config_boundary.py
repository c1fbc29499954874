"""The pipeline file as a security boundary (issue 36, part A): a run's overrides are data, no
secret is echoed in a config error, only marked callables are named, the Kafka client settings
splitkeeper owns stay its own, a dead-letter table is placed like every other location, and the
read-only commands need no transform.

Each case is the issue's probe, through the loader, the CLI (rc and message) or the real broker.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.cli import main
from splitkeeper.config.settings import load_config
from splitkeeper.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SECRET = "adv-s3cr3t-7f1c2e"
HEAD = "name: orders\n"
SOURCE = "source: {kind: files, path: incoming}\n"
PLACES = "state: {path: state}\nsink: {path: sink}\n"
KAFKA = "source: {kind: kafka, bootstrap_servers: '127.0.0.1:9092', topics: [orders]"


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    (tmp_path / "incoming").mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    return info.value


def kafka(client: str) -> str:
    return HEAD + KAFKA + f", client: {client}}}\n" + PLACES


def shown(error: ConfigError) -> str:
    """Everything of an error a user or a log could see."""
    return f"{error} {error.message} {error.params} {error.args}"


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on loopback that records every request line it gets."""
    seen: list[str] = []

    class Record(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server hook
            seen.append(f"POST {self.path}")
            self.send_response(200)
            self.end_headers()

        do_GET = do_POST  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Record)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------- overrides are data


def test_the_pipeline_json_probe_sends_nothing_and_prints_no_secret(
    tmp_path: Path, listener: tuple[str, list[str]]
) -> None:
    """Issue 36 unsafe 1: ``--pipeline-json`` with ``${ADV_SECRET}`` in metrics.otlp_endpoint sent
    ``POST /<the secret>/v1/metrics`` to a listener."""
    url, seen = listener
    (tmp_path / "incoming").mkdir()
    (tmp_path / "incoming" / "a.txt").write_text("one\ntwo\n")
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    overrides = '{"metrics": {"otlp_endpoint": "' + url + '/${ADV_SECRET}"}}'
    done = subprocess.run(
        [sys.executable, "-m", "splitkeeper", "run", "--config", str(path), "--epochs", "1"]
        + ["--pipeline-json", overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "ADV_SECRET": SECRET, "PYTHONPATH": str(REPO)},
    )
    assert seen == []
    assert SECRET not in done.stdout + done.stderr
    assert done.returncode == 2, done.stderr
    assert "[CONFIG_ERROR] pipeline.metrics.otlp_endpoint" in done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "overrides",
    [
        {"lease": {"ttl_s": "${ADV_SECRET}"}},
        {"checkpoint": {"on_split_failure": "${ADV_SECRET}"}},
        {"backlog": {"normal_epoch_records": ["${ADV_SECRET}"]}},
        {"lease": {"ttl_s": "$${ADV_SECRET}"}},
    ],
)
def test_an_override_is_never_expanded_and_its_reference_is_refused_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any]
) -> None:
    monkeypatch.setenv("ADV_SECRET", SECRET)
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    error = refused(path, overrides=overrides)
    assert SECRET not in shown(error)
    assert "${NAME} is not expanded in a run's overrides" in error.message
    assert error.params["key"].startswith("pipeline.")
    assert str(path) in error.message


def test_run_epochs_overrides_are_data_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from splitkeeper.airflow import tasks

    monkeypatch.setenv("ADV_SECRET", SECRET)
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    with pytest.raises(ConfigError) as info:
        tasks.run_epochs(str(path), epochs=1, pipeline={"lease": {"ttl_s": "${ADV_SECRET}"}})
    assert SECRET not in shown(info.value) and "is not expanded" in info.value.message
    with pytest.raises(ConfigError) as info:
        tasks.run_epochs(str(path), epochs=1, pipeline={"metrics": {"otlp_endpoint": "http://evil:4318"}})
    assert info.value.params["key"] == "pipeline.metrics.otlp_endpoint"
    assert not (tmp_path / "state").exists()


def test_the_file_itself_is_still_expanded_and_its_environment_values_are_not_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADV_SECRET", SECRET)
    monkeypatch.setenv("COLLECTOR", "http://collector:4318")
    path = write(tmp_path, HEAD + SOURCE + PLACES + "metrics: {otlp_endpoint: '${COLLECTOR}'}\n")
    assert load_config(path).metrics.otlp_endpoint == "http://collector:4318"
    for text in ("lease: {ttl_s: '${ADV_SECRET}'}\n", "metrics: {otlp_endpoint: 'ftp://x/${ADV_SECRET}'}\n"):
        error = refused(write(tmp_path, HEAD + SOURCE + PLACES + text))
        assert SECRET not in shown(error), text
        assert "${ADV_SECRET}" in error.message  # the reference as written, not its value


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"metrics": {"otlp_endpoint": "http://elsewhere:4318"}}, "pipeline.metrics.otlp_endpoint"),
        (
            {"notifications": {"on_failure": "splitkeeper.transforms:identity"}},
            "pipeline.notifications.on_failure",
        ),
    ],
)
def test_an_endpoint_or_a_callable_is_overridden_only_where_the_file_allows_it(
    tmp_path: Path, overrides: dict[str, Any], key: str
) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    error = refused(path, overrides=overrides)
    assert error.params["key"] == key
    assert (
        f"{key} is not allowed: only the pipeline file sets {key.removeprefix('pipeline.')}" in error.message
    )
    assert f"overrides: {{allow: [{key.removeprefix('pipeline.')}]}}" in error.message
    assert "elsewhere" not in error.message  # the value is not echoed either
    # an override may still tune the same sections
    config = load_config(path, overrides={"lease": {"ttl_s": 7}, "checkpoint": {"max_failure_ratio": 0.2}})
    assert (config.lease.ttl_s, config.checkpoint.max_failure_ratio) == (7.0, 0.2)


def test_the_file_may_allow_an_override_of_the_endpoint(tmp_path: Path) -> None:
    text = HEAD + SOURCE + PLACES + "overrides: {allow: [metrics.otlp_endpoint]}\n"
    path = write(tmp_path, text)
    config = load_config(path, overrides={"metrics": {"otlp_endpoint": "http://collector-b:4318"}})
    assert config.metrics.otlp_endpoint == "http://collector-b:4318"
    assert load_config(path).metrics.otlp_endpoint is None
    # the override itself may not name a variable, nor widen what the file allows
    assert (
        "is not expanded"
        in refused(path, overrides={"metrics": {"otlp_endpoint": "http://x/${HOME}"}}).message
    )
    error = refused(path, overrides={"overrides": {"allow": ["notifications.on_failure"]}})
    assert error.params["key"] == "pipeline.overrides"


def test_the_allow_list_names_only_keys_that_need_it(tmp_path: Path) -> None:
    error = refused(write(tmp_path, HEAD + SOURCE + PLACES + "overrides: {allow: [lease.ttl_s]}\n"))
    assert error.params["key"].startswith("overrides.allow")
    assert "metrics.otlp_endpoint, notifications.on_failure" in error.message


# --------------------------------------------------------------------------- secrets in errors


@pytest.mark.parametrize(
    "client",
    [
        "{sasl.oauthbearer.config: [clientId=x clientSecret=" + SECRET + "]}",
        "{sasl.oauthbearer.config: {clientSecret: " + SECRET + "}}",
        "{sasl.oauthbearer.client.secret: [" + SECRET + "]}",
        "{ssl.key.pem: [" + SECRET + "]}",
        "{client.id: ['clientSecret=" + SECRET + "']}",
        "{client.id: ['https://user:" + SECRET + "@idp.example']}",
        "{sasl.oauthbearer.config: 'clientSecret=" + SECRET + "', No.Such.Key: x}",
    ],
)
def test_no_secret_bearing_value_is_echoed_whatever_key_it_comes_under(tmp_path: Path, client: str) -> None:
    error = refused(write(tmp_path, kafka(client)))
    assert SECRET not in shown(error)
    assert error.params["key"].startswith("source.client")


@pytest.mark.parametrize(
    ("key", "value", "secret"),
    [
        ("sasl.oauthbearer.config", "clientId=a clientSecret=S1", "S1"),
        ("lease.ttl_s", "clientSecret=S2", "S2"),
        ("x", {"password": "S3"}, "S3"),
        ("metrics.otlp_endpoint", "http://u:S4@host:4318", "S4"),
        ("ssl.key.password", 1234567, "1234567"),
    ],
)
def test_every_config_error_redacts_in_the_one_place_it_is_built(key: str, value: Any, secret: str) -> None:
    error = ConfigError(f"{key}={value!r} is not allowed: something ({value})", key=key, value=value)
    assert secret not in shown(error)
    assert f"{key}=" in error.message and "is not allowed: something" in error.message


# --------------------------------------------------------------------------- callables


CALLABLES = textwrap.dedent(
    """
    from splitkeeper import notification, spark_transform


    def plain(x):
        return x


    @spark_transform
    def marked_spark(df):
        return df


    @notification
    def marked_alert(event):
        return None
    """
)


@pytest.mark.parametrize("spec", ["os:system", "sys:exit", "code:interact", "shutil:rmtree", "builtins:eval"])
def test_a_spark_transform_of_a_dangerous_callable_is_refused_at_load(tmp_path: Path, spec: str) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + f"transform: {{kind: spark, function: '{spec}'}}\n")
    error = refused(path)
    assert error.params["key"] == "transform.function"
    assert f"{spec} is not marked as a Spark transform" in error.message
    assert "@spark_transform (from splitkeeper import spark_transform)" in error.message


@pytest.mark.parametrize(
    "spec", ["shutil:rmtree", "os:system", "sys:exit", "code:interact", "builtins:print"]
)
def test_an_on_failure_of_a_dangerous_callable_is_refused_at_load(tmp_path: Path, spec: str) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + f"notifications: {{on_failure: '{spec}'}}\n")
    error = refused(path)
    assert error.params["key"] == "notifications.on_failure"
    assert f"{spec} is not marked as a notification" in error.message
    assert "@notification (from splitkeeper import notification)" in error.message


def test_each_place_takes_only_the_callables_marked_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "boundary_callables.py").write_text(CALLABLES)
    monkeypatch.syspath_prepend(str(tmp_path))
    base = HEAD + SOURCE + PLACES
    spark = base + "transform: {kind: spark, function: 'boundary_callables:%s'}\n"
    alert = base + "notifications: {on_failure: 'boundary_callables:%s'}\n"
    assert (
        load_config(write(tmp_path, spark % "marked_spark")).transform_function
        == "boundary_callables:marked_spark"
    )
    assert (
        load_config(write(tmp_path, alert % "marked_alert")).notifications.on_failure
        == "boundary_callables:marked_alert"
    )
    assert "is not marked as a Spark transform" in refused(write(tmp_path, spark % "plain")).message
    assert "is not marked as a Spark transform" in refused(write(tmp_path, spark % "marked_alert")).message
    assert "is not marked as a notification" in refused(write(tmp_path, alert % "marked_spark")).message
    python = base + "transform: boundary_callables:marked_spark\n"
    assert "is not marked as a transform" in refused(write(tmp_path, python)).message
    dunder = spark % "marked_spark.__call__"
    assert "transform.function" in refused(write(tmp_path, dunder)).params["key"]


def test_the_notification_hook_refuses_an_unmarked_callable_even_if_the_config_was_not_validated() -> None:
    from splitkeeper.callables import Role, resolve_callable

    for spec in ("shutil:rmtree", "os:system"):
        with pytest.raises(ConfigError, match="is not marked as a notification"):
            resolve_callable(spec, "notifications.on_failure", Role.NOTIFICATION)


def test_every_spark_transform_and_notification_in_the_repository_is_marked() -> None:
    from splitkeeper import transforms
    from splitkeeper.callables import Role, is_marked
    from tests.dags import alerts

    assert is_marked(transforms.amount_cents, Role.SPARK_TRANSFORM)
    assert is_marked(transforms.identity, Role.SPARK_TRANSFORM) and is_marked(
        transforms.identity, Role.TRANSFORM
    )
    assert is_marked(alerts.record, Role.NOTIFICATION)
    pytest.importorskip("pyspark")
    from tests.runtime import spark_functions

    for name in ("orders", "raising", "raising_on_driver", "inventing", "keyless", "duplicating", "drifting"):
        assert is_marked(getattr(spark_functions, name), Role.SPARK_TRANSFORM), name


# --------------------------------------------------------------------------- Kafka client settings


@pytest.mark.parametrize(
    ("client", "key"),
    [
        ("{isolation.level: read_uncommitted}", "source.client.isolation.level"),
        ("{isolation.level: read_committed}", "source.client.isolation.level"),
        ("{Isolation.Level: read_uncommitted}", "source.client.Isolation.Level"),
        ("{Group.Id: g}", "source.client.Group.Id"),
        ("{ENABLE.AUTO.COMMIT: true}", "source.client.ENABLE.AUTO.COMMIT"),
    ],
)
def test_isolation_level_is_splitkeepers_own_like_group_id(tmp_path: Path, client: str, key: str) -> None:
    error = refused(write(tmp_path, kafka(client)))
    assert error.params["key"] == key
    assert "is not allowed: a setting splitkeeper does not set itself" in error.message


def test_the_readers_consumer_reads_committed_whatever_its_settings_say() -> None:
    from splitkeeper.sources.kafka.source import KafkaRegionReader

    reader = KafkaRegionReader(
        "127.0.0.1:9092",
        consumer_config=(("isolation.level", "read_uncommitted"), ("enable.auto.commit", "true")),
    )
    conf = reader._consumer_conf()
    assert conf["isolation.level"] == "read_committed" and conf["enable.auto.commit"] is False


@pytest.mark.kafka
def test_an_aborted_transaction_is_never_read_even_when_the_client_asks_for_it(kafka_broker: Any) -> None:
    from confluent_kafka import Producer

    from splitkeeper.sources.kafka.source import KafkaSource
    from tests.runtime.test_kafka_source import create_topic

    bootstrap = kafka_broker.bootstrap_servers
    topic = create_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"txn-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value="committed", partition=0)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, value="aborted", partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    source = KafkaSource(bootstrap, topics=[topic], client_config={"isolation.level": "read_uncommitted"})
    (split,) = source.discover_splits()
    values = [r.value for r in source.reader().read_range(split, 0, source.available_end(split))]
    assert values == [b"committed"]


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("Fetch.Max.Bytes", "did you mean 'fetch.max.bytes'?"),
        ("no.such.key", ""),
        ("Sasl.Password", "did you mean 'sasl.password'?"),
        ("security.protocl", "did you mean 'security.protocol'?"),
    ],
)
def test_an_unknown_client_setting_is_a_config_error_naming_it_and_where_to_look(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, hint: str
) -> None:
    pytest.importorskip("confluent_kafka")
    path = write(tmp_path, kafka("{'" + key + "': '1024'}"))
    error = refused(path)
    assert error.params["key"] == f"source.client.{key}"
    assert "no such librdkafka setting (names are case-sensitive)" in error.message
    assert hint in error.message
    assert "librdkafka's settings (and the values each takes) are listed at https://" in error.message
    assert "CONFIGURATION.md" in error.message
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"source.client.{key}" in err


def test_a_client_value_librdkafka_refuses_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("confluent_kafka")
    error = refused(write(tmp_path, kafka("{fetch.max.bytes: lots}")))
    assert error.params["key"] == "source.client.fetch.max.bytes"
    assert "librdkafka refuses it" in error.message
    config = load_config(write(tmp_path, kafka("{fetch.max.bytes: 1048576, client.id: me}")))
    assert config.source.client.as_dict() == {"client.id": "me", "fetch.max.bytes": "1048576"}


def test_a_client_that_cannot_start_where_the_file_loads_is_no_config_mistake(tmp_path: Path) -> None:
    """The scheduler parsing the DAGs may lack the worker's CA file or SASL plugin: the settings parse."""
    pytest.importorskip("confluent_kafka")
    client = "{security.protocol: SASL_SSL, sasl.mechanism: GSSAPI, ssl.ca.location: /nowhere/ca.pem}"
    assert load_config(write(tmp_path, kafka(client))).source.client.as_dict()["sasl.mechanism"] == "GSSAPI"
    error = refused(write(tmp_path, kafka("{security.protocol: SASL_SSLL}")))
    assert (
        error.params["key"] == "source.client.security.protocol" and "librdkafka refuses it" in error.message
    )


# --------------------------------------------------------------------------- locations


@pytest.mark.parametrize(
    ("dead", "source", "key", "allowed"),
    [
        ("incoming/dlq", "incoming", "errors.dead_letter.path", "a location outside source.path"),
        ("incoming", "incoming", "errors.dead_letter.path", "a location different from source.path"),
        ("dlq", "dlq/incoming", "source.path", "a location outside errors.dead_letter.path"),
        ("sink/dlq", "incoming", "errors.dead_letter.path", "a location outside sink.path"),
    ],
)
def test_a_dead_letter_table_may_not_lie_in_the_source_or_any_other_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], dead: str, source: str, key: str, allowed: str
) -> None:
    text = (
        HEAD
        + f"source: {{kind: files, path: {source}}}\n"
        + PLACES
        + f"errors: {{tolerance: all, dead_letter: {{path: {dead}}}}}\n"
    )
    path = write(tmp_path, text)
    error = refused(path)
    assert error.params["key"] == key
    assert f"is not allowed: {allowed}" in error.message and "move one of them" in error.message
    assert main(["status", "--config", str(path)]) == 2
    assert allowed in capsys.readouterr().err


def test_an_upsert_change_table_may_not_lie_in_the_source(tmp_path: Path) -> None:
    text = (
        HEAD
        + SOURCE
        + PLACES.replace(
            "sink: {path: sink}", "sink: {path: sink, mode: upsert, key: [id], changes_path: incoming/ch}"
        )
        + "decode: {kind: json, schema: 'id BIGINT'}\n"
    )
    error = refused(write(tmp_path, text))
    assert error.params["key"] == "sink.changes_path"
    assert "a location outside source.path" in error.message


def test_a_dead_letter_table_beside_the_others_is_fine(tmp_path: Path) -> None:
    text = HEAD + SOURCE + PLACES + "errors: {tolerance: all, dead_letter: {path: dead}}\n"
    assert load_config(write(tmp_path, text)).errors.dead_letter.path == str(tmp_path / "dead")


# --------------------------------------------------------------------------- read-only commands


def test_status_offsets_and_stop_need_no_transform_but_run_still_refuses_it(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36 unclear: status and offsets failed when the transform's module could not be imported."""
    import json

    from splitkeeper.app import services

    (tmp_path / "incoming").mkdir()
    (tmp_path / "incoming" / "a.txt").write_text("one\ntwo\n")
    services.run(load_config(write(tmp_path, HEAD + SOURCE + PLACES)), epochs=1)
    # the file now names a transform whose module cannot be imported (a deploy removed it)
    path = write(tmp_path, HEAD + SOURCE + PLACES + "transform: gone_module_36:enrich\n")

    assert main(["status", "--config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latest_checkpoint"]["id"] == 1
    assert main(["offsets", "--config", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"] == 1
    assert main(["offsets", "reset", "--config", str(path), "--split", "x", "--to", "earliest"]) == 2
    assert "gone_module_36" not in capsys.readouterr().err  # refused for the unknown split, not the module
    assert main(["stop", "--config", str(path)]) == 0
    capsys.readouterr()
    assert main(["run", "--config", str(path), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "transform='gone_module_36:enrich' is not allowed" in err
    assert "module 'gone_module_36' cannot be imported" in err


def test_the_read_only_load_still_refuses_everything_else(tmp_path: Path) -> None:
    text = HEAD + SOURCE + PLACES + "transform: gone_module_36:enrich\nlease: {ttl_s: -1}\n"
    error = refused(write(tmp_path, text), imports=False)
    assert error.params["key"] == "lease.ttl_s"
    config = load_config(
        write(tmp_path, HEAD + SOURCE + PLACES + "transform: gone_module_36:enrich\n"), imports=False
    )
    assert config.transform_function == "gone_module_36:enrich"
