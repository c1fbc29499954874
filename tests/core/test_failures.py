"""core.failures: a failed region's error text as error class, first line, split and offset."""

from __future__ import annotations

from splitkeeper.core.failures import RegionFailure, region_failure
from splitkeeper.core.types import RegionOutcome


def test_a_split_read_error_from_an_executor_names_class_split_offset_and_the_cause() -> None:
    text = (
        'splitkeeper.spark.task.SplitReadError: [SPLIT_READ_FAILED] split "a \\"b\\"" at offset 12: '
        "ValueError: not JSON\n  File x.py, line 3\nmore"
    )
    found = region_failure(1, RegionOutcome.DECLINE, text)
    assert found == RegionFailure(1, "decline", "SplitReadError", "ValueError: not JSON", 'a "b"', 12)
    assert (
        found.line() == 'region 1 decline SplitReadError at split "a \\"b\\"" offset 12: ValueError: not JSON'
    )


def test_timeouts_unplannable_splits_injected_faults_and_empty_texts() -> None:
    timeout = region_failure(2, RegionOutcome.TIMEOUT, "no result within 12s")
    assert (timeout.error_class, timeout.message, timeout.split_id) == (
        "Timeout",
        "no result within 12s",
        None,
    )
    gone = region_failure(
        0, RegionOutcome.DECLINE, "split 'x.csv' cannot be planned: file is gone", ("x.csv",)
    )
    assert (gone.error_class, gone.split_id, gone.offset) == ("SourceError", "x.csv", None)
    fault = region_failure(
        3, RegionOutcome.DECLINE, "splitkeeper.spark.task.InjectedFault: [INJECTED_FAULT] boom"
    )
    assert (fault.error_class, fault.message) == ("InjectedFault", "boom")
    known = region_failure(1, RegionOutcome.DECLINE, "", ("s-1",))
    assert (known.error_class, known.message, known.split_id) == ("", "decline", "s-1")
