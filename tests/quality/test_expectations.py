"""The protocol section 6 restart checks as Great Expectations suites, on real Delta state and sink tables.

Each test writes a small pipeline state with the Delta state store (two readers, four
Kafka-like splits of subscription ``orders`` plus a finished bounded split), a sink
table with its records, optionally injects one corruption, runs the suites and checks
which expectation failed and which split it names.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from splitkeeper.core.source import LostRange
from splitkeeper.core.types import (
    AuditRecord,
    CheckpointKind,
    CompletedCheckpoint,
    EnumeratorSnapshot,
    RecoveryDecision,
    RegionOutcome,
    RegionState,
    Split,
)
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.errors import CheckpointError, ConfigError, InvariantViolation
from splitkeeper.quality.checks import (
    SUITES,
    CheckReport,
    SuiteStatus,
    load_suite_specs,
    raise_on_failure,
    run_restart_checks,
)
from splitkeeper.sinks.delta.read import DeltaSinkReader

pytestmark = pytest.mark.spark

SUB = "orders"
SOURCE_SPLITS = [Split(f"orders-{i}", SUB, 0) for i in range(4)] + [Split("orders-9", SUB, 0, end=3)]
SINK_SCHEMA = "split_id STRING, offset BIGINT, next_offset BIGINT, value STRING, epoch BIGINT, region INT"


def s(i: int, position: int) -> Split:
    return Split(f"orders-{i}", SUB, position)


@dataclass
class Scenario:
    """What the state store commits and what the sink holds (split, offset, next, epoch, region)."""

    checkpoints: list[CompletedCheckpoint]
    sink: list[tuple[str, int, int, int, int]]
    audit: dict[int, list[AuditRecord]] = field(default_factory=dict)


def _checkpoint(
    cid: int,
    reader0: tuple[Split, ...],
    reader1: tuple[Split, ...],
    *,
    failed1: tuple[int, int] | None = None,
    pool: tuple[Split, ...] = (),
    finished: frozenset[str] = frozenset({"orders-9"}),
    enumerator_readers: dict[int, tuple[Split, ...]] | None = None,
) -> CompletedCheckpoint:
    """Checkpoint ``cid``: region 0 acks; region 1 acks or (``failed1`` = (ref, depth)) declines."""
    region1 = RegionState(region_id=1, splits=reader1, operator_state=(f"r1@{cid}",))
    if failed1 is not None:
        ref, depth = failed1
        region1 = replace(region1, ref_checkpoint_id=ref, ref_depth=depth, outcome=RegionOutcome.DECLINE)
    regions = {0: RegionState(region_id=0, splits=reader0, operator_state=(f"r0@{cid}",)), 1: region1}
    enumerator = EnumeratorSnapshot(
        checkpoint_id=cid,
        parallelism=2,
        pool=pool,
        assignments=enumerator_readers if enumerator_readers is not None else {0: reader0, 1: reader1},
        finished=finished,
        subscriptions=frozenset({SUB}),
    )
    return CompletedCheckpoint(
        checkpoint_id=cid,
        kind=CheckpointKind.REGIONAL if failed1 else CheckpointKind.GLOBAL,
        parallelism=2,
        regions=regions,
        enumerator=enumerator,
        consecutive_regional=failed1[1] if failed1 else 0,
    )


def _records(
    split_id: str, start: int, end: int, epoch: int, region: int
) -> list[tuple[str, int, int, int, int]]:
    return [(split_id, o, o + 1, epoch, region) for o in range(start, end)]


def healthy() -> Scenario:
    """Checkpoint 1 global (all at 5), checkpoint 2 regional (region 1 declined, refers to 1)."""
    cp1 = _checkpoint(1, (s(0, 5), s(2, 5)), (s(1, 5), s(3, 5)))
    cp2 = _checkpoint(2, (s(0, 10), s(2, 10)), (s(1, 5), s(3, 5)), failed1=(1, 1))
    sink = _records("orders-9", 0, 3, 1, 0)
    for i in range(4):
        sink += _records(f"orders-{i}", 0, 5, 1, i % 2)
    for i in (0, 2):
        sink += _records(f"orders-{i}", 5, 10, 2, 0)
    audit = {
        1: [AuditRecord(f"orders-{i}", i % 2, RecoveryDecision.ASSIGNED, 1) for i in range(4)],
        2: [AuditRecord("orders-1", 1, RecoveryDecision.RETURNED_REGION_FALLBACK, 2, "region 1 declined")],
    }
    return Scenario([cp1, cp2], sink, audit)


PIPELINE = "orders-pipeline"


def write(
    spark, root: Path, scenario: Scenario, split_weights: dict[str, float] | None = None
) -> tuple[DeltaStateStore, str]:
    """Commit the scenario's checkpoints with the Delta state store; write its sink table.

    ``split_weights``: what a weighted pipeline's driver records with each checkpoint."""
    from pyspark.sql import functions as F

    store = DeltaStateStore(root / "state", PIPELINE, "kafka:orders")
    for cp in scenario.checkpoints:
        store.commit_checkpoint(
            decision_for(cp, scenario.audit.get(cp.checkpoint_id, ()), split_weights=split_weights)
        )
    sink_path = str(root / "sink")
    rows = [(sid, o, n, f"v{sid}:{o}", e, r) for sid, o, n, e, r in scenario.sink]
    frame = spark.createDataFrame(rows, SINK_SCHEMA).withColumn("ingested_at", F.current_timestamp())
    frame.write.format("delta").save(sink_path)
    return store, sink_path


