"""Pipeline config loading and validation: messages are pinned, paths resolve, examples load."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import (
    RegionMode,
    SourceKind,
    config_from_mapping,
    core_settings,
    load_config,
)
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.errors import ConfigError
from splitkeeper.sources.files.config import FileFormat
from splitkeeper.sources.kafka.config import OffsetOutOfRange, StartingMode

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

BASE: dict[str, Any] = {
    "name": "orders",
    "source": {"kind": "files", "path": "incoming"},
    "state": {"path": "state"},
    "sink": {"path": "sink"},
}


def build(tmp_path: Path, **changes: Any) -> Any:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        target = data
        for key in parents:
            target = target.setdefault(key, {})
        if value is _DELETE:
            del target[leaf]
        else:
            target[leaf] = value
    return config_from_mapping(data, base_dir=tmp_path, origin=str(tmp_path / "p.yaml"))


_DELETE = object()


def error_of(tmp_path: Path, **changes: Any) -> str:
    with pytest.raises(ConfigError) as info:
        build(tmp_path, **changes)
    return str(info.value)


# --------------------------------------------------------------------------- pinned messages


def test_unknown_key_names_it_and_suggests_the_closest_known_key(tmp_path: Path) -> None:
    message = error_of(tmp_path, checkpoint__max_failur_ratio=0.3)
    assert message == (
        f"[CONFIG_ERROR] unknown key checkpoint.max_failur_ratio=0.3 ({tmp_path / 'p.yaml'}): allowed keys "
        "under checkpoint are max_consecutive_failures, max_failure_ratio, region_timeout_s, "
        "retain_checkpoints, on_split_failure, quarantine_after, full_snapshot_every, "
        "max_consecutive_aborts; did you mean 'checkpoint.max_failure_ratio'?"
    )


def test_unknown_top_level_key_is_an_error_with_suggestion(tmp_path: Path) -> None:
    message = error_of(tmp_path, paralelism=2)
    assert "unknown key paralelism=2" in message
    assert "did you mean 'parallelism'?" in message


def test_parallelism_zero_is_rejected_with_what_is_allowed(tmp_path: Path) -> None:
    assert error_of(tmp_path, parallelism=0) == (
        f"[CONFIG_ERROR] parallelism=0 is not allowed: an integer >= 1 ({tmp_path / 'p.yaml'})"
    )


def test_failure_ratio_above_one_is_rejected_with_dotted_key(tmp_path: Path) -> None:
    assert error_of(tmp_path, checkpoint__max_failure_ratio=1.5) == (
        "[CONFIG_ERROR] checkpoint.max_failure_ratio=1.5 is not allowed: a number between 0 and 1 "
        f"({tmp_path / 'p.yaml'})"
    )


def test_unknown_strategy_lists_the_core_strategies_and_suggests_one(tmp_path: Path) -> None:
    assert error_of(tmp_path, strategy="least_loaded") == (
        "[CONFIG_ERROR] strategy='least_loaded' is not allowed: one of least-loaded, legacy-hash, "
        f"round-robin, weighted; did you mean 'least-loaded'? ({tmp_path / 'p.yaml'})"
    )


def test_missing_source_path_for_files_is_named(tmp_path: Path) -> None:
    assert error_of(tmp_path, source__path=_DELETE) == (
        f"[CONFIG_ERROR] source.path is required but missing ({tmp_path / 'p.yaml'}): "
        "the directory (or file) to ingest"
    )


def test_wrong_type_says_what_was_given(tmp_path: Path) -> None:
    assert error_of(tmp_path, parallelism="4") == (
        "[CONFIG_ERROR] parallelism='4' is not allowed: an integer >= 1; got a string "
        f"({tmp_path / 'p.yaml'})"
    )


def test_wrong_type_in_a_section_uses_the_dotted_key(tmp_path: Path) -> None:
    message = error_of(tmp_path, checkpoint__region_timeout_s="10s")
    assert "checkpoint.region_timeout_s='10s' is not allowed" in message
    assert "got a string" in message


def test_a_section_given_as_a_scalar_is_a_type_error(tmp_path: Path) -> None:
    message = error_of(tmp_path, source="files")
    assert message.startswith("[CONFIG_ERROR] source='files' is not allowed: a mapping with keys kind, path")
    assert "got a string" in message


def test_error_carries_key_value_and_allowed_as_parameters(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        build(tmp_path, backlog__normal_epoch_records=0)
    assert info.value.params["key"] == "backlog.normal_epoch_records"
    assert info.value.params["value"] == 0
    assert "integer >= 1" in info.value.params["allowed"]


# --------------------------------------------------------------------------- other rules


def test_option_of_the_other_source_kind_is_rejected(tmp_path: Path) -> None:
    message = error_of(tmp_path, source__topics=["orders"])
    assert "source.topics=['orders'] is not allowed: no topics for source.kind 'files'" in message


def test_bad_enum_value_suggests_the_closest(tmp_path: Path) -> None:
    message = error_of(tmp_path, regions="globl")
    assert "regions='globl' is not allowed: one of per_reader, global; did you mean 'global'?" in message


def test_missing_transform_module_fails_at_load(tmp_path: Path) -> None:
    message = error_of(tmp_path, transform="nope_pkg.mod:fn")
    assert "transform='nope_pkg.mod:fn' is not allowed" in message
    assert "module 'nope_pkg.mod' cannot be imported" in message


def test_malformed_transform_spec_is_rejected(tmp_path: Path) -> None:
    assert "transform='no_colon' is not allowed: 'module:function'" in error_of(
        tmp_path, transform="no_colon"
    )


def test_pipeline_name_must_be_safe_for_job_groups_and_txn_ids(tmp_path: Path) -> None:
    assert "name='my pipeline' is not allowed" in error_of(tmp_path, name="my pipeline")


def test_sink_and_state_may_not_share_a_location(tmp_path: Path) -> None:
    assert "sink.path=" in error_of(tmp_path, sink__path="state")


def test_defaults_resolve_paths_against_the_base_directory(tmp_path: Path) -> None:
    cfg = build(tmp_path)
    assert cfg.source.kind is SourceKind.FILES
    assert cfg.source.path == str(tmp_path / "incoming")
    assert cfg.source.format is FileFormat.LINES
    assert cfg.source.split_bytes == 0
    assert cfg.state.path == str(tmp_path / "state")
    assert cfg.sink.path == str(tmp_path / "sink")
    assert cfg.staging.path == str(tmp_path / "state" / "_staging")
    assert cfg.parallelism == 1
    assert cfg.regions is RegionMode.PER_READER and cfg.regional_checkpoints
    assert cfg.strategy == "least-loaded"
    assert cfg.transform_function == "splitkeeper.transforms:identity"


def test_staging_inside_the_sink_table_is_rejected(tmp_path: Path) -> None:
    message = error_of(tmp_path, staging={"path": "sink/_staging"})
    assert (
        f"staging.path='{tmp_path / 'sink' / '_staging'}' is not allowed: a location outside sink.path"
        in message
    )


def test_uri_paths_are_kept_as_given(tmp_path: Path) -> None:
    cfg = build(
        tmp_path, sink__path="s3a://lake/orders", state__path="s3a://lake/_state", staging__path="stage"
    )
    assert cfg.sink.path == "s3a://lake/orders" and cfg.state.path == "s3a://lake/_state"
    assert cfg.staging.path == str(tmp_path / "stage")


def test_staging_defaults_to_the_object_store_with_state_there_and_a_local_folder_stays_a_choice(
    tmp_path: Path,
) -> None:
    # region tasks and the sink reach staged files through pyarrow.fs (splitkeeper.staging rule 5)
    assert build(tmp_path, state__path="s3a://lake/_state").staging.path == "s3a://lake/_state/_staging"
    cfg = build(tmp_path, state__path="s3a://lake/_state", staging__path="s3://lake/stage")
    assert cfg.staging.path == "s3://lake/stage"
    cfg = build(tmp_path, state__path="s3a://lake/_state", staging__path="stage")  # one host: local
    assert cfg.staging.path == str(tmp_path / "stage")
    message = error_of(tmp_path, staging__path="gs://lake/_staging")
    assert (
        "staging.path='gs://lake/_staging' is not allowed: a local directory (one host) or an S3 prefix"
        in (message)
    )
    message = error_of(tmp_path, state__path="gs://lake/_state")
    assert message.startswith("[CONFIG_ERROR] staging.path is required but missing")
    assert "state.path gs://lake/_state is on a store staged files cannot use" in message


def test_env_references_are_expanded_and_an_unset_one_is_named(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["source"] = {"kind": "kafka", "bootstrap_servers": "${BROKERS}", "topics": ["t-${SUFFIX}"]}
    data["sink"] = {"path": "s3a://${BUCKET}/sink"}
    env = {"BROKERS": "127.0.0.1:9092", "SUFFIX": "a", "BUCKET": "lake"}
    cfg = config_from_mapping(data, base_dir=tmp_path, env=env)
    assert cfg.source.bootstrap_servers == "127.0.0.1:9092" and cfg.source.topics == ("t-a",)
    assert cfg.sink.path == "s3a://lake/sink"
    data["source"]["group_id"] = "$${literal}"
    assert config_from_mapping(data, base_dir=tmp_path, env=env).source.group_id == "${literal}"
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, base_dir=tmp_path, env={"SUFFIX": "a", "BUCKET": "lake"})
    assert (
        "source.bootstrap_servers refers to ${BROKERS}, but the environment variable BROKERS is not set"
        in (str(info.value))
    )
    assert info.value.params["key"] == "source.bootstrap_servers"


def test_checkpoint_section_is_a_core_checkpoint_config_wired_to_regions(tmp_path: Path) -> None:
    cfg = build(
        tmp_path, regions="global", checkpoint__max_consecutive_failures=0, checkpoint__region_timeout_s=30
    )
    core = core_settings(cfg).checkpoint
    assert isinstance(core, CheckpointConfig)
    assert core.regions_independent is False and core.max_consecutive_failures == 0
    assert core.region_timeout_s == 30.0
    assert cfg.checkpoint.regions_independent is False
    assert cfg.regional_checkpoints is False
    assert cfg.checkpoint.region_timeout_s == 30.0 and isinstance(cfg.checkpoint.region_timeout_s, float)


def test_retain_checkpoints_must_be_positive(tmp_path: Path) -> None:
    assert "checkpoint.retain_checkpoints=0 is not allowed: an integer >= 1" in error_of(
        tmp_path, checkpoint__retain_checkpoints=0
    )


def test_kafka_source_is_validated_and_normalised(tmp_path: Path) -> None:
    kafka = {
        "kind": "kafka",
        "bootstrap_servers": ["b1:9092", "b2:9092"],
        "topic_pattern": "orders-.*",
        "starting": "timestamp:1700000000000",
        "on_offset_out_of_range": "skip",
        "connect_timeout_s": 3,
        "read_timeout_s": 2.5,
    }
    cfg = build(tmp_path, source=kafka)
    assert (cfg.source.connect_timeout_s, cfg.source.read_timeout_s) == (3.0, 2.5)
    from splitkeeper.sources.kafka.source import KafkaSource

    reader = KafkaSource.from_config(cfg.source).reader()  # no connection until it is used
    assert (reader.connect_timeout_s, reader.read_timeout_s) == (3.0, 2.5)
    defaults = KafkaSource.from_config(build(tmp_path, source={**kafka, "read_timeout_s": None}).source)
    assert defaults.reader().read_timeout_s == 30.0
    assert cfg.source.bootstrap_servers == "b1:9092,b2:9092"
    assert cfg.source.topic_pattern == "orders-.*" and cfg.source.topics == ()
    assert cfg.source.starting_mode is StartingMode.TIMESTAMP
    assert cfg.source.starting_timestamp_ms == 1_700_000_000_000
    assert cfg.source.on_offset_out_of_range is OffsetOutOfRange.SKIP


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"bootstrap_servers": "b:9092"}, "source.topics is required but missing"),
        (
            {"bootstrap_servers": "b:9092", "topics": ["a"], "topic_pattern": "a.*"},
            "exactly one of source.topics",
        ),
        ({"bootstrap_servers": "localhost", "topics": ["a"]}, "source.bootstrap_servers='localhost'"),
        ({"bootstrap_servers": "b:9092", "topics": "a"}, "source.topics='a' is not allowed: a list"),
        ({"bootstrap_servers": "b:9092", "topics": ["a"], "starting": "timestamp:soon"}, "source.starting="),
        (
            {"bootstrap_servers": "b:9092", "topics": ["a"], "starting": "group"},
            "source.group_id is required",
        ),
        ({"bootstrap_servers": "b:9092", "topic_pattern": "("}, "a valid regular expression"),
        ({"bootstrap_servers": "b:9092", "topics": ["a"], "path": "x"}, "no path for source.kind 'kafka'"),
        (
            {"bootstrap_servers": "b:9092", "topics": ["a"], "read_timeout_s": 0},
            "source.read_timeout_s=0 is not allowed: a number of seconds > 0",
        ),
        (
            {"bootstrap_servers": "b:9092", "topics": ["a"], "connect_timeout_s": "10s"},
            "source.connect_timeout_s='10s' is not allowed: a number of seconds > 0",
        ),
    ],
)
def test_kafka_mistakes_are_named(tmp_path: Path, source: dict[str, Any], expected: str) -> None:
    assert expected in error_of(tmp_path, source={"kind": "kafka", **source})


def test_yaml_file_resolves_relative_paths_against_its_directory(tmp_path: Path) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "p.yml").write_text(
        textwrap.dedent(
            """
            name: demo
            parallelism: 3
            source: {kind: files, path: ../in, format: jsonl, split_bytes: 1024}
            state: {path: st}
            sink: {path: /abs/sink}
            backlog: {backlog_epoch_records: 500, normal_epoch_records: 50}
            """
        )
    )
    cfg = load_config(conf_dir / "p.yml")
    assert cfg.source.path == str(tmp_path / "in")
    assert cfg.state.path == str(conf_dir / "st")
    assert cfg.sink.path == "/abs/sink"
    assert cfg.source.format is FileFormat.JSONL and cfg.source.split_bytes == 1024
    assert cfg.backlog.epoch_records(True) == 500 and cfg.backlog.epoch_records(False) == 50
    assert cfg.origin == str(conf_dir / "p.yml")


def test_toml_file_loads_the_same_shape(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(
        textwrap.dedent(
            """
            name = "demo"
            strategy = "round-robin"
            [source]
            kind = "files"
            path = "in"
            [state]
            path = "st"
            [sink]
            path = "sk"
            """
        )
    )
    cfg = load_config(tmp_path / "p.toml")
    assert cfg.strategy == "round-robin"
    assert cfg.source.path == str(tmp_path / "in")


def test_errors_in_a_file_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("name: demo\nparallelism: 0\nsource: {kind: files, path: in}\n")
    with pytest.raises(ConfigError, match=r"parallelism=0 is not allowed: an integer >= 1 \(.*p\.yaml\)"):
        load_config(tmp_path / "p.yaml")


def test_syntax_errors_and_bad_files_are_config_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    (tmp_path / "bad.toml").write_text("name = \n")
    (tmp_path / "p.json").write_text("{}")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "bad.toml")
    with pytest.raises(ConfigError, match="allowed are .yaml, .yml"):
        load_config(tmp_path / "p.json")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_to_dict_is_plain_data(tmp_path: Path) -> None:
    data = build(tmp_path, regions="global").to_dict()
    assert data["regions"] == "global"
    assert data["source"]["kind"] == "files"
    assert data["checkpoint"]["regions_independent"] is False


@pytest.mark.parametrize("name", ["files_pipeline.yaml", "files_pipeline.toml", "kafka_pipeline.yaml"])
def test_example_configs_load(name: str) -> None:
    cfg = load_config(EXAMPLES / name)
    assert cfg.name and cfg.state.path.startswith(str(EXAMPLES.parent))


# --------------------------------------------------------------------------- rescale and Kafka clients


def test_rescale_operator_state_is_even_split_by_default_and_union_on_request(tmp_path: Path) -> None:
    from splitkeeper.config.settings import OperatorState

    assert build(tmp_path).rescale.operator_state is OperatorState.EVEN_SPLIT
    assert build(tmp_path, rescale__operator_state="union").rescale.operator_state is OperatorState.UNION
    assert error_of(tmp_path, rescale__operator_state="unoin") == (
        f"[CONFIG_ERROR] rescale.operator_state='unoin' is not allowed: one of even-split, union; "
        f"did you mean 'union'? ({tmp_path / 'p.yaml'})"
    )


KAFKA: dict[str, Any] = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topics": ["orders"]}


def test_kafka_client_settings_reach_the_connector_and_its_readers_and_secrets_never_print(
    tmp_path: Path,
) -> None:
    from splitkeeper.sources.kafka.source import KafkaSource

    client = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": "hunter2-very-secret",
        "ssl.endpoint.identification.algorithm": "https",
        "socket.keepalive.enable": True,
        "fetch.max.bytes": 1048576,
    }
    config = build(tmp_path, source={**KAFKA, "client": client})
    assert config.source.client.as_dict()["sasl.password"] == "hunter2-very-secret"
    assert config.source.client.as_dict()["socket.keepalive.enable"] == "true"
    shown = f"{config!r} {config.to_dict()} {config.source}"
    assert "hunter2" not in shown and "'sasl.password': '***'" in shown and "alice" in shown
    reader = KafkaSource.from_config(config.source).reader()
    assert ("sasl.password", "hunter2-very-secret") in reader.consumer_config
    assert "hunter2" not in repr(reader)


@pytest.mark.parametrize(
    ("client", "fragment"),
    [
        ({"bootstrap.servers": "x:1"}, "source.client.bootstrap.servers='x:1' is not allowed"),
        ({"group.id": "g"}, "use source.bootstrap_servers / source.group_id instead"),
        ({"enable.auto.commit": True}, "offsets only when a checkpoint completes"),
        ({"sasl.password": ["hunter2"]}, "source.client.sasl.password='***' is not allowed"),
        ({"fetch.max.bytes": None}, "source.client.fetch.max.bytes=None is not allowed"),
    ],
)
def test_a_bad_kafka_client_setting_is_named_and_a_secret_value_is_not(
    tmp_path: Path, client: dict[str, Any], fragment: str
) -> None:
    message = error_of(tmp_path, source={**KAFKA, "client": client})
    assert fragment in message and "hunter2" not in message


# --------------------------------------------------------------------------- decode, errors, sink


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"decode__kind": "json"}, "decode.schema is required but missing"),
        (
            {"decode__schema": "id BIGINT"},
            "decode.schema='id BIGINT' is not allowed: nothing for decode.kind 'raw'",
        ),
        (
            {"decode__kind": "json", "decode__schema": "id BIGINT, tags MAP<STRING, STRING>"},
            "MAP is not supported for decode.kind json",
        ),
        ({"decode__kind": "json", "decode__schema": "id BIGINT, name VARCHAR2"}, "'VARCHAR2'"),
        (
            {"decode__kind": "csv", "decode__schema": "a INT", "decode__on_new_fields": "add_columns"},
            "rescue or fail",
        ),
        ({"decode__kind": "json", "decode__schema": "offset BIGINT"}, "'offset' is a bookkeeping column"),
        (  # Delta and Spark compare column names case-insensitively: these crashed at the first commit
            {"decode__kind": "json", "decode__schema": "id BIGINT, Timestamp STRING"},
            "'Timestamp' is a bookkeeping column of the sink (as 'timestamp'",
        ),
        (
            {"decode__kind": "json", "decode__schema": "id BIGINT, ID STRING"},
            "'ID' differs from the column 'id' only in case",
        ),
        (
            {"decode__kind": "json", "decode__schema": "id BIGINT, s STRUCT<a: INT, A: INT>"},
            "the STRUCT field names 'a' and 'A' differ only in case",
        ),
        ({"decode__kind": "json", "decode__schema": "_Rescued STRING"}, "'_Rescued' is the _rescued column"),
        ({"decode__kind": "avro"}, "decode.schema_file is required but missing"),
        ({"errors__tolerance": "all"}, "errors.dead_letter.path is required but missing"),
        ({"errors__dead_letter__path": "dl"}, "nothing unless errors.tolerance is 'all'"),
        ({"errors__tolerance": "all", "errors__dead_letter__path": "sink"}, "a table other than sink.path"),
        ({"errors__max_bad_ratio": 1.5}, "errors.max_bad_ratio=1.5 is not allowed"),
        ({"sink__partition_by": ["day"]}, "'day' is not one"),
        ({"decode__kind": "jsn"}, "did you mean 'json'?"),
    ],
)
def test_a_mistake_in_decode_errors_or_sink_names_the_key_and_what_is_allowed(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    assert expected in error_of(tmp_path, **changes)


def test_decode_errors_and_partition_by_reach_the_typed_view(tmp_path: Path) -> None:
    config = build(
        tmp_path,
        decode__kind="json",
        decode__schema="id BIGINT, amount DECIMAL(10,2), ts TIMESTAMP",
        errors__tolerance="all",
        errors__dead_letter__path="dead",
        errors__max_bad_ratio=0.25,
        sink__partition_by=["ingested_date"],
    )
    assert [c.name for c in config.decode.data_columns()] == ["id", "amount", "ts", "_rescued"]
    assert config.errors.dead_letter.path == str(tmp_path / "dead")
    assert (config.errors.tolerance.value, config.errors.max_bad_ratio, config.sink.partition_by) == (
        "all",
        0.25,
        ("ingested_date",),
    )


# --------------------------------------------------------------------------- upsert sinks, Spark transforms

_CDC = {"decode__kind": "json", "decode__schema": "id BIGINT, op STRING, amount DOUBLE"}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"sink__mode": "upsert"}, "sink.key is required but missing"),
        ({**_CDC, "sink__mode": "upsert", "sink__key": ["customer"]}, "'customer' is not one"),
        ({**_CDC, "sink__mode": "upsert", "sink__key": ["id", "id"]}, "distinct column names"),
        (
            {**_CDC, "sink__mode": "upsert", "sink__key": ["id"], "sink__delete_when": "op = "},
            "sink.delete_when='op =' is not allowed: a SQL predicate over the record's columns",
        ),
        (
            {**_CDC, "sink__mode": "upsert", "sink__key": ["id"], "sink__delete_when": "kind = 'd'"},
            "it names 'kind', which is not one",
        ),
        (
            {**_CDC, "sink__mode": "upsert", "sink__key": ["id"], "sink__delete_when": "(SELECT 1)"},
            "a predicate over one record, not a query",
        ),
        (
            {**_CDC, "sink__key": ["id"]},
            "sink.key=['id'] is not allowed: nothing unless sink.mode is 'upsert'",
        ),
        ({**_CDC, "sink__mode": "merge"}, "sink.mode"),
        (
            {**_CDC, "sink__mode": "upsert", "sink__key": ["id"], "sink__changes_path": "sink"},
            "a table other than sink.path",
        ),
        ({"transform": {"kind": "spark", "function": "no_such_module:fn"}}, "transform.function"),
        ({"transform": {"kind": "spark"}}, "transform.function"),
        (
            {**_CDC, "sink__mode": "upsert", "sink__key": ["id"], "decode__on_new_fields": "add_columns"},
            "decode.on_new_fields='add_columns' is not allowed: rescue or fail with sink.mode 'upsert'",
        ),
    ],
)
def test_a_mistake_in_an_upsert_sink_or_spark_transform_names_the_key_and_what_is_allowed(
    tmp_path: Path, changes: dict[str, Any], expected: str
) -> None:
    assert expected in error_of(tmp_path, **changes)


def test_an_upsert_sink_and_a_spark_transform_reach_the_typed_view(tmp_path: Path) -> None:
    config = build(
        tmp_path,
        **_CDC,
        sink__mode="upsert",
        sink__key=["id"],
        sink__delete_when="op = 'd'",
        transform={"kind": "spark", "function": "splitkeeper.transforms:identity"},
    )
    assert config.sink.mode.value == "upsert"
    assert config.sink.upsert is not None and config.sink.upsert.key == ("id",)
    assert (
        config.sink.upsert.delete_condition("s")
        == "(COALESCE(s.tombstone, FALSE) OR COALESCE((s.op = 'd'), FALSE))"
    )
    assert config.sink.changes_path == str(tmp_path / "sink_changes")
    assert config.sink.filtered_path == str(tmp_path / "sink_filtered")
    assert (config.transform_kind.value, config.transform_function) == (
        "spark",
        "splitkeeper.transforms:identity",
    )
    plain = build(tmp_path)
    assert (
        plain.sink.mode.value,
        plain.sink.upsert,
        plain.sink.changes_path,
        plain.transform_kind.value,
    ) == (
        "append",
        None,
        None,
        "python",
    )
