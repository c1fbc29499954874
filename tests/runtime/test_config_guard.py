"""Config that cannot hurt (issue 19): placement of the locations, the parallelism limit,
files that are refused before anything expands them (duplicate keys, deep nesting, alias
bombs), and transforms that must be marked as such.

Each case is written from the issue's steps, through the loader and through ``splitkeeper
status --config`` (rc and message); only the executor pickling test starts Spark.
"""

from __future__ import annotations

import argparse
import pickle
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.cli import main
from splitkeeper.config.limits import MAX_CONCURRENT_REGIONS, MAX_PARALLELISM
from splitkeeper.config.settings import MAX_DEPTH, MAX_VALUES, load_config
from splitkeeper.errors import ConfigError

HEAD = "name: orders\n"
SOURCE = "source: {kind: files, path: incoming}\n"
PLACES = "state: {path: state}\nsink: {path: sink}\n"


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    return str(info.value)


def status_rc(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["status", "--config", str(path)])
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- placement


@pytest.mark.parametrize(
    ("places", "key", "allowed"),
    [
        (
            "state: {path: incoming/state}\nsink: {path: sink}\n",
            "state.path",
            "a location outside source.path",
        ),
        (
            "state: {path: state}\nsink: {path: incoming}\n",
            "sink.path",
            "a location different from source.path",
        ),
        ("state: {path: state}\nsink: {path: incoming/out}\n", "sink.path", "a location outside source.path"),
        (
            "state: {path: state}\nsink: {path: sink}\nstaging: {path: incoming/_staging}\n",
            "staging.path",
            "a location outside source.path",
        ),
        (
            "state: {path: incoming/../state}\nsink: {path: state/sink}\n",
            "sink.path",
            "a location outside state.path",
        ),
        (
            "state: {path: state}\nsink: {path: sink}\nstaging: {path: sink/st}\n",
            "staging.path",
            "a location outside sink.path",
        ),
    ],
    ids=[
        "state-in-source",
        "sink-is-source",
        "sink-in-source",
        "staging-in-source",
        "sink-in-state",
        "staging-in-sink",
    ],
)
def test_state_sink_and_staging_may_not_lie_in_the_source_or_each_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], places: str, key: str, allowed: str
) -> None:
    path = write(tmp_path, HEAD + SOURCE + places)
    message = refused(path)
    assert message.startswith(f"[CONFIG_ERROR] {key}=")
    assert f"is not allowed: {allowed}" in message
    assert "move one of them" in message and str(path) in message
    rc, err = status_rc(path, capsys)
    assert rc == 2 and f"{key}=" in err and allowed in err


def test_the_source_may_not_lie_inside_the_sink(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + "source: {kind: files, path: sink/incoming}\n" + PLACES)
    message = refused(path)
    assert (
        f"source.path='{tmp_path / 'sink' / 'incoming'}' is not allowed: a location outside sink.path"
        in message
    )
    assert "splitkeeper writes and cleans up sink.path" in message


def test_placement_is_checked_on_resolved_paths_symlinks_home_and_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "incoming" / "deep").mkdir(parents=True)
    (tmp_path / "innocent").symlink_to(tmp_path / "incoming" / "deep")
    path = write(tmp_path, HEAD + SOURCE + "state: {path: innocent/state}\nsink: {path: sink}\n")
    assert f"state.path='{tmp_path / 'incoming' / 'deep' / 'state'}' is not allowed" in refused(path)

    monkeypatch.setenv("HOME", str(tmp_path))
    path = write(tmp_path, HEAD + SOURCE + "state: {path: ~/incoming/st}\nsink: {path: sink}\n")
    assert f"state.path='{tmp_path / 'incoming' / 'st'}' is not allowed" in refused(path)

    conf = tmp_path / "conf"
    conf.mkdir()
    path = write(
        conf,
        HEAD
        + "source: {kind: files, path: ../incoming}\n"
        + "state: {path: s}\nsink: {path: ../incoming/}\n",
    )
    assert f"sink.path='{tmp_path / 'incoming'}' is not allowed: a location different from source.path" in (
        refused(path)
    )


def test_an_object_store_location_and_a_local_one_never_overlap(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEAD
        + SOURCE
        + "state: {path: 's3a://lake/incoming/state'}\nsink: {path: sink}\nstaging: {path: stage}\n",
    )
    assert load_config(path).state.path == "s3a://lake/incoming/state"
    path = write(
        tmp_path,
        HEAD
        + "source: {kind: files, path: 's3://lake/incoming'}\n"
        + "state: {path: 's3a://lake/incoming/_state'}\nsink: {path: sink}\nstaging: {path: stage}\n",
    )
    assert "state.path='s3a://lake/incoming/_state' is not allowed: a location outside source.path" in (
        refused(path)
    )