def run_checks(spark, store, sink_path: str, docs: Path, **overrides) -> CheckReport:
    options = {
        "strategy": "round-robin",
        "max_consecutive_failures": 2,
        "subscriptions": {SUB},
        "data_docs_dir": docs,
        "source_splits": SOURCE_SPLITS,
    }
    options.update(overrides)
    return run_restart_checks(spark, store, sink_reader(sink_path, store, options), **options)


def sink_reader(sink_path: str, store, options: dict) -> DeltaSinkReader:
    """The reader of the Delta sink at ``sink_path`` with the side tables ``options`` names (taken out
    of them): what the checks read now instead of paths."""
    return DeltaSinkReader(
        str(sink_path),
        store.pipeline_name,
        upsert=options.pop("upsert", None),
        changes_path=_text(options.pop("changes_path", None)),
        dead_letter_path=_text(options.pop("dead_letter_path", None)),
        filtered_path=_text(options.pop("filtered_path", None)),
    )


def _text(path) -> str | None:
    return None if path is None else str(path)


@pytest.fixture(scope="module")
def healthy_state(spark, tmp_path_factory) -> Path:
    """The healthy scenario written once; tests that change it work on a copy."""
    root = tmp_path_factory.mktemp("healthy")
    write(spark, root, healthy())
    return root


def copy_of(spark, healthy_state: Path, tmp_path: Path) -> tuple[DeltaStateStore, str]:
    root = tmp_path / "copy"
    shutil.copytree(healthy_state, root)
    return DeltaStateStore(root / "state", PIPELINE, "kafka:orders"), str(root / "sink")


def failing(report: CheckReport) -> dict[tuple[str, str], tuple[str, ...]]:
    """(suite, expectation(target)) -> offending split ids, for every failed expectation."""
    return {
        (suite.key, f"{e.expectation}({e.target})"): e.split_ids
        for suite in report.suites
        for e in suite.expectations
        if not e.success
    }


# ---------------------------------------------------------------------------------------
# Healthy state
# ---------------------------------------------------------------------------------------


def test_healthy_regional_state_passes_every_suite_and_builds_data_docs(spark, healthy_state, tmp_path):
    store = DeltaStateStore(healthy_state / "state", PIPELINE, "kafka:orders")
    report = run_checks(spark, store, str(healthy_state / "sink"), tmp_path / "docs")

    assert report.success, report.summary()
    assert [suite.key for suite in report.suites] == list(SUITES)
    assert all(suite.status is SuiteStatus.PASSED for suite in report.suites)
    assert report.checkpoint_id == 2
    assert report.suite("sink_records").rows == 5  # one row per split with records
    assert report.suite("sink_records").notes == (
        "33 sink record(s) of epochs up to checkpoint 2 summarised",
    )
    assert report.suite("ownership").rows == 4
    assert report.suite("balance").rows == 2
    assert report.data_docs_index == (tmp_path / "docs" / "index.html").resolve()
    index = report.data_docs_index.read_text(encoding="utf-8")
    assert "splitkeeper_ownership" in index and "splitkeeper_sink_records" in index
    raise_on_failure(report)  # does not raise


