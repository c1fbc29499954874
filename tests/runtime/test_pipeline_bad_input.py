"""Bad input through the CLI: a clear message on stderr, exit code 2, and nothing written.

The commands run in-process (``splitkeeper.cli.main``). The tests that need a
pipeline with state share one (two epochs of a three-file input, not finished)
and each proves it left that state and sink exactly as they were: the Delta
versions of every state table and of the sink, the checkpoint ids, the sink's
row count.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.delta.schemas import STATE_TABLES
from splitkeeper.delta.tables import open_table
from splitkeeper.sources import build_source

from .helpers import pipeline_mapping, run_cli, run_pipeline, sink_rows, write_config, write_input


@dataclass(frozen=True)
class Existing:
    """A pipeline that ran two of its three epochs: its config (mapping, file, validated) and input."""

    mapping: dict[str, Any]
    config_path: Path
    config: PipelineConfig
    input_dir: Path
    root: Path


@dataclass(frozen=True)
class StateFingerprint:
    table_versions: dict[str, int]
    sink_version: int
    checkpoint_ids: tuple[int, ...]
    latest_plan_epoch: int | None
    sink_records: int


def _fingerprint(spark: Any, existing: Existing) -> StateFingerprint:
    config = existing.config
    store = DeltaStateStore(
        config.state.path, config.name, build_source(config.source).fingerprint(), read_only=True
    )
    sink = open_table(config.sink.path)
    assert sink is not None
    return StateFingerprint(
        table_versions={t: store.table_version(t) for t in STATE_TABLES},
        sink_version=sink.version(),
        checkpoint_ids=tuple(store.checkpoint_ids()),
        latest_plan_epoch=store.latest_plan_epoch(),
        sink_records=len(sink_rows(config.sink.path)),
    )


@pytest.fixture(scope="module")
def existing(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Existing:
    root = tmp_path_factory.mktemp("existing")
    input_dir = root / "in"
    write_input(input_dir, files=3, lines=60)
    mapping = pipeline_mapping(root, "orders", input_dir, epoch_records=60)
    config = config_from_mapping(mapping)
    summary = run_pipeline(config, spark, epochs=2)
    assert [e.epoch for e in summary.epochs] == [1, 2] and not summary.finished
    return Existing(mapping, write_config(root / "orders.yaml", mapping), config, input_dir, root)


@pytest.fixture
def unchanged(spark: Any, existing: Existing) -> Iterator[StateFingerprint]:
    """The existing pipeline's state and sink must be the same after the test as before it."""
    before = _fingerprint(spark, existing)
    assert before.checkpoint_ids == (1, 2) and before.sink_records > 0
    yield before
    assert _fingerprint(spark, existing) == before


# --------------------------------------------------------------------------- no Spark needed


def test_config_error_names_the_key_and_suggests_the_right_one(tmp_path: Path) -> None:
    mapping = pipeline_mapping(tmp_path, "typo", tmp_path / "in", region_timeout_s=9)
    mapping["checkpoint"]["region_timeout"] = mapping["checkpoint"].pop("region_timeout_s")
    config_path = write_config(tmp_path / "typo.yaml", mapping)

    code, out, err = run_cli(["run", "--config", str(config_path)])

    assert code == 2 and out == ""
    assert "[CONFIG_ERROR]" in err
    assert "checkpoint.region_timeout=9" in err
    assert "did you mean 'checkpoint.region_timeout_s'?" in err
    assert str(config_path) in err
    assert not (tmp_path / "state").exists() and not (tmp_path / "sink").exists()


def test_config_error_for_a_bad_value_names_key_value_and_allowed(tmp_path: Path) -> None:
    mapping = pipeline_mapping(tmp_path, "zero", tmp_path / "in", parallelism=0)
    config_path = write_config(tmp_path / "zero.yaml", mapping)

    code, _out, err = run_cli(["run", "--config", str(config_path)])

    assert code == 2
    assert "parallelism=0 is not allowed" in err and ">= 1" in err


def test_recover_with_parallelism_zero_is_refused_before_anything_starts(tmp_path: Path) -> None:
    mapping = pipeline_mapping(tmp_path, "p0", tmp_path / "in")
    config_path = write_config(tmp_path / "p0.yaml", mapping)

    code, _out, err = run_cli(["recover", "--config", str(config_path), "--parallelism", "0"])

    assert code == 2
    assert "--parallelism=0 is not allowed: an integer >= 1" in err
    assert not (tmp_path / "state").exists()


def test_recover_with_a_checkpoint_that_is_not_an_id_is_refused(tmp_path: Path) -> None:
    config_path = write_config(tmp_path / "c.yaml", pipeline_mapping(tmp_path, "c", tmp_path / "in"))

    code, _out, err = run_cli(["recover", "--config", str(config_path), "--checkpoint", "first"])

    assert code == 2
    assert "--checkpoint='first' is not allowed" in err and "'latest'" in err


# --------------------------------------------------------------------------- against existing state


@pytest.mark.spark
def test_missing_input_path_raises_source_error_naming_it_and_writes_nothing(
    spark: Any, existing: Existing, unchanged: StateFingerprint
) -> None:
    moved = existing.root / "moved-away"
    existing.input_dir.rename(moved)
    try:
        code, out, err = run_cli(["run", "--config", str(existing.config_path)])
    finally:
        moved.rename(existing.input_dir)

    assert code == 2 and out == ""
    assert "[SOURCE_ERROR]" in err
    assert f"source.path {existing.input_dir} does not exist" in err


@pytest.mark.spark
def test_state_of_another_pipeline_is_refused_naming_both_and_left_unchanged(
    spark: Any, existing: Existing, unchanged: StateFingerprint, tmp_path: Path
) -> None:
    other = json.loads(json.dumps(existing.mapping))
    other["name"] = "payments"
    config_path = write_config(tmp_path / "payments.yaml", other)  # same state.path and sink.path

    code, out, err = run_cli(["run", "--config", str(config_path)])

    assert code == 2 and out == ""
    assert "[STATE_ERROR]" in err
    assert "belongs to pipeline 'orders', not to pipeline 'payments'" in err
    assert existing.config.state.path in err


@pytest.mark.spark
def test_recover_from_an_unknown_checkpoint_names_it_and_the_available_ones(
    spark: Any, existing: Existing, unchanged: StateFingerprint
) -> None:
    code, out, err = run_cli(["recover", "--config", str(existing.config_path), "--checkpoint", "999"])

    assert code == 2 and out == ""
    assert "[CHECKPOINT_ERROR]" in err
    assert "checkpoint 999" in err
    assert "available: [1, 2]" in err


@pytest.mark.spark
def test_recover_from_an_older_checkpoint_is_refused_because_it_would_read_twice(
    spark: Any, existing: Existing, unchanged: StateFingerprint
) -> None:
    code, _out, err = run_cli(["recover", "--config", str(existing.config_path), "--checkpoint", "1"])

    assert code == 2
    assert "checkpoint 1 is not the latest (2)" in err
    assert "twice" in err and "--rewind" in err and "can be restored: [1]" in err


@pytest.mark.spark
def test_the_existing_pipeline_still_finishes_with_sink_equals_source(spark: Any, existing: Existing) -> None:
    """After all the refused commands, the pipeline they targeted runs to completion exactly-once."""
    from .helpers import assert_sink_equals_source

    code, out, err = run_cli(["run", "--config", str(existing.config_path), "--json"])

    assert code == 0, err
    assert json.loads(out)["finished"] is True
    assert_sink_equals_source(spark, existing.config.sink.path, existing.input_dir)
    shutil.rmtree(existing.root / "moved-away", ignore_errors=True)
