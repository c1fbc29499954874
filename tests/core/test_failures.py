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


def test_a_long_error_is_shortened_between_words_and_keeps_what_to_do() -> None:
    """Issue 36 item 12: a stalled run's error ended "... use source.forma" (cut at 300 characters)."""
    from splitkeeper.core.failures import MESSAGE_CHARS, clip

    text = (
        "SourceError: [SOURCE_ERROR] split 'f': "
        + " ".join(f"/data/part-{i}/f.jsonl" for i in range(30))
        + " line at byte 9 is not valid JSON; fix the file or use source.format 'lines'"
    )
    message = region_failure(1, RegionOutcome.DECLINE, text).message
    assert len(message) <= MESSAGE_CHARS
    head, _, rest = message.partition(" [... ")
    count, _, tail = rest.partition(" characters ...] ")
    body = text.split("] ", 1)[1]  # the message without its class and code
    assert body.startswith(head + " ") and body.endswith(" " + tail)  # whole words only
    assert tail.endswith("fix the file or use source.format 'lines'")  # what to do is kept
    assert int(count) == len(body) - len(head) - len(tail)  # the spaces around the gap included
    assert clip("short enough", 12) == "short enough"
    long_word = clip("a" * 100, 40)  # one word longer than the room: cut, and the marker says so
    assert len(long_word) <= 40 and long_word.startswith("a") and "[... " in long_word