def test_checking_an_older_checkpoint_ignores_sink_records_of_later_epochs(spark, healthy_state, tmp_path):
    store = DeltaStateStore(healthy_state / "state", PIPELINE, "kafka:orders")
    report = run_checks(spark, store, str(healthy_state / "sink"), tmp_path / "docs", checkpoint_id=1)

    assert report.success, report.summary()
    assert report.checkpoint_id == 1
    assert report.suite("sink_records").notes == (
        "23 sink record(s) of epochs up to checkpoint 1 summarised",
    )
    assert any("10 record(s) of epochs after checkpoint 1" in n for n in report.notes)


def test_a_missing_sink_is_checked_as_empty_without_starting_spark(healthy_state, tmp_path):
    """No sink table yet: a note says so, every split with a committed position misses its
    records, and the Spark session (a function here) is never asked for."""
    root = tmp_path / "copy"
    shutil.copytree(healthy_state / "state", root / "state")
    store = DeltaStateStore(root / "state", PIPELINE, "kafka:orders")
    asked: list[str] = []

    def session():
        asked.append("spark")
        raise AssertionError("the restart checks asked for Spark with no sink to scan")

    report = run_checks(session, store, str(root / "sink"), tmp_path / "docs")

    assert asked == []
    assert f"no sink table at {root / 'sink'} yet: the sink is checked as empty" in report.notes
    assert failing(report) == {
        ("sink_splits", "expect_column_values_to_be_null(offset_missing)"): (
            "orders-0",
            "orders-1",
            "orders-2",
            "orders-3",
            "orders-9",
        )
    }
    assert report.suite("sink_records").rows == 0


def test_the_data_docs_index_lists_every_validation_and_keeps_the_latest(
    healthy_state, tmp_path, monkeypatch
):
    """Issue 23: the index listed only the last validation (results were kept in memory). They are
    kept beside the site now, the latest KEEP_VALIDATIONS per suite. Runs without Spark (no sink)."""
    from splitkeeper.quality import checks

    root = tmp_path / "copy"
    shutil.copytree(healthy_state / "state", root / "state")
    store = DeltaStateStore(root / "state", PIPELINE, "kafka:orders")
    docs = tmp_path / "docs"

    def no_spark():
        raise AssertionError("no sink: Spark is not needed")

    for checkpoint_id in (2, 1):
        report = run_checks(no_spark, store, str(root / "sink"), docs, checkpoint_id=checkpoint_id)
    assert report.data_docs_index is not None
    index = report.data_docs_index.read_text(encoding="utf-8")
    for checkpoint_id in (1, 2):
        assert index.count(f"{PIPELINE}-checkpoint-{checkpoint_id}") >= len(SUITES), checkpoint_id
    kept = sorted(
        p.relative_to(checks.validations_dir(docs)) for p in checks.validations_dir(docs).rglob("*.json")
    )
    assert len(kept) == 2 * len(SUITES)
    assert all((docs / "validations" / p).with_suffix(".html").is_file() for p in kept)

    monkeypatch.setattr(checks, "KEEP_VALIDATIONS", 1)
    report = run_checks(no_spark, store, str(root / "sink"), docs, checkpoint_id=2)
    index = report.data_docs_index.read_text(encoding="utf-8")
    assert f"{PIPELINE}-checkpoint-1" not in index  # bounded: the older validations are gone
    assert len(list(checks.validations_dir(docs).rglob("*.json"))) == len(SUITES)
    pages = list((docs / "validations").rglob("*.html"))
    assert len(pages) == len(SUITES) and not any(f"{PIPELINE}-checkpoint-1" in str(p) for p in pages)


