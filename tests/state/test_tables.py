"""The table definitions (splitkeeper.delta.schemas, documented by state/*.ddl) and splitkeeper.delta.tables:
create-if-absent, layout check, migration, a damaged log. No Spark."""

from __future__ import annotations

import multiprocessing
import os
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from splitkeeper.delta import tables
from splitkeeper.delta.checkpoints import DeltaStateStore, decision_for
from splitkeeper.delta.schemas import (
    META_COLUMNS,
    STAGED_COLUMNS,
    STAGED_FILE_SCHEMA,
    STAGED_SCHEMA,
    STATE_TABLES,
    TABLES,
    ddl,
    spec,
)
from splitkeeper.delta.tables import ensure_table
from splitkeeper.errors import StateError

from . import workers
from .samples import global_

STATE_DIR = Path(__file__).resolve().parents[2] / "state"


def _columns(text: str) -> str:
    """A DDL column list without comments, whitespace-insensitive (what Spark's parser sees)."""
    text = " ".join(line.split("--", 1)[0] for line in text.splitlines())
    return re.sub(r"\s*([<>,:])\s*", r"\1", " ".join(text.split())).strip()


def test_every_ddl_file_documents_exactly_its_python_schema():
    files = {p.stem: p for p in STATE_DIR.glob("*.ddl")}
    assert sorted(files) == sorted(TABLES)  # one documentation file per table, none without a table
    for name, path in files.items():
        assert _columns(path.read_text(encoding="utf-8")) == _columns(ddl(name)), (
            f"{path} does not say what splitkeeper/delta/schemas.py defines for table {name}: "
            f"expected the columns\n{ddl(name)}"
        )


def test_the_ddl_comparison_sees_a_changed_type_nullability_or_order():
    text = (STATE_DIR / "audit.ddl").read_text(encoding="utf-8")
    assert _columns(text) == _columns(ddl("audit"))
    for changed in (
        text.replace("seq INT NOT NULL", "seq BIGINT NOT NULL"),
        text.replace("reader_id INT,", "reader_id INT NOT NULL,"),
        text.replace(
            "seq INT NOT NULL,\nsplit_id STRING NOT NULL", "split_id STRING NOT NULL,\nseq INT NOT NULL"
        ),
    ):
        assert changed != text and _columns(changed) != _columns(ddl("audit"))


def test_the_python_schemas_use_spark_types_and_nullability():
    checkpoints = spec("checkpoints").schema
    assert (
        checkpoints.field("checkpoint_id").type == pa.int64()
        and not checkpoints.field("checkpoint_id").nullable
    )
    assert checkpoints.field("created_at").type == pa.timestamp(
        "us", tz="UTC"
    )  # an instant, never wall-clock
    assert checkpoints.field("enumerator").nullable and checkpoints.field("enumerator_base").nullable
    regions = checkpoints.field("regions").type
    assert regions.value_field.nullable  # Spark: array elements may be NULL
    split = regions.value_type.field("splits").type.value_type
    assert [f.name for f in split] == ["split_id", "subscription", "position", "end", "backlog_end"]
    assert all(f.nullable for f in split)  # Spark: struct fields are nullable unless NOT NULL
    assert "`end`: BIGINT" in ddl("checkpoints") and "`offset` BIGINT NOT NULL" in ddl("sink_records")


def test_every_ddl_file_parses_and_each_table_has_its_partition_and_properties():
    for name, table in TABLES.items():
        assert table.schema.names, name
        if table.partition:
            assert table.partition in table.schema.names
        props = table.properties
        assert props["delta.checkpointInterval"] == "10"
        assert props["delta.enableDeletionVectors"] == "false"
        assert set(table.stats_columns) <= set(table.schema.names), name
    assert spec("checkpoints").partition == "checkpoint_id" and spec("audit").partition is None
    assert set(STATE_TABLES) <= set(TABLES) and "lease" in TABLES and "decisions" in STATE_TABLES


def test_the_staged_schema_is_the_sink_schema():
    assert spec("sink_records").schema == STAGED_FILE_SCHEMA
    assert STAGED_FILE_SCHEMA.names == [*STAGED_COLUMNS, "ingested_at", *META_COLUMNS]
    assert pa.schema([STAGED_FILE_SCHEMA.field(c) for c in STAGED_COLUMNS]) == STAGED_SCHEMA


