"""A Spark transform (``transform: {kind: spark, function: 'module:fn'}``) end to end: a files
pipeline of JSON orders, one Spark session, real Delta tables.

The sink holds exactly what the function makes of the records (compared by content, every row
traced back to its source line); the ``filtered.parquet`` ranges beside the committed outputs
cover exactly the offsets it dropped; a function that raises (on an executor, inside a UDF) fails
every region of the epoch with its own traceback and commits nothing, and a rerun with a fixed
function commits everything; a function that invents a row or loses an offset fails the epoch
naming the rule. Functions: :mod:`tests.runtime.spark_functions`.
"""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from splitkeeper.app import services
from splitkeeper.app.services import leased_pipeline
from splitkeeper.config.settings import PipelineConfig, config_from_mapping
from splitkeeper.core.types import RegionOutcome
from splitkeeper.delta.schemas import FILTERED_SCHEMA
from splitkeeper.errors import ConfigError
from splitkeeper.sinks.delta.read import read_sink
from splitkeeper.spark.faults import CRASH_ENV

from . import spark_functions
from .helpers import REPO, pipeline_mapping, run_pipeline, splitkeeper_subprocess, write_config

pytestmark = pytest.mark.spark

FUNCTIONS = "tests.runtime.spark_functions"
KINDS = {"a": "Alpha", "b": "Beta"}