# ---------------------------------------------------------------------------------------
# Injected corruptions: each changes a copy of the healthy state the way a bug would
# ---------------------------------------------------------------------------------------


def _append_sink(spark, sink_path: str, rows: list[tuple[str, int, int, int, int]]) -> None:
    from pyspark.sql import functions as F

    frame = spark.createDataFrame([(sid, o, n, "dup", e, r) for sid, o, n, e, r in rows], SINK_SCHEMA)
    frame.withColumn("ingested_at", F.current_timestamp()).write.format("delta").mode("append").save(
        sink_path
    )


def _delete_sink(spark, sink_path: str, split_id: str, offset: int) -> None:
    from deltalake import DeltaTable

    DeltaTable(sink_path).delete(f"split_id = '{split_id}' AND offset = {offset}")


def _next_checkpoint(**changes) -> CompletedCheckpoint:
    """Checkpoint 3, global, at checkpoint 2's positions (no new records), with enumerator changes."""
    cp3 = _checkpoint(3, (s(0, 10), s(2, 10)), (s(1, 5), s(3, 5)))
    assert cp3.enumerator is not None
    return replace(cp3, enumerator=replace(cp3.enumerator, **changes))


def duplicated_record(spark, store, sink_path):
    _append_sink(spark, sink_path, [("orders-2", 7, 8, 2, 0)])


def malformed_record(spark, store, sink_path):
    _append_sink(spark, sink_path, [("orders-2", 7, 7, 2, 0)])  # ends where it starts


def gap_in_sink(spark, store, sink_path):
    _delete_sink(spark, sink_path, "orders-3", 2)


def _report_lost(store, *lost: LostRange) -> None:
    """Checkpoint 3 commits the audit records of ranges the planner skipped as lost."""
    store.commit_checkpoint(decision_for(_next_checkpoint(), [gone.audit_record(1, 2) for gone in lost]))


def gap_wider_than_reported_lost(spark, store, sink_path):
    _delete_sink(spark, sink_path, "orders-3", 2)
    _delete_sink(spark, sink_path, "orders-3", 3)
    _report_lost(store, LostRange("orders-3", 2, 3))  # offset 3 is missing too, and nobody said so


def split_owned_twice(spark, store, sink_path):
    readers = {0: (s(0, 10), s(2, 10), s(1, 5)), 1: (s(1, 5), s(3, 5))}
    store.commit_checkpoint(decision_for(_next_checkpoint(assignments=readers)))


def finished_split_assigned(spark, store, sink_path):
    readers = {0: (s(0, 10), s(2, 10)), 1: (s(1, 5), s(3, 5), Split("orders-9", SUB, 3, end=3))}
    store.commit_checkpoint(decision_for(_next_checkpoint(assignments=readers)))


def chain_too_deep(spark, store, sink_path):
    store.commit_checkpoint(
        decision_for(_checkpoint(3, (s(0, 10), s(2, 10)), (s(1, 5), s(3, 5)), failed1=(2, 2)))
    )
    store.commit_checkpoint(
        decision_for(_checkpoint(4, (s(0, 10), s(2, 10)), (s(1, 5), s(3, 5)), failed1=(3, 3)))
    )


def probe_chain(spark, store, sink_path):
    """The audit's probe in small: every region's own fallbacks stay 1 deep (``ref_depth`` 1), yet
    the checkpoints' chain 4 -> 3 -> 2 -> 1 is 3 hops, past max_consecutive_failures=2. The bound is
    the whole chain's (protocol rule 6.6; the FLIP-600 thread), so the restart check fails on 4."""
    for cid in (3, 4):
        store.commit_checkpoint(
            decision_for(_checkpoint(cid, (s(0, 10), s(2, 10)), (s(1, 5), s(3, 5)), failed1=(cid - 1, 1)))
        )