def test_staging_inside_state_stays_the_default_but_not_state_itself(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + "staging: {path: state/_staging}\n")
    assert load_config(path).staging.path == str(tmp_path / "state" / "_staging")
    path = write(tmp_path, HEAD + SOURCE + PLACES + "staging: {path: state/}\n")
    assert "staging.path=" in refused(path) and "a location different from state.path" in refused(path)


# --------------------------------------------------------------------------- parallelism


def test_parallelism_above_the_limit_is_refused_with_how_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HEAD + "parallelism: 100000\n" + SOURCE + PLACES)
    message = refused(path)
    assert message.startswith(
        f"[CONFIG_ERROR] parallelism=100000 is not allowed: an integer from 1 to {MAX_PARALLELISM}; "
    )
    assert f"use at most {MAX_PARALLELISM}" in message and str(path) in message
    rc, err = status_rc(path, capsys)
    assert rc == 2 and "parallelism=100000 is not allowed" in err
    assert "about 1 s an epoch at 10,000 regions" in message  # the reason of the cap
    write(tmp_path, HEAD + f"parallelism: {MAX_PARALLELISM}\n" + SOURCE + PLACES)
    assert MAX_PARALLELISM == 10_000 and load_config(path).parallelism == MAX_PARALLELISM


@pytest.mark.parametrize("value", ["0", "257", "true", "'8'", "2.5"])
def test_max_concurrent_regions_out_of_range_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    path = write(tmp_path, HEAD + f"max_concurrent_regions: {value}\n" + SOURCE + PLACES)
    message = refused(path)
    assert message.startswith("[CONFIG_ERROR] max_concurrent_regions="), message
    assert f"an integer from 1 to {MAX_CONCURRENT_REGIONS}" in message, message
    rc, err = status_rc(path, capsys)
    assert rc == 2 and "max_concurrent_regions=" in err