def _write_orders(
    input_dir: Path, files: int = 2, lines: int = 40, *, malformed: bool = False
) -> dict[tuple[str, int], tuple[int, dict | None]]:
    """JSON orders; every 5th line repeats the previous order (same order_no and content, a duplicate
    for dropDuplicates), kinds a, b and c (c is not in the dimension table), amounts 1 to 59;
    ``malformed``: every 11th line is cut short (a dead letter). The oracle: (file name, offset) ->
    (next_offset, the order, None for a malformed line)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    oracle: dict[tuple[str, int], tuple[int, dict | None]] = {}
    for f in range(files):
        name = f"orders-{f}.jsonl"
        data = b""
        order: dict[str, Any] = {}
        for i in range(lines):
            if i % 5 != 4:
                n = f * 1000 + i
                order = {
                    "order_no": f"o{n}",
                    "id": n,
                    "kind": "abc"[i % 3],
                    "amount": f"{(n * 7) % 59 + 1}.25",
                }
            line = json.dumps(order).encode()
            bad = malformed and i % 11 == 6
            line = line[:-5] if bad else line
            oracle[(name, len(data))] = (len(data) + len(line) + 1, None if bad else order)
            data += line + b"\n"
        (input_dir / name).write_bytes(data)
    return oracle


def _config(
    tmp_path: Path, name: str, function: str, **options: Any
) -> tuple[PipelineConfig, dict[str, Any]]:
    input_dir = tmp_path / "in"
    if not input_dir.exists():
        _write_orders(input_dir)
    mapping = pipeline_mapping(
        tmp_path, name, input_dir, parallelism=2, epoch_records=options.pop("epoch_records", 1000)
    )
    mapping["decode"] = {
        "kind": "json",
        "schema": "order_no STRING, id BIGINT, kind STRING, amount DECIMAL(10,2)",
    }
    mapping["transform"] = {"kind": "spark", "function": f"{FUNCTIONS}:{function}"}
    mapping.update(options)
    return config_from_mapping(mapping), mapping


def _filtered(config: PipelineConfig) -> list[dict[str, Any]]:
    """The filtered ranges the sink committed to the filtered table (``config.sink.filtered_path``)."""
    table = read_sink(config.sink.filtered_path)
    assert set(FILTERED_SCHEMA.names) <= set(table.schema.names)
    return table.to_pylist()


def _expected(oracle: dict[tuple[str, int], tuple[int, dict | None]]) -> Counter[tuple[Any, ...]]:
    """What ``orders`` makes of every order: filter, withColumn, join, one row per order_no."""
    rows = {}
    for _next, order in oracle.values():
        if order is None:
            continue
        amount = Decimal(order["amount"])
        if amount >= spark_functions.MIN_AMOUNT:
            rows[order["order_no"]] = (
                order["order_no"],
                order["id"],
                order["kind"],
                amount,
                int(amount * 100),
                KINDS.get(order["kind"]),
            )
    return Counter(rows.values())


def _sink(config: PipelineConfig) -> list[dict[str, Any]]:
    columns = [
        "split_id",
        "offset",
        "next_offset",
        "order_no",
        "id",
        "kind",
        "amount",
        "amount_cents",
        "kind_name",
        "epoch",
    ]
    return DeltaTable(config.sink.path).to_pyarrow_table(columns=columns).to_pylist()


def test_a_dataframe_transform_lands_its_rows_and_records_every_dropped_offset(
    spark: Any, tmp_path: Path
) -> None:
    """Several epochs, a sink partitioned by a column, malformed lines as dead letters: sink, dead
    letters and filtered ranges together account for every offset exactly once."""
    oracle = _write_orders(tmp_path / "in", malformed=True)
    config, _ = _config(
        tmp_path,
        "spark-orders",
        "orders",
        epoch_records=50,
        sink={"path": str(tmp_path / "sink"), "partition_by": ["kind"]},
        errors={"tolerance": "all", "dead_letter": {"path": str(tmp_path / "dead")}, "max_bad_ratio": 0.5},
    )
    summary = run_pipeline(config, spark)
    assert summary.finished and len(summary.epochs) >= 2
    assert DeltaTable(config.sink.path).metadata().partition_columns == ["kind"]

    rows = _sink(config)
    places = Counter((Path(r["split_id"]).name, r["offset"]) for r in rows)
    assert max(places.values()) == 1
    for r in rows:  # every row is its own source line's order, with its bookkeeping put back
        next_offset, order = oracle[(Path(r["split_id"]).name, r["offset"])]
        assert order is not None and r["order_no"] == order["order_no"] and r["next_offset"] == next_offset
    got = {(r["order_no"], r["id"], r["kind"], r["amount"], r["amount_cents"], r["kind_name"]) for r in rows}
    assert got == set(_expected(oracle))
    # dropDuplicates works within an epoch: an order is twice in the sink only from two epochs
    epochs: dict[str, list[int]] = {}
    for r in rows:
        epochs.setdefault(r["order_no"], []).append(r["epoch"])
    assert all(len(set(e)) == len(e) for e in epochs.values())

    dead = DeltaTable(config.errors.dead_letter.path).to_pyarrow_table(
        columns=["split_id", "offset", "stage"]
    )
    dead_places = Counter(
        (Path(s).name, o)
        for s, o in zip(dead["split_id"].to_pylist(), dead["offset"].to_pylist(), strict=True)
    )
    assert set(dead_places) == {k for k, (_n, order) in oracle.items() if order is None}

    # the filtered ranges cover exactly the offsets the function dropped, compactly
    covered: Counter[tuple[str, int]] = Counter()
    filtered = _filtered(config)
    for f in filtered:
        name = Path(f["split_id"]).name
        offset = f["start_offset"]
        for _ in range(f["records"]):
            covered[(name, offset)] += 1
            offset = oracle[(name, offset)][0]
        assert offset == f["end_offset"] and f["function"] == f"{FUNCTIONS}:orders"
    accounted = places + dead_places + covered
    assert set(accounted) == set(oracle) and max(accounted.values()) == 1  # each offset exactly once
    assert len(filtered) < len(covered)  # a run of consecutive dropped records is one range
    # and the restart checks agree: sink, dead letters and filtered ranges cover every offset once
    assert services.validate(config).success


def test_a_transform_that_shuffles_makes_every_checkpoint_global_and_says_so(
    spark: Any, tmp_path: Path
) -> None:
    """Protocol rule 2.9 (issue 39 item 5): ``orders`` drops duplicates across the epoch's records (an
    Exchange in its physical plan), so one region's output depends on another's records; the
    pipeline checkpoints globally only and says why. A row-by-row function keeps regions independent."""
    from splitkeeper.app.pipeline import record_policy
    from splitkeeper.spark.transform import SparkTransform

    config, _ = _config(tmp_path, "spark-shuffle", "orders", epoch_records=30)
    result = services.run(config, faults=["fail:1@2"])  # region 1 declines the second epoch
    kinds = [e.kind for e in result.epochs]
    assert kinds[:2] == ["global", "aborted"] and "regional" not in kinds  # before: regional, region 0 alone
    why = (
        f"global checkpoints only: regions are not independent (the spark transform {FUNCTIONS}:orders "
        "shuffles the epoch's records across regions (its physical plan has 1 exchange(s): Exchange "
        "hashpartitioning(order_no"
    )
    assert result.opened.mode.startswith(why)
    timeline = services.status(config).timeline
    assert timeline[-1].kind == "global" and f"(forced: {why}" in timeline[-1].reason
    narrow_config, _ = _config(tmp_path / "narrow", "spark-narrow", "narrow")
    narrow = SparkTransform(
        spark,
        narrow_config.transform_function,
        record_policy(narrow_config, spark),
        narrow_config.staging.path,
    )
    assert narrow.shuffles() == ()  # a broadcast of a static table moves none of the records


def test_a_raising_function_fails_every_region_with_its_traceback_and_a_fixed_one_commits_all(
    spark: Any, tmp_path: Path
) -> None:
    oracle = _write_orders(tmp_path / "in")
    config, mapping = _config(tmp_path, "spark-raising", "raising")
    with leased_pipeline(config, spark, metrics=False) as pipeline:
        pipeline.open()
        report = pipeline.run_epoch()
    assert report.outcomes and set(report.outcomes.values()) == {RegionOutcome.DECLINE}
    assert report.committed_records == 0
    for error in report.region_errors.values():
        assert error.startswith(f"{FUNCTIONS}:raising")
        assert "ValueError: amount" in error and "too large for this function" in error
        assert 'raise ValueError(f"amount {amount} is too large' in error  # the user's line of code
        assert "\tat org.apache" not in error and "py4j" not in error.lower()
    assert not DeltaTable(config.sink.path).to_pyarrow_table().num_rows if _exists(config.sink.path) else True

    mapping["transform"] = {"kind": "spark", "function": f"{FUNCTIONS}:orders"}
    fixed = config_from_mapping(mapping)
    assert run_pipeline(fixed, spark).finished
    rows = _sink(fixed)
    got = Counter(
        (r["order_no"], r["id"], r["kind"], r["amount"], r["amount_cents"], r["kind_name"]) for r in rows
    )
    assert got == _expected(oracle)  # one epoch read everything: exactly one row per kept order


def _exists(path: str) -> bool:
    return Path(path, "_delta_log").exists()


@pytest.mark.parametrize(
    ("function", "rule", "example"),
    [
        ("inventing", "no rows invented", "which the epoch did not read"),
        ("keyless", "every output row keeps split_id and offset", "offset None"),
        ("duplicating", "no rows invented", "2 times (at most once)"),
        ("raising_on_driver", "RuntimeError: the plan cannot be built", "raise RuntimeError"),
        ("drifting", "has column 'amount_cents' of type string", "the sink's 'amount_cents' is bigint"),
    ],
)
def test_a_broken_contract_fails_the_epoch_naming_the_function_and_the_rule(
    function: str, rule: str, example: str, spark: Any, tmp_path: Path
) -> None:
    config, _ = _config(tmp_path, f"spark-{function}".replace("_", "-"), function)
    with leased_pipeline(config, spark, metrics=False) as pipeline:
        pipeline.open()
        report = pipeline.run_epoch()
    assert set(report.outcomes.values()) == {RegionOutcome.DECLINE} and report.committed_records == 0
    error = next(iter(report.region_errors.values()))
    assert error.startswith(f"{FUNCTIONS}:{function}") and rule in error and example in error, error


def test_the_upsert_key_is_checked_against_the_transform_output(spark: Any, tmp_path: Path) -> None:
    config, _ = _config(
        tmp_path,
        "spark-upsert-key",
        "orders",
        sink={"path": str(tmp_path / "sink"), "mode": "upsert", "key": ["nope"]},
    )
    with (
        pytest.raises(ConfigError, match=r"sink\.key.*'nope'.*amount_cents"),
        leased_pipeline(config, spark, metrics=False),
    ):
        pass


def test_without_a_spark_transform_none_is_built(spark: Any, tmp_path: Path) -> None:
    """An append pipeline with a python transform runs no spark-transform code: the runner has none
    and the region tasks stage the sink's schema (the policy as before)."""
    config, mapping = _config(tmp_path, "python-transform", "orders")
    mapping["transform"] = "splitkeeper.transforms:add_amount_cents"
    config = config_from_mapping(mapping)
    with leased_pipeline(config, spark, metrics=False) as pipeline:
        assert pipeline.driver.runner.spark_transform is None  # type: ignore[attr-defined]
        assert pipeline.policy.schema.names[3:8] == ["order_no", "id", "kind", "amount", "_rescued"]
        assert "amount_cents" in pipeline.policy.schema.names