CORRUPTIONS = [
    (
        duplicated_record,
        "sink_records",
        "expect_column_values_to_be_null(offset_duplicate)",
        ("orders-2",),
    ),
    (
        malformed_record,
        "sink_records",
        "expect_column_values_to_be_null(offset_unexpected)",
        ("orders-2",),
    ),
    (
        gap_in_sink,
        "sink_records",
        "expect_column_values_to_be_null(offset_missing)",
        ("orders-3",),
    ),
    (
        gap_wider_than_reported_lost,
        "sink_records",
        "expect_column_values_to_be_null(offset_missing)",
        ("orders-3",),
    ),
    (split_owned_twice, "ownership", "expect_column_values_to_be_null(owned_more_than_once)", ("orders-1",)),
    (
        finished_split_assigned,
        "lifecycle",
        "expect_column_values_to_be_null(finished_assigned)",
        ("orders-9",),
    ),
    (
        chain_too_deep,
        "ref_chains",
        "expect_column_values_to_be_null(ref_chain_too_deep)",
        ("orders-1", "orders-3"),
    ),
    (
        probe_chain,
        "ref_chains",
        "expect_column_values_to_be_null(ref_chain_too_deep)",
        ("orders-1", "orders-3"),
    ),
]


@pytest.mark.parametrize(
    ("corrupt", "suite", "expectation", "split_ids"),
    CORRUPTIONS,
    ids=[c[0].__name__ for c in CORRUPTIONS],
)
def test_injected_corruption_fails_the_right_expectation_and_names_the_split(
    spark, healthy_state, tmp_path, corrupt, suite, expectation, split_ids
):
    store, sink_path = copy_of(spark, healthy_state, tmp_path)
    corrupt(spark, store, sink_path)
    report = run_checks(spark, store, sink_path, tmp_path / "docs")

    assert not report.success
    found = failing(report)
    assert found.get((suite, expectation)) == split_ids, report.summary()
    # Only the corrupted rule fails: the other suites still pass.
    assert set(found) == {(suite, expectation)}, report.summary()
    with pytest.raises(InvariantViolation) as raised:
        raise_on_failure(report)
    message = str(raised.value)
    assert expectation.split("(")[0] in message
    for split_id in split_ids:
        assert split_id in message
    assert raised.value.params["split_ids"] == split_ids
    if corrupt in (chain_too_deep, probe_chain):  # 3 (chain depth 2) is within the bound of 2; 4 is not
        [outcome] = report.suite("ref_chains").failed
        assert outcome.checkpoint_ids == (4,)
        assert outcome.rule == "ref_chain_too_deep"


def test_a_duplicate_written_by_a_later_epoch_is_no_part_of_an_older_checkpoint(
    spark, healthy_state, tmp_path
):
    store, sink_path = copy_of(spark, healthy_state, tmp_path)
    _append_sink(spark, sink_path, [("orders-0", 3, 4, 2, 0)])  # epoch 2 writes offset 3 again

    older = run_checks(spark, store, sink_path, tmp_path / "docs1", checkpoint_id=1)
    assert older.success, older.summary()
    assert any("11 record(s) of epochs after checkpoint 1" in n for n in older.notes)
    latest = run_checks(spark, store, sink_path, tmp_path / "docs2")
    assert failing(latest) == {
        ("sink_records", "expect_column_values_to_be_null(offset_duplicate)"): ("orders-0",)
    }, latest.summary()


def test_a_gap_reported_as_lost_in_the_audit_trail_is_accepted_and_named_in_the_notes(
    spark, healthy_state, tmp_path
):
    store, sink_path = copy_of(spark, healthy_state, tmp_path)
    _delete_sink(spark, sink_path, "orders-3", 2)
    _delete_sink(spark, sink_path, "orders-3", 3)
    # a replanned epoch reports again, with a later start: the ranges merge
    _report_lost(store, LostRange("orders-3", 2, 3), LostRange("orders-3", 2, 4))

    report = run_checks(spark, store, sink_path, tmp_path / "docs")

    assert report.success, report.summary()
    assert any("orders-3 [2, 4)" in note for note in report.notes), report.notes


