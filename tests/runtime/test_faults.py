"""``SPLITKEEPER_CRASH_AT``: which crash point of which epoch a driver dies at (no Spark; the kill is
exercised by tests/runtime/test_pipeline_crash.py and tests/test_chaos.py)."""

from __future__ import annotations

import pytest

from splitkeeper.core.ports import CrashPoint
from splitkeeper.errors import InvalidParameterError
from splitkeeper.spark.faults import CRASH_ENV, CrashRequest, crash_request


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", None),
        ("after_plan", CrashRequest(CrashPoint.AFTER_PLAN)),
        ("after_decision@3", CrashRequest(CrashPoint.AFTER_DECISION, 3)),
        ("during_retention@12+", CrashRequest(CrashPoint.DURING_RETENTION, 12, or_later=True)),
    ],
)
def test_crash_request_parses_point_epoch_and_or_later(value: str, expected: CrashRequest | None) -> None:
    assert crash_request({CRASH_ENV: value}) == expected


def test_an_exact_epoch_matches_only_that_epoch_and_or_later_matches_every_later_one() -> None:
    exact = CrashRequest(CrashPoint.AFTER_SINK_COMMIT, 5)
    later = CrashRequest(CrashPoint.AFTER_SINK_COMMIT, 5, or_later=True)
    every = CrashRequest(CrashPoint.AFTER_SINK_COMMIT)

    assert [exact.matches(CrashPoint.AFTER_SINK_COMMIT, e) for e in (4, 5, 6)] == [False, True, False]
    assert [later.matches(CrashPoint.AFTER_SINK_COMMIT, e) for e in (4, 5, 6)] == [False, True, True]
    assert [every.matches(CrashPoint.AFTER_SINK_COMMIT, e) for e in (1, 9)] == [True, True]
    assert not later.matches(CrashPoint.AFTER_PLAN, 9)  # another point never matches


@pytest.mark.parametrize("value", ["after_sink@2", "after_plan@", "after_plan@+3", "after_plan@2++"])
def test_a_malformed_request_names_the_variable_and_the_forms(value: str) -> None:
    with pytest.raises(InvalidParameterError) as err:
        crash_request({CRASH_ENV: value})

    assert f"{CRASH_ENV}={value!r} is not allowed" in str(err.value)
    assert "'<point>@<epoch>+'" in str(err.value) and "after_sink_commit" in str(err.value)


def test_the_sinks_dead_letter_crash_point_is_named_like_the_drivers():
    from splitkeeper.core.ports import SinkCrashPoint

    request = crash_request({CRASH_ENV: "before_dead_letter_commit@3"})
    assert request == CrashRequest(SinkCrashPoint.BEFORE_DEAD_LETTER_COMMIT, 3)
    assert request.matches(SinkCrashPoint.BEFORE_DEAD_LETTER_COMMIT, 3)
    assert not request.matches(CrashPoint.AFTER_SINK_COMMIT, 3)