@pytest.mark.slow
@pytest.mark.parametrize(  # about 45 s each here: CI kills at one of them, the other is a slow variant
    "point", [pytest.param("after_decision", marks=pytest.mark.slow_variant), "after_sink_commit"]
)
def test_killed_around_the_sink_commit_of_a_transformed_epoch_recovers_exactly(
    point: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL (a child ``splitkeeper run``) at a crash point of epoch 2, then a run to the end in
    this process: every kept order is in the sink once, every malformed line a dead letter once,
    every row its own source line's order; the offsets neither holds are ones ``orders`` drops."""
    monkeypatch.delenv(CRASH_ENV, raising=False)
    oracle = _write_orders(tmp_path / "in", malformed=True)
    config, mapping = _config(
        tmp_path,
        f"spark-crash-{point}".replace("_", "-"),
        "orders",
        epoch_records=30,
        errors={"tolerance": "all", "dead_letter": {"path": str(tmp_path / "dead")}, "max_bad_ratio": 0.5},
    )
    config_path = write_config(tmp_path / "pipeline.yaml", mapping)
    crashed = splitkeeper_subprocess(
        ["run", "--config", str(config_path)], **{CRASH_ENV: f"{point}@2", "PYTHONPATH": str(REPO)}
    )
    assert crashed.returncode == -9, f"expected SIGKILL, got {crashed.returncode}:\n{crashed.stderr[-3000:]}"
    assert run_pipeline(config, spark).finished

    rows = _sink(config)
    places = Counter((Path(r["split_id"]).name, r["offset"]) for r in rows)
    dead = DeltaTable(config.errors.dead_letter.path).to_pyarrow_table(columns=["split_id", "offset"])
    dead_places = Counter(
        (Path(s).name, o)
        for s, o in zip(dead["split_id"].to_pylist(), dead["offset"].to_pylist(), strict=True)
    )
    assert max((places + dead_places).values()) == 1  # nothing twice, in either table or across
    assert set(dead_places) == {k for k, (_n, order) in oracle.items() if order is None}
    for r in rows:
        next_offset, order = oracle[(Path(r["split_id"]).name, r["offset"])]
        assert order is not None and r["order_no"] == order["order_no"] and r["next_offset"] == next_offset
    got = {(r["order_no"], r["id"], r["kind"], r["amount"], r["amount_cents"], r["kind_name"]) for r in rows}
    assert got == set(_expected(oracle))
    for key in set(oracle) - set(places) - set(dead_places):  # the rest: dropped by the filter or a duplicate
        order = oracle[key][1]
        assert order is not None
        assert Decimal(order["amount"]) < spark_functions.MIN_AMOUNT or order["order_no"] in {
            r["order_no"] for r in rows
        }


def test_a_hanging_transform_is_cancelled_at_the_region_timeout_and_its_epoch_commits_nothing(
    spark: Any, tmp_path: Path
) -> None:
    """Issue 36, item 17: a UDF sleeping 3,600 s ran past ``region_timeout_s: 15`` until SIGTERM. The
    transform step now has the region timeout as its deadline: its job is cancelled, every region of
    the epoch times out naming the function, nothing is committed, and a fixed function then commits
    everything."""
    import time

    oracle = _write_orders(tmp_path / "in")
    config, mapping = _config(tmp_path, "spark-hanging", "hanging")
    mapping["checkpoint"]["region_timeout_s"] = 8
    config = config_from_mapping(mapping)
    with leased_pipeline(config, spark, metrics=False) as pipeline:
        pipeline.open()
        began = time.monotonic()
        report = pipeline.run_epoch()
        took = time.monotonic() - began
    assert report.outcomes and set(report.outcomes.values()) == {RegionOutcome.TIMEOUT}
    assert report.committed_records == 0 and not _exists(config.sink.path) or not _sink(config)
    for error in report.region_errors.values():
        assert error.startswith(f"{FUNCTIONS}:hanging: did not finish within 8s") and "cancelled" in error
    assert took < 60, f"the epoch took {took:.0f}s"

    mapping["transform"] = {"kind": "spark", "function": f"{FUNCTIONS}:orders"}
    fixed = config_from_mapping(mapping)
    assert run_pipeline(fixed, spark).finished  # the session is fine: the hung tasks are gone
    rows = _sink(fixed)
    got = Counter(
        (r["order_no"], r["id"], r["kind"], r["amount"], r["amount_cents"], r["kind_name"]) for r in rows
    )
    assert got == _expected(oracle)
