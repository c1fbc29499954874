"""Rule 6.4 with a dead-letter table: the sink and the dead letters TOGETHER cover each split's range
once, disjoint; the content digest is byte-exact. Pure core, no engine."""

from __future__ import annotations

import hashlib

from splitkeeper.core.invariants import (
    ViolationKind,
    check_content,
    check_sink_ranges,
    content_digest,
    judge_sink_split,
    summarize_sink_records,
)


def _kinds(violations):
    return sorted(v.kind for v in violations)


def test_sink_and_dead_letters_together_cover_the_range_once():
    sink = [("s", o, o + 1) for o in (0, 1, 3, 4, 6)]
    dead = [("s", 2, 3), ("s", 5, 6)]
    assert check_sink_ranges(sink, {"s": 0}, {"s": 7}, dead_letters=dead) == []
    summary = summarize_sink_records(sink, dead)["s"]
    assert (summary.records, summary.dead_letters, summary.islands) == (7, 2, ((0, 7),))
    # without its dead letters the sink has two gaps: the dead letters are what accounts for them
    assert _kinds(check_sink_ranges(sink, {"s": 0}, {"s": 7})) == [ViolationKind.OFFSET_MISSING]


def test_a_split_with_only_dead_letters_is_complete():
    assert check_sink_ranges([], {"s": 0}, {"s": 3}, dead_letters=[("s", o, o + 1) for o in range(3)]) == []


def test_an_offset_in_both_tables_is_an_overlap_not_a_duplicate():
    sink = [("s", o, o + 1) for o in range(4)]
    found = check_sink_ranges(sink, {"s": 0}, {"s": 4}, dead_letters=[("s", 2, 3)])
    assert _kinds(found) == [ViolationKind.DEAD_LETTER_OVERLAP]
    assert "offsets both in the sink and in the dead-letter table: 2" in found[0].detail


def test_a_dead_letter_twice_is_a_duplicate_and_a_missing_one_a_gap():
    sink = [("s", o, o + 1) for o in (0, 1, 3)]
    twice = check_sink_ranges(sink, {"s": 0}, {"s": 4}, dead_letters=[("s", 2, 3), ("s", 2, 3)])
    assert _kinds(twice) == [ViolationKind.OFFSET_DUPLICATE]
    gap = check_sink_ranges(sink, {"s": 0}, {"s": 5}, dead_letters=[("s", 4, 5)])
    assert _kinds(gap) == [ViolationKind.OFFSET_MISSING] and "2" in gap[0].detail


def test_byte_ranges_of_a_files_source_overlap_by_part():
    # lines as byte ranges: a dead letter [10, 25) against a sink record [20, 30) overlaps on [20, 25)
    summary = summarize_sink_records([("f", 0, 10), ("f", 20, 30)], [("f", 10, 25)])["f"]
    assert summary.overlaps == ((20, 25),) and summary.duplicates == ()
    verdict = judge_sink_split(summary, 0, 30)
    assert [v.kind for v in verdict.violations()] == [ViolationKind.DEAD_LETTER_OVERLAP]


def test_content_digest_is_byte_exact_and_treats_text_as_its_utf8_bytes():
    assert content_digest([]) == (0, hashlib.sha256(b"").hexdigest())
    text = content_digest(["héllo", None, ""])
    assert text == content_digest(["héllo".encode(), None, b""])
    assert text != content_digest(["héllo", "", ""])  # a null is not an empty value
    assert content_digest([b"\xff\x00"]) != content_digest([b"\xff"])
    assert content_digest([b"a", b"b"]) != content_digest([b"b", b"a"])  # order counts
    expected = hashlib.sha256(
        (hashlib.sha256(b"a").hexdigest() + "null").encode("ascii")
    ).hexdigest()  # what the restart checks compute in Spark SQL
    assert content_digest([b"a", None]) == (2, expected)
    assert check_content("s", text, text) is None
    mismatch = check_content("s", text, content_digest(["hello", None, ""]))
    assert mismatch is not None and mismatch.kind is ViolationKind.CONTENT_MISMATCH