def test_a_missing_tail_a_lost_split_and_a_removed_subscription_each_name_only_their_split(
    spark, healthy_state, tmp_path
):
    store, sink_path = copy_of(spark, healthy_state, tmp_path)
    _delete_sink(spark, sink_path, "orders-0", 9)  # the last record before the committed position 10
    readers = {0: (s(0, 10), s(2, 10)), 1: (s(1, 5),)}  # orders-3 lost: region 1 still holds it
    store.commit_checkpoint(
        decision_for(_next_checkpoint(assignments=readers, pool=(Split("returns-0", "returns", 0),)))
    )
    report = run_checks(spark, store, sink_path, tmp_path / "docs")

    assert failing(report) == {
        ("sink_splits", "expect_column_values_to_be_null(offset_missing)"): ("orders-0",),
        ("ownership", "expect_column_values_to_be_null(not_owned)"): ("orders-3",),
        ("lifecycle", "expect_column_values_to_be_null(removed_subscription)"): ("returns-0",),
    }, report.summary()
    assert {v.kind.value for v in report.violations()} == {
        "offset_missing",
        "not_owned",
        "removed_subscription",
    }
    assert report.split_ids == ("orders-0", "orders-3", "returns-0")


# ---------------------------------------------------------------------------------------
# Balance
# ---------------------------------------------------------------------------------------


def unbalanced() -> Scenario:
    """Reader 0 owns three splits, reader 1 one: a spread of 2."""
    cp1 = _checkpoint(1, (s(0, 5), s(1, 5), s(2, 5)), (s(3, 5),))
    sink = _records("orders-9", 0, 3, 1, 0)
    for i in range(4):
        sink += _records(f"orders-{i}", 0, 5, 1, 0 if i < 3 else 1)
    return Scenario([cp1], sink)


@pytest.fixture(scope="module")
def unbalanced_state(spark, tmp_path_factory) -> tuple[DeltaStateStore, str]:
    return write(spark, tmp_path_factory.mktemp("unbalanced"), unbalanced())


def test_balance_suite_names_the_overloaded_reader_for_a_balanced_strategy(spark, unbalanced_state, tmp_path):
    report = run_checks(spark, *unbalanced_state, tmp_path / "docs", strategy="least-loaded")

    balance = report.suite("balance")
    assert balance.status is SuiteStatus.FAILED
    [outcome] = balance.failed
    assert outcome.reader_ids == (0,)
    assert outcome.rule == "unbalanced"
    assert {s.key for s in report.failed_suites} == {"balance"}
    with pytest.raises(InvariantViolation, match="readers 0"):
        raise_on_failure(report)


def test_balance_is_skipped_with_a_note_for_legacy_hash(spark, unbalanced_state, tmp_path):
    report = run_checks(spark, *unbalanced_state, tmp_path / "docs", strategy="legacy-hash")

    balance = report.suite("balance")
    assert balance.status is SuiteStatus.SKIPPED
    assert report.success, report.summary()
    assert "legacy-hash is not balanced" in balance.notes[0]
    assert "{0: 3, 1: 1}" in balance.notes[0]
    assert "skipped" in report.summary()


def test_weighted_balance_weighs_the_loads_with_the_weights_the_checkpoint_recorded(spark, tmp_path):
    """One hot split alone on reader 0, five light ones on reader 1: balanced by measured weight.

    Counted with unit weights the loads are 1 against 5 (out of bounds); with the weights the
    driver recorded (5 and 1 each) they are 5 against 5. A skew the recorded weights reveal
    fails even where the counts look fine."""
    splits = [Split(f"orders-{i}", SUB, 0) for i in range(6)] + [Split("orders-9", SUB, 0, end=3)]
    cp1 = _checkpoint(1, (s(0, 5),), tuple(s(i, 5) for i in range(1, 6)))
    sink = _records("orders-9", 0, 3, 1, 0)
    for i in range(6):
        sink += _records(f"orders-{i}", 0, 5, 1, 0 if i == 0 else 1)
    hot = {"orders-0": 5.0, **{f"orders-{i}": 1.0 for i in range(1, 6)}}
    options = {"strategy": "weighted", "source_splits": splits}

    measured = write(spark, tmp_path / "measured", Scenario([cp1], sink), split_weights=hot)
    assert measured[0].history.split_weights(1) == hot
    report = run_checks(spark, *measured, tmp_path / "docs1", **options)
    assert report.suite("balance").status is SuiteStatus.PASSED, report.summary()

    unweighed = write(spark, tmp_path / "unweighed", Scenario([cp1], sink))  # nothing recorded
    report = run_checks(spark, *unweighed, tmp_path / "docs2", **options)
    assert report.suite("balance").status is SuiteStatus.FAILED  # counts: 1 against 5

    # three light splits on reader 0 against one near-idle split: counts pass, weights do not
    light = {"orders-0": 1.0, "orders-1": 1.0, "orders-2": 1.0, "orders-3": 0.1}
    skewed = write(spark, tmp_path / "skewed", unbalanced(), split_weights=light)
    report = run_checks(spark, *skewed, tmp_path / "docs3", strategy="weighted")
    balance = report.suite("balance")
    assert balance.status is SuiteStatus.FAILED and balance.failed[0].reader_ids == (0, 1)  # 3 and 0.1