def test_max_concurrent_regions_is_optional_and_reaches_the_runtime(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    assert load_config(path).max_concurrent_regions is None
    write(tmp_path, HEAD + f"max_concurrent_regions: {MAX_CONCURRENT_REGIONS}\n" + SOURCE + PLACES)
    assert load_config(path).max_concurrent_regions == MAX_CONCURRENT_REGIONS == 256
    write(tmp_path, HEAD + "max_concurrent_regions: 1\n" + SOURCE + PLACES)
    assert load_config(path).max_concurrent_regions == 1


def test_max_concurrent_regions_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An epoch's regions are the tasks of one Spark job: the key has nothing left to bound, and a
    pipeline file that sets it keeps loading and running, with a warning naming the key (given once,
    when the file is loaded; nothing threads the value to the runtime)."""
    load_config(write(tmp_path, HEAD + SOURCE + PLACES))
    assert "max_concurrent_regions" not in caplog.text
    load_config(write(tmp_path, HEAD + "max_concurrent_regions: 8\n" + SOURCE + PLACES))
    assert "max_concurrent_regions=8 is ignored" in caplog.text


def test_recover_refuses_a_rescale_above_the_limit_before_opening_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitkeeper.app import recover, services

    def opened(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pipeline was opened")

    monkeypatch.setattr(recover, "_pipeline", opened)
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    rc = main(["recover", "--config", str(path), "--parallelism", "100000", "--dry-run"])
    assert rc == 2
    assert (
        f"--parallelism=100000 is not allowed: an integer from 1 to {MAX_PARALLELISM}"
        in capsys.readouterr().err
    )
    with pytest.raises(
        Exception, match=f"parallelism=100000 is not allowed: an integer from 1 to {MAX_PARALLELISM}"
    ):
        services.recover(load_config(path), parallelism=100000, dry_run=True)


# --------------------------------------------------------------------------- parsing limits


def test_duplicate_yaml_keys_are_refused_naming_the_key_and_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HEAD + "parallelism: 2\n" + SOURCE + PLACES + "parallelism: 3\n")
    message = refused(path)
    assert message == (
        "[CONFIG_ERROR] parallelism is given twice (lines 2 and 6), which is not allowed: each key once in a "
        f"mapping; keep one of them (YAML would silently keep the last) ({path})"
    )
    rc, err = status_rc(path, capsys)
    assert rc == 2 and "parallelism is given twice" in err

    path = write(tmp_path, HEAD + "source:\n  kind: files\n  path: a\n  'path': b\n" + PLACES)
    assert "source.path is given twice (lines 4 and 5)" in refused(path)


def test_yaml_merge_keys_may_still_override_what_they_merge(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + SOURCE + "state: &base {path: state}\nsink:\n  <<: *base\n  path: sink\n")
    assert load_config(path).sink.path == str(tmp_path / "sink")


def test_a_5000_deep_config_is_refused_not_a_recursion_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = "[" * 5000 + "]" * 5000
    path = write(tmp_path, HEAD + SOURCE + PLACES + f"extra: {deep}\n")
    message = refused(path)
    assert message.startswith("[CONFIG_ERROR] extra[0][0]")
    assert f"is nested more than {MAX_DEPTH} levels deep, which is not allowed" in message
    assert "remove the nesting" in message
    rc, err = status_rc(path, capsys)
    assert rc == 2 and f"nested more than {MAX_DEPTH} levels deep" in err

    toml = write(tmp_path, 'name = "orders"\n' + f"extra = {deep}\n", "p.toml")
    assert f"nested more than {MAX_DEPTH} levels deep" in refused(toml)
    mapping = "{a = " * 5000 + "1" + "}" * 5000
    toml = write(tmp_path, 'name = "orders"\n' + f"extra = {mapping}\n", "q.toml")
    assert f"nested more than {MAX_DEPTH} levels deep" in refused(toml)


def _bomb(levels: int = 10, width: int = 10) -> str:
    """``levels`` anchors, each a list of ``width`` aliases of the one before: width**levels values."""
    lines = ["junk:", f"  l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_under_an_unknown_key_is_refused_without_expanding_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + _bomb())  # 10**10 values once expanded
    tracemalloc.start()
    try:
        message = refused(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == (
        f"[CONFIG_ERROR] junk holds more than {MAX_VALUES:,} values, which is not allowed: at most "
        f"{MAX_VALUES:,} values, each YAML alias (*name) counted as what it stands for; remove the aliases "
        f"or the key (nothing was expanded) ({path})"
    )
    # expanding even a millionth of it would take gigabytes: the refusal came from the document as written
    assert peak < 20 * 2**20, f"{peak:,} bytes"
    rc, err = status_rc(path, capsys)
    assert rc == 2 and "junk holds more than" in err


def test_a_document_too_big_as_written_is_refused_while_it_is_parsed(tmp_path: Path) -> None:
    keys = "".join(f"  k{i}: 1\n" for i in range(3 * MAX_VALUES))
    path = write(tmp_path, HEAD + SOURCE + PLACES + "junk:\n" + keys)
    assert f"junk holds more than {MAX_VALUES:,} values" in refused(path)


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + "junk: &loop [*loop]\n")
    assert "contains itself (a YAML alias inside its own anchor)" in refused(path)


def _run_args(config: Path, pipeline_json: str) -> argparse.Namespace:
    from splitkeeper.commands import run as run_command

    parser = argparse.ArgumentParser()
    run_command.configure(parser)
    return parser.parse_args(["--config", str(config), "--pipeline-json", pipeline_json])


def test_pipeline_json_overrides_get_the_same_limits(tmp_path: Path) -> None:
    from splitkeeper.commands import run as run_command

    path = write(tmp_path, HEAD + SOURCE + PLACES)
    with pytest.raises(ConfigError, match=r"ttl_s is given twice, which is not allowed: each key once"):
        run_command._load(_run_args(path, '{"lease": {"ttl_s": 9, "ttl_s": 10}}'))
    deep = '{"lease": ' + "[" * 5000 + "]" * 5000 + "}"
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels deep"):
        run_command._load(_run_args(path, deep))


def test_dag_param_overrides_given_as_a_mapping_get_the_same_limits(tmp_path: Path) -> None:
    from splitkeeper.airflow import tasks

    path = write(tmp_path, HEAD + SOURCE + PLACES)
    deep: Any = {}
    for _ in range(5000):
        deep = {"x": deep}
    with pytest.raises(ConfigError, match=f"nested more than {MAX_DEPTH} levels deep"):
        tasks._config(str(path), {"checkpoint": deep})
    shared: Any = ["v"] * 10
    for _ in range(9):
        shared = [shared] * 10
    with pytest.raises(ConfigError, match="holds more than"):
        tasks._config(str(path), {"metrics": {"junk": shared}})


def test_the_json_schema_states_the_parallelism_limit() -> None:
    from splitkeeper.config.models import json_schema

    assert json_schema()["properties"]["parallelism"]["maximum"] == MAX_PARALLELISM
    assert json_schema()["properties"]["max_concurrent_regions"]["maximum"] == MAX_CONCURRENT_REGIONS


# --------------------------------------------------------------------------- transforms


def test_os_system_is_not_a_transform(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, HEAD + SOURCE + PLACES + "transform: os:system\n")
    message = refused(path)
    assert message.startswith("[CONFIG_ERROR] transform='os:system' is not allowed: 'module:function' naming")
    assert "os:system is not marked as a transform" in message
    assert "decorate it in its module with @transform (from splitkeeper import transform)" in message
    rc = main(["run", "--config", str(path), "--epochs", "1"])  # refused at load: nothing runs
    assert rc == 2 and "os:system is not marked as a transform" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_only_functions_the_pipeline_code_marks_are_transforms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "guard_transforms.py").write_text(
        textwrap.dedent(
            """
            import pyarrow.compute as pc

            from splitkeeper import transform, vectorized


            def unmarked(value):
                return value


            @transform
            def shout(value):
                return value.upper()


            @vectorized
            def shout_column(values):
                return pc.utf8_upper(values)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, HEAD + SOURCE + PLACES + "transform: guard_transforms:unmarked\n")
    assert "guard_transforms:unmarked is not marked as a transform" in refused(path)
    for name in ("shout", "shout_column"):
        text = HEAD + SOURCE + PLACES + f"transform: guard_transforms:{name}\n"
        # a text transform on the default raw bytes is refused, naming the fix
        assert "set decode.kind: text" in refused(write(tmp_path, text))
        path = write(tmp_path, text + "decode: {kind: text}\n")
        assert load_config(path).transform_function == f"guard_transforms:{name}"


