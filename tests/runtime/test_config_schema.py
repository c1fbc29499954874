"""The pydantic schema of the pipeline file: its JSON Schema, the example configs, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from splitkeeper.cli import main
from splitkeeper.config.models import PipelineConfig, json_schema
from splitkeeper.config.settings import STRATEGY_NAMES, config_from_mapping, load_config
from splitkeeper.errors import ConfigError
from splitkeeper_tools import demo

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*_pipeline.*"))


def _parsed(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    return json.loads(json.dumps(data))  # as JSON has it: mapping keys are strings


def _demo_configs(tmp_path: Path) -> list[Path]:
    return [demo._config(tmp_path), demo._stream_config(tmp_path, "127.0.0.1:9092")]


def test_the_schema_is_valid_json_schema_2020_12() -> None:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == ["name", "sink", "source", "state"]
    assert schema["properties"]["strategy"]["enum"] == list(STRATEGY_NAMES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_example_configs_validate_against_the_schema_and_load(path: Path) -> None:
    assert len(EXAMPLES) == 5
    jsonschema.validate(_parsed(path), json_schema())
    assert load_config(path).name


def test_the_demo_configs_validate_against_the_schema_and_load(tmp_path: Path) -> None:
    for path in _demo_configs(tmp_path):
        jsonschema.validate(_parsed(path), json_schema())
        assert load_config(path).name.startswith("demo-")


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"paralelism": 2}, "paralelism"),
        ({"regions": "globl"}, "regions"),
        ({"strategy": "least_loaded"}, "strategy"),
        ({"parallelism": "4"}, "parallelism"),
        ({"checkpoint": {"on_split_failure": "park"}}, "checkpoint.on_split_failure"),
        ({"lease": {"ttl_s": 0}}, "lease.ttl_s"),
        ({"name": "my pipeline"}, "name"),
    ],
)
def test_what_the_schema_rejects_the_loader_rejects_naming_the_same_key(
    tmp_path: Path, change: dict[str, Any], key: str
) -> None:
    data = {
        "name": "orders",
        "source": {"kind": "files", "path": "in"},
        "state": {"path": "state"},
        "sink": {"path": "sink"},
        **change,
    }
    errors = list(jsonschema.Draft202012Validator(json_schema()).iter_errors(data))
    assert errors, f"the JSON Schema accepts {change}"
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data, base_dir=tmp_path)
    assert info.value.params["key"] == key


def test_unknown_keys_list_exactly_the_schema_properties_of_their_section(tmp_path: Path) -> None:
    schema = json_schema()
    data = {"name": "o", "source": {"kind": "files", "path": "in", "pth": 1}, "state": {"path": "s"}}
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**data, "sink": {"path": "k"}}, base_dir=tmp_path)
    source_keys = tuple(schema["$defs"]["FilesSource"]["properties"])
    assert info.value.params["allowed"] == source_keys
    assert "did you mean 'source.path'?" in info.value.message
    with pytest.raises(ConfigError) as info:
        config_from_mapping(
            {**data, "source": {"kind": "files", "path": "in"}, "sinks": {}}, base_dir=tmp_path
        )
    assert info.value.params["allowed"] == tuple(schema["properties"]) == tuple(PipelineConfig.model_fields)


def test_config_schema_prints_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()


def test_config_schema_out_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pipeline.schema.json"
    assert main(["config", "schema", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert json.loads(out.read_text()) == json_schema()
    assert main(["config", "schema", "--out", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_the_console_script_prints_the_schema() -> None:
    script = Path(sys.executable).parent / "splitkeeper"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [str(script), "config", "schema"], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(done.stdout)["title"] == "splitkeeper pipeline"
    bad = subprocess.run([str(script), "config", "check"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "invalid choice: 'check'" in bad.stderr


def test_a_runs_overrides_merge_onto_their_sections_and_are_validated_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: o\nsource: {kind: files, path: in}\nstate: {path: s}\nsink: {path: k}\n"
        "backlog: {backlog_epoch_records: 500, normal_epoch_records: 50}\n"
    )
    config = load_config(path, overrides={"backlog": {"normal_epoch_records": 7}, "lease": {"ttl_s": 5}})
    assert (config.backlog.backlog_epoch_records, config.backlog.normal_epoch_records) == (500, 7)
    assert config.lease.ttl_s == 5.0 and load_config(path).backlog.normal_epoch_records == 50
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={"sink": {"path": "elsewhere"}})
    assert info.value.params["key"] == "pipeline.sink"
    assert "checkpoint, backlog, lease, notifications, metrics" in info.value.message
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides={"backlog": {"normal_epoch_record": 7}})
    assert "did you mean 'backlog.normal_epoch_records'?" in info.value.message
    with pytest.raises(ConfigError, match=r"pipeline=\[\] is not allowed: a mapping of sections"):
        load_config(path, overrides=[])  # type: ignore[arg-type]


def test_the_overrides_schema_is_the_files_own_for_those_sections() -> None:
    from splitkeeper.config.models import overrides_json_schema
    from splitkeeper.config.settings import OVERRIDABLE

    schema = overrides_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    full = json_schema()
    assert tuple(schema["properties"]) == OVERRIDABLE
    for key in OVERRIDABLE:
        assert schema["properties"][key] == full["properties"][key]
    for name, definition in schema["$defs"].items():
        assert definition == full["$defs"][name]
    jsonschema.validate({"checkpoint": {"on_split_failure": "quarantine", "quarantine_after": 2}}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"source": {"kind": "files"}}, schema)


def test_the_run_command_takes_the_overrides_as_json(tmp_path: Path) -> None:
    import argparse

    from splitkeeper.commands import run as run_command

    path = tmp_path / "p.yaml"
    path.write_text("name: o\nsource: {kind: files, path: in}\nstate: {path: s}\nsink: {path: k}\n")
    parser = argparse.ArgumentParser()
    run_command.configure(parser)
    args = parser.parse_args(["--config", str(path), "--pipeline-json", '{"lease": {"ttl_s": 9}}'])
    assert run_command._load(args).lease.ttl_s == 9.0
    args = parser.parse_args(["--config", str(path), "--pipeline-json", '{"lease": {"ttl_s": 0}}'])
    with pytest.raises(ConfigError, match=r"lease.ttl_s=0 is not allowed: a number of seconds > 0"):
        run_command._load(args)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"strategy": "weighted", "weighted": {"capacities": {"x": 2}}},
            "weighted.capacities.x='x' is not allowed: a mapping of reader id (an integer >= 0) to a "
            "capacity",
        ),
        (
            {"source": {"kind": "kafka", "bootstrap_servers": 5, "topics": ["t"]}},
            "source.bootstrap_servers=5 is not allowed: 'host:port[,host:port...]' or a list of 'host:port'; "
            "got an integer",
        ),
        (
            {"source": {"kind": "kafka", "bootstrap_servers": "b:1", "topics": ["t"], "client": "pw=1"}},
            "source.client='<not shown>' is not allowed: a mapping of Kafka client settings",
        ),
        ({"maintenance": {"history_hours": -1}}, "maintenance.history_hours=-1 is not allowed: hours >= 0"),
        (
            {"checkpoint": {"on_split_failure": 3}},
            "checkpoint.on_split_failure=3 is not allowed: one of stall, ",
        ),
        ({"name": None}, "name is required but missing"),
    ],
)
def test_pydantic_errors_read_as_the_house_messages(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    data = {
        "name": "o",
        "source": {"kind": "files", "path": "in"},
        "state": {"path": "s"},
        "sink": {"path": "k"},
    }
    with pytest.raises(ConfigError) as info:
        config_from_mapping({**data, **change}, base_dir=tmp_path)
    assert expected in info.value.message and "pw=1" not in info.value.message


def test_a_null_value_counts_as_not_given(tmp_path: Path) -> None:
    data = {
        "name": "o",
        "source": {"kind": "files", "path": "in"},
        "state": {"path": "s"},
        "sink": {"path": "k"},
    }
    config = config_from_mapping({**data, "parallelism": None, "lease": {"ttl_s": None}}, base_dir=tmp_path)
    assert (config.parallelism, config.lease.ttl_s) == (1, 60.0)