# ---------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------


def test_unknown_checkpoint_is_refused_with_the_available_ids(spark, healthy_state, tmp_path):
    store = DeltaStateStore(healthy_state / "state", PIPELINE, "kafka:orders")
    with pytest.raises(CheckpointError, match=r"checkpoint 9 .*available: \[1, 2\]"):
        run_checks(spark, store, str(healthy_state / "sink"), tmp_path / "docs", checkpoint_id=9)


def test_suite_files_name_a_dataset_and_index_columns(tmp_path):
    specs = load_suite_specs()
    assert set(specs) == set(SUITES)
    assert specs["sink_records"].result_format["result_format"] == "SUMMARY"
    assert specs["ownership"].index_columns == ("split_id",)

    bad = tmp_path / "suites"
    bad.mkdir()
    for key in SUITES:
        definition = json.loads((Path(__file__).parents[2] / "expectations" / f"{key}.json").read_text())
        if key == "balance":
            definition["meta"]["splitkeeper"]["dataset"] = "readers"
        (bad / f"{key}.json").write_text(json.dumps(definition))
    with pytest.raises(ConfigError, match="dataset='readers' is not allowed"):
        load_suite_specs(bad)


# ---------------------------------------------------------------------------------------
# The real runtime: a pipeline run with a failed region leaves a state that passes
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_real_pipeline_run_with_a_failed_region_passes_every_suite(spark, tmp_path):
    from runtime.helpers import run_pipeline  # tests/ is on sys.path (no __init__.py)

    from splitkeeper.config.settings import config_from_mapping
    from splitkeeper.sources import build_source

    incoming = tmp_path / "in"
    incoming.mkdir()
    for f in range(3):
        lines = (json.dumps({"id": f * 100 + i, "pad": "x" * (i % 7)}) + "\n" for i in range(60))
        (incoming / f"part-{f}.jsonl").write_text("".join(lines), encoding="utf-8")
    config = config_from_mapping(
        {
            "name": "files-demo",
            "parallelism": 2,
            "strategy": "least-loaded",
            "source": {"kind": "files", "path": str(incoming), "format": "jsonl"},
            "checkpoint": {"max_consecutive_failures": 2, "region_timeout_s": 120, "retain_checkpoints": 10},
            "backlog": {"backlog_epoch_records": 120, "normal_epoch_records": 120},
            "state": {"path": str(tmp_path / "state")},
            "sink": {"path": str(tmp_path / "sink")},
        }
    )
    summary = run_pipeline(config, spark, faults=["fail:1@2"])
    assert summary.finished and summary.counts()["regional"] >= 1, summary.counts()

    connector = build_source(config.source)
    try:
        store = DeltaStateStore(config.state.path, config.name, connector.fingerprint())
        report = run_checks(
            spark,
            store,
            config.sink.path,
            tmp_path / "docs",
            strategy=config.strategy,
            subscriptions=connector.subscriptions(),
            source_splits=connector.discover_splits(),
        )
    finally:
        connector.close()
    assert report.success, report.summary()
    assert report.suite("sink_records").notes[0].startswith("180 sink record(s) ")
    assert report.suite("sink_splits").rows == 3