def test_every_transform_in_the_repository_is_marked() -> None:
    from splitkeeper import transforms
    from tests.runtime import test_file_native, test_staging

    for module in (transforms, test_staging, test_file_native):
        for name in ("identity", "enrich_json", "upper", "explode_on_v3", "returns_none", "upper_column"):
            if hasattr(module, name):
                assert transforms.is_transform(getattr(module, name)), f"{module.__name__}.{name}"


def test_the_decorators_are_importable_from_the_package_without_pyarrow() -> None:
    import splitkeeper
    from splitkeeper import transforms

    assert splitkeeper.transform is transforms.transform and splitkeeper.vectorized is transforms.vectorized
    code = "import sys, splitkeeper; print('pyarrow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_marked_transform_keeps_its_mark_through_pickling_and_on_a_spark_executor(spark: Any) -> None:
    from pyspark import cloudpickle

    from splitkeeper.transforms import enrich_json, is_transform, resolve_transform

    function = resolve_transform("splitkeeper.transforms:enrich_json")
    for dumps in (pickle.dumps, cloudpickle.dumps):
        again = pickle.loads(dumps(function))
        assert again is enrich_json and is_transform(again)

    def on_executor(value: str) -> tuple[bool, str]:
        return is_transform(function), function(value)

    record = '{"amount": 5, "user": "u"}'
    got = spark.sparkContext.parallelize([record], 1).map(on_executor).collect()
    assert got == [(True, enrich_json(record))] and '"amount_band":"small"' in got[0][1]


def test_readers_is_per_epoch_by_default_and_a_bad_value_or_a_spark_transform_is_refused(
    tmp_path: Path,
) -> None:
    """``readers``: a job per epoch unless the file says ``long_lived``; another word is refused naming
    the key and the choices, and long-lived readers with a spark transform are refused at load (the
    readers hold their cores for the run; the transform's jobs would wait for them)."""
    from splitkeeper.config.models import Readers

    path = write(tmp_path, HEAD + SOURCE + PLACES)
    assert load_config(path).readers is Readers.PER_EPOCH
    write(tmp_path, HEAD + "readers: long_lived\n" + SOURCE + PLACES)
    assert load_config(path).readers is Readers.LONG_LIVED
    write(tmp_path, HEAD + "readers: forever\n" + SOURCE + PLACES)
    message = refused(path)
    assert message.startswith("[CONFIG_ERROR] readers='forever' is not allowed: one of per_epoch, long_lived")
    spark = "transform: {kind: spark, function: 'tests.runtime.spark_functions:orders'}\n"
    write(tmp_path, HEAD + "readers: long_lived\n" + SOURCE + PLACES + spark)
    message = refused(path)
    assert message.startswith("[CONFIG_ERROR] readers='long_lived' is not allowed: per_epoch with "), message
    assert "remove readers (per_epoch is the default) or use a Python transform" in message, message
