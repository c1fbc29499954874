"""Operator requests beside the state: a stop request reaches a continuous run on any host."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from splitkeeper.app.run import _stop_check
from splitkeeper.delta.control import ControlRequests
from splitkeeper.delta.tables import StateTables


def test_a_stop_request_is_seen_by_runs_started_before_it_and_only_by_them(tmp_path: Path) -> None:
    tables = StateTables(tmp_path / "state")
    requests = ControlRequests(tables, "orders")
    assert not requests.stop_requested_since(datetime.now(UTC) - timedelta(hours=1))  # no table: no request
    before = datetime.now(UTC)
    asked = requests.request_stop()
    assert requests.stop_requested_since(before)
    assert not requests.stop_requested_since(asked + timedelta(seconds=1))  # a later run is not stopped
    assert not ControlRequests(tables, "other").stop_requested_since(before)  # another pipeline's request


def test_a_continuous_run_polls_the_control_table_and_sets_its_stop_event(tmp_path: Path) -> None:
    tables = StateTables(tmp_path / "state")
    event = threading.Event()
    stop_requested = _stop_check(event, tables, "orders", every_s=0.0)
    assert not stop_requested()
    time.sleep(0.01)
    ControlRequests(StateTables(tmp_path / "state"), "orders").request_stop()  # another process's writer
    assert stop_requested() and event.is_set()


def test_a_passed_validation_is_found_only_for_its_checkpoint_and_unchanged_fingerprint(
    tmp_path: Path,
) -> None:
    from splitkeeper.delta.validations import ValidationRecords, table_versions

    tables = StateTables(tmp_path / "state")
    records = ValidationRecords(tables, "orders")
    seen = {"state": {"checkpoints": 4}, "sink": table_versions({"sink": str(tmp_path / "sink"), "x": None})}
    assert seen["sink"] == {"sink": -1}  # no table there yet; a path of None is not looked at
    assert records.passed(7, seen) is None  # no table: nothing validated
    at = records.record(7, seen, {"exactly_once": "passed"}, str(tmp_path / "docs" / "index.html"))
    found = ValidationRecords(StateTables(tmp_path / "state", read_only=True), "orders").passed(7, dict(seen))
    assert found is not None and (found.checkpoint_id, found.validated_at) == (7, at)
    assert found.suites == {"exactly_once": "passed"} and found.data_docs == str(
        tmp_path / "docs" / "index.html"
    )
    assert found.fingerprint == seen and "pid" in found.validated_by
    assert records.passed(8, seen) is None  # another checkpoint
    assert records.passed(7, {**seen, "state": {"checkpoints": 5}}) is None  # a table moved since
    assert ValidationRecords(tables, "other").passed(7, seen) is None  # another pipeline's row
    later = records.record(7, seen, {"exactly_once": "passed"}, None)
    latest = records.passed(7, seen)
    assert latest is not None and latest.validated_at == later and latest.data_docs is None