def test_creating_a_table_twice_creates_it_once_with_the_ddl_layout(tmp_path):
    uri = str(tmp_path / "checkpoints")
    table, created = ensure_table(uri, spec("checkpoints"))
    again, created_again = ensure_table(uri, spec("checkpoints"))
    assert (created, created_again) == (True, False)
    assert again.version() == table.version() == 0
    assert again.metadata().partition_columns == ["checkpoint_id"]
    assert again.metadata().configuration["delta.checkpointInterval"] == "10"
    assert pa.schema(again.schema().to_arrow()).names == spec("checkpoints").schema.names


def test_two_processes_opening_a_fresh_state_directory_one_claims_it_the_other_is_refused(tmp_path):
    root = str(tmp_path / "state")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    procs = [
        context.Process(target=workers.claim_state, args=(root, name, barrier, results))
        for name in ("orders", "payments")
    ]
    for p in procs:
        p.start()
    outcomes = {name: (kind, detail) for name, kind, detail in (results.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    assert sorted(kind for kind, _ in outcomes.values()) == ["owner", "refused"], outcomes
    owner = next(name for name, (kind, _) in outcomes.items() if kind == "owner")
    other = next(name for name, (kind, _) in outcomes.items() if kind == "refused")
    assert f"belongs to pipeline {owner!r}, not to pipeline {other!r}" in outcomes[other][1]
    pipeline = DeltaTable(os.path.join(root, "pipeline"))
    assert pipeline.version() == 0  # the claim is the creating commit itself
    assert pipeline.to_pyarrow_table().column("name").to_pylist() == [owner]
    for name in STATE_TABLES:
        assert DeltaTable.is_deltatable(os.path.join(root, name)), name


def test_a_table_with_other_columns_is_refused_naming_what_it_has_and_what_is_expected(tmp_path):
    root = tmp_path / "state"
    DeltaTable.create(
        str(root / "audit"), pa.schema([pa.field("checkpoint_id", pa.int64()), ("x", pa.string())])
    )
    with pytest.raises(StateError) as err:
        DeltaStateStore(root, "orders", "files:/in")
    text = str(err.value)
    assert f"table audit at {root / 'audit'} has columns ['checkpoint_id', 'x'] partitioned by []" in text
    assert (
        "splitkeeper expects ['checkpoint_id', 'attempt_id', 'seq'" in text
        and "fresh state directory" in text
    )


def test_a_table_partitioned_otherwise_is_refused(tmp_path):
    root = tmp_path / "state"
    DeltaTable.create(str(root / "epoch_plans"), spec("epoch_plans").schema)  # not partitioned by epoch_id
    with pytest.raises(
        StateError,
        match=r"table epoch_plans .* partitioned by \[\], but splitkeeper expects .* "
        r"partitioned by \['epoch_id'\]",
    ):
        DeltaStateStore(root, "orders", "files:/in")


def _old_checkpoints_table(root: Path) -> pa.Schema:
    """A checkpoints table as state written before configured_parallelism, split_weights,
    enumerator_base and the rest of its added columns (phase times, failures) existed."""
    full = spec("checkpoints").schema
    added = spec("checkpoints").added_columns
    old = pa.schema([f for f in full if f.name not in added])
    DeltaTable.create(str(root / "checkpoints"), old, partition_by=["checkpoint_id"])
    return old


def test_an_older_checkpoints_table_gains_configured_parallelism_and_reads_null_there(tmp_path):
    root = tmp_path / "state"
    _old_checkpoints_table(root)
    read_only = DeltaStateStore(root, "orders", None, read_only=True)  # does not migrate
    assert read_only.checkpoint_ids() == []
    assert DeltaTable(str(root / "checkpoints")).version() == 0

    store = DeltaStateStore(root, "orders", "files:/in")  # migrates: ADD COLUMNS, no error
    migrated = DeltaTable(str(root / "checkpoints"))
    assert pa.schema(migrated.schema().to_arrow()).names == spec("checkpoints").schema.names
    assert migrated.history(1)[0]["operation"] == "ADD COLUMN"
    store.commit_checkpoint(decision_for(global_(1)))  # a writer that does not say: NULL
    store.commit_checkpoint(
        decision_for(global_(2), configured_parallelism=3, split_weights={"orders-0": 2.5})
    )
    again = DeltaStateStore(root, "orders", "files:/in")
    assert again.load_checkpoint(1) == global_(1) and again.load_checkpoint(2) == global_(2)
    assert (again.configured_parallelism(1), again.configured_parallelism(2)) == (None, 3)
    assert again.history.split_weights(1) == {} and again.history.split_weights(2) == {"orders-0": 2.5}


def test_a_read_only_store_reads_rows_of_an_unmigrated_table_with_null_in_the_added_column(tmp_path):
    from datetime import UTC, datetime

    from splitkeeper.delta import serde

    root = tmp_path / "state"
    old = _old_checkpoints_table(root)
    for name in STATE_TABLES:
        if name not in ("checkpoints", "pipeline"):
            ensure_table(str(root / name), spec(name))
    ensure_table(
        str(root / "pipeline"),
        spec("pipeline"),
        data=spec("pipeline").rows(
            [
                {
                    "name": "orders",
                    "source_fingerprint": "f",
                    "state_format": 1,
                    "created_at": datetime.now(UTC),
                }
            ]
        ),
    )
    row = {
        **serde.checkpoint_to_row(global_(1)),
        "attempt_id": "a",
        "run_id": "old",
        "created_at": datetime.now(UTC),
        "commit_ms": 1,
    }
    from deltalake import write_deltalake

    write_deltalake(str(root / "checkpoints"), pa.Table.from_pylist([row], old), mode="append")
    enumerator = global_(1).enumerator
    assert enumerator is not None
    rows = [{**r, "checkpoint_id": 1, "attempt_id": "a"} for r in serde.enumerator_to_rows(enumerator)]
    write_deltalake(str(root / "enumerator_state"), spec("enumerator_state").rows(rows), mode="append")
    store = DeltaStateStore(root, "orders", None, read_only=True)
    assert store.checkpoint_ids() == [1] and store.configured_parallelism(1) is None
    assert store.load_checkpoint(1) == global_(1)
    assert pa.schema(DeltaTable(str(root / "checkpoints")).schema().to_arrow()) == old  # not migrated


def test_a_truncated_log_entry_names_the_table_the_log_file_and_what_to_do(tmp_path):
    root = tmp_path / "state"
    store = DeltaStateStore(root, "orders", "files:/in")
    store.commit_checkpoint(decision_for(global_(1)))
    store.commit_checkpoint(decision_for(global_(2)))
    log_file = root / "checkpoints" / "_delta_log" / "00000000000000000002.json"
    data = log_file.read_bytes()
    log_file.write_bytes(data[:-25])  # a copy that stopped half-way through its last action
    before = {p: p.read_bytes() for p in (root / "checkpoints").rglob("*") if p.is_file()}
    with pytest.raises(StateError) as err:
        DeltaStateStore(root, "orders", "files:/in").latest_checkpoint()
    text = str(err.value)
    assert f"the Delta table at {root / 'checkpoints'} cannot be read: log file {log_file}" in text
    assert "Restore that file from a backup" in text and "splitkeeper validate" in text
    assert err.value.params["log_file"] == str(log_file)
    after = {p: p.read_bytes() for p in (root / "checkpoints").rglob("*") if p.is_file()}
    assert after == before  # nothing was written or repaired behind the user's back


def test_the_state_package_and_the_sink_import_no_spark_and_nothing_reaches_into_delta_jvm():
    import re
    import subprocess
    import sys

    code = (
        "import sys, splitkeeper.delta.checkpoints, splitkeeper.delta.history, splitkeeper.delta.lease, "
        "splitkeeper.delta.retention, splitkeeper.sinks.delta.sink; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'delta')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    package = Path(tables.__file__).resolve().parents[1]
    offenders = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(
            r"\._jvm\b|jvm\.(org\.apache\.spark\.sql\.delta|io\.delta)|DeltaLog|OptimisticTransaction", line
        )
    ]
    assert offenders == []


def test_a_missing_table_under_a_path_that_contains_json_is_missing_not_damaged(tmp_path: Path) -> None:
    from splitkeeper.delta.tables import open_table

    assert open_table(str(tmp_path / "events_json" / "sink"), missing_ok=True) is None


@pytest.mark.parametrize("landed", [True, False], ids=["landed-answer-lost", "not-landed"])
def test_a_create_whose_store_call_fails_reads_the_table_again_and_retries_while_it_is_absent(
    tmp_path, monkeypatch, landed
):
    """A reset on the create's put (its answer lost): landed, the table is opened as it is; not
    landed, the create is tried again; each a ``table_create`` retry; one table either way."""
    from splitkeeper.delta import retries

    real, calls = tables._create, []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            if landed:
                real(*args, **kwargs)
            raise OSError("Generic S3 error: error sending request: connection reset by peer")
        return real(*args, **kwargs)

    monkeypatch.setattr(tables, "_create", failing_once)
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    before = retries.counts()["table_create"]
    table, created = ensure_table(str(tmp_path / "lease"), spec("lease"))
    assert (len(calls), created) == ((1, False) if landed else (2, True))
    assert table.version() == 0 and retries.counts()["table_create"] == before + 1
    assert DeltaTable(str(tmp_path / "lease")).version() == 0  # created once


def test_an_append_the_store_keeps_failing_is_a_state_error_naming_the_table(tmp_path, monkeypatch):
    import deltalake

    from splitkeeper.delta import retries

    store = tables.StateTables(str(tmp_path / "state"))
    store.ensure("control")
    sent = []

    def reset(*_args, **_kwargs):
        sent.append(1)
        raise OSError("Generic S3 error: error sending request: connection reset by peer")

    monkeypatch.setattr(deltalake, "write_deltalake", reset)
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)  # the backoff's waits, not its count
    before = retries.counts()["state_append"]
    with pytest.raises(StateError) as err:
        store.append("control", spec("control").empty())
    text = str(err.value)
    assert text.startswith("[STATE_ERROR] the append to table control at ") and "connection reset" in text
    assert (
        f"failed in the store {tables.APPEND_ATTEMPTS} times" in text
        and "does not record it: this run stops" in text
    )
    assert len(sent) == tables.APPEND_ATTEMPTS  # sent again while the table does not record it
    assert retries.counts()["state_append"] == before + tables.APPEND_ATTEMPTS - 1
    assert DeltaTable(store.uri("control")).version() == 0  # nothing landed


def _control_row(note: str) -> pa.Table:
    from datetime import UTC, datetime

    return spec("control").rows(
        [{"pipeline": "orders", "request": "stop", "requested_at": datetime.now(UTC), "requested_by": note}]
    )


def test_an_append_whose_answer_is_lost_after_it_landed_is_in_the_table_once(tmp_path, monkeypatch):
    """What object_store does after a reset that cut the answer to a put that landed: it sends the
    put again, meets its own ``_delta_log/N.json`` and delta-rs rebases the append onto N+1. The
    append's app transaction turns that copy into a conflict, and the append is found landed."""
    import deltalake

    real = deltalake.write_deltalake
    store = tables.StateTables(str(tmp_path / "state"))
    store.ensure("control")
    store.append("control", _control_row("first"))
    copies = []

    def landed_then_sent_again(table, data, **kwargs):
        real(DeltaTable(table.table_uri), data, **kwargs)  # the put landed (version N)...
        try:
            real(table, data, **kwargs)  # ...and the resend, on the snapshot before it, is rebased
        except deltalake.exceptions.CommitFailedError as err:
            copies.append(err)
            raise
        copies.append("committed twice")

    monkeypatch.setattr(deltalake, "write_deltalake", landed_then_sent_again)
    store.append("control", _control_row("second"))
    assert len(copies) == 1 and isinstance(copies[0], deltalake.exceptions.CommitFailedError), copies
    table = DeltaTable(store.uri("control"))
    assert sorted(table.to_pyarrow_table().column("requested_by").to_pylist()) == ["first", "second"]
    assert table.version() == 2 and table.transaction_version(store.append_app_id) == 2


def test_an_append_that_failed_before_it_landed_is_sent_again_and_lands_once(tmp_path, monkeypatch):
    import deltalake

    from splitkeeper.delta import retries

    real = deltalake.write_deltalake
    store = tables.StateTables(str(tmp_path / "state"))
    store.ensure("control")
    sent = []

    def fails_twice(table, data, **kwargs):
        sent.append(1)
        if len(sent) <= 2:
            raise OSError("Generic S3 error: HTTP 503 SlowDown")
        real(table, data, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", fails_twice)
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    before = retries.counts()["state_append"]
    store.append("control", _control_row("only"))
    assert len(sent) == 3 and retries.counts()["state_append"] == before + 2
    table = DeltaTable(store.uri("control"))
    assert table.to_pyarrow_table().column("requested_by").to_pylist() == ["only"] and table.version() == 1


def test_a_delete_whose_answer_is_lost_after_it_landed_ends_with_the_rows_deleted(tmp_path, monkeypatch):
    """A delete that landed and whose resent copy delta-rs refuses (a delete meeting a delete of the
    same files): the table is read again and the delete sent again, which finds nothing more to do."""
    import deltalake

    from splitkeeper.delta import retries

    store = tables.StateTables(str(tmp_path / "state"))
    store.ensure("control")
    for note in ("keep", "drop", "drop"):
        store.append("control", _control_row(note))
    real = deltalake.DeltaTable.delete
    copies = []

    def landed_then_sent_again(table, predicate=None, **kwargs):
        if not copies:
            real(DeltaTable(table.table_uri), predicate, **kwargs)  # the delete landed...
            try:
                real(table, predicate, **kwargs)  # ...and its copy, on the snapshot before it
            except deltalake.exceptions.CommitFailedError as err:
                copies.append(err)
                raise
            copies.append("deleted twice")
        return real(table, predicate, **kwargs)

    monkeypatch.setattr(deltalake.DeltaTable, "delete", landed_then_sent_again)
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    before = retries.counts()["state_delete"]
    assert store.delete("control", "requested_by = 'drop'") == 0  # the landing call was the first
    assert len(copies) == 1 and isinstance(copies[0], deltalake.exceptions.CommitFailedError), copies
    assert retries.counts()["state_delete"] == before + 1
    table = DeltaTable(store.uri("control"))
    assert table.to_pyarrow_table().column("requested_by").to_pylist() == ["keep"]


def test_a_delete_the_store_keeps_failing_is_a_state_error_and_deletes_nothing(tmp_path, monkeypatch):
    import deltalake

    from splitkeeper.delta import retries

    store = tables.StateTables(str(tmp_path / "state"))
    store.ensure("control")
    store.append("control", _control_row("drop"))

    def reset(*_args, **_kwargs):
        raise OSError("Generic S3 error: error sending request: connection reset by peer")

    monkeypatch.setattr(deltalake.DeltaTable, "delete", reset)
    monkeypatch.setattr(retries.time, "sleep", lambda _s: None)
    with pytest.raises(StateError) as err:
        store.delete("control", "requested_by = 'drop'")
    text = str(err.value)
    assert text.startswith("[STATE_ERROR] the delete from table control at ") and "connection reset" in text
    assert f"failed in the store {tables.APPEND_ATTEMPTS} times" in text and "deletes them again" in text
    monkeypatch.undo()
    assert DeltaTable(store.uri("control")).to_pyarrow_table().column("requested_by").to_pylist() == ["drop"]


def test_each_writer_numbers_its_appends_under_its_own_app_id(tmp_path):
    root = str(tmp_path / "state")
    first, second = tables.StateTables(root), tables.StateTables(root)
    first.ensure("control")
    for store, note in ((first, "a1"), (second, "b1"), (first, "a2")):
        store.append("control", _control_row(note))
    table = DeltaTable(first.uri("control"))
    assert first.append_app_id != second.append_app_id
    assert first.append_app_id.startswith(tables.APPEND_APP_ID)
    assert (
        table.transaction_version(first.append_app_id),
        table.transaction_version(second.append_app_id),
    ) == (
        2,
        1,
    )
    assert sorted(table.to_pyarrow_table().column("requested_by").to_pylist()) == ["a1", "a2", "b1"]


def test_a_root_creates_its_tables_side_by_side_and_one_table_once(tmp_path, monkeypatch):
    """StateTables.ensure creates outside the root's lock: the store's thread pool creates its tables
    at the same time (each create here waits until another one is under way, which a create held
    under the lock never sees: the barrier breaks); two threads ensuring one table create it once."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    barrier = threading.Barrier(2, timeout=10)
    real = tables.ensure_table

    def meeting(uri, table_spec, **kwargs):
        barrier.wait()  # BrokenBarrierError when the other create cannot start meanwhile
        return real(uri, table_spec, **kwargs)

    monkeypatch.setattr(tables, "ensure_table", meeting)
    root = tables.StateTables(tmp_path / "state")
    with ThreadPoolExecutor(max_workers=2) as pool:
        made = list(pool.map(root.ensure, ["audit", "decisions"]))
    assert [created for _table, created in made] == [True, True]
    assert all(DeltaTable(os.path.join(root.root, n)).version() == 0 for n in ("audit", "decisions"))
    assert root.get("audit", fresh=False) is made[0][0]  # registered under the lock

    with ThreadPoolExecutor(max_workers=2) as pool:
        twice = list(pool.map(lambda _: root.ensure("checkpoint_log"), range(2)))
    assert sorted(created for _table, created in twice) == [False, True]  # the first create wins
    log = DeltaTable(os.path.join(root.root, "checkpoint_log"))
    assert log.version() == 0 and log.schema().to_arrow() == spec("checkpoint_log").schema
