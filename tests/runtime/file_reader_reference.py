"""The per-record file reader the native one replaced, kept as the oracle for its tests.

This is ``_read_lines`` / ``_decode`` / ``_jsonl`` of ``splitkeeper/sources/files/source.py``
as they were before the region task read ranges natively (commit 7169263), unchanged but for
:func:`read_range_reference` on top, and the values being the lines' bytes (issue 21: the reader
decodes nothing; only ``jsonl`` reads its lines as UTF-8 text and checks them, then gives their
bytes). The tests compare the native reader's records and errors with these, byte for byte.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import IO

from splitkeeper.core.source import SourceRecord
from splitkeeper.errors import SourceError

_CHUNK = 1 << 20
_MIN_READ = 8192
_BOM = codecs.BOM_UTF8


def read_range_reference(
    path: str, split_id: str, start: int, end: int, jsonl: bool = False
) -> list[SourceRecord]:
    """The records the old per-record reader yielded for ``[start, end)`` of ``path``."""
    f = open(path, "rb")  # noqa: SIM115 - closed by _read_lines
    lines = _read_lines(f, path, split_id, start, end, jsonl)
    if not jsonl:
        return list(lines)
    return [r._replace(value=r.value.encode("utf-8")) for r in _jsonl(lines, path, split_id)]


def _line_start_at_or_after(f: IO[bytes], offset: int) -> int:
    """The offset of the first line that starts at or after ``offset`` (``offset > 0``); EOF if none."""
    f.seek(offset - 1)
    return offset - 1 + len(f.readline())


def _read_lines(
    f: IO[bytes], path: str, split_id: str, start: int, end: int, text: bool
) -> Iterator[SourceRecord]:
    """The lines starting in ``[start, end)``, read in blocks of up to 1 MiB.

    A block's complete lines are split at once; an ASCII block without CRs is
    decoded with one call (byte offsets then equal character offsets), other
    blocks line by line.
    """
    with f:
        if start >= end:
            return
        pos = 0 if start == 0 else _line_start_at_or_after(f, start)
        read_pos = pos
        pending: list[bytes] = []  # the start of a line the previous blocks did not finish
        while pos < end:
            block = f.read(min(_CHUNK, max(_MIN_READ, end - read_pos)))
            read_pos += len(block)
            if not block:  # end of file: a last line without a newline
                if pending:
                    raw = b"".join(pending)
                    yield SourceRecord(pos, pos + len(raw), _decode(raw, pos, path, split_id, text))
                return
            cut = block.rfind(b"\n")
            if cut < 0:
                pending.append(block)
                continue
            if pending:
                pending.append(block[:cut])
                body = b"".join(pending)
                pending = []
            else:
                body = block[:cut]
            if cut + 1 < len(block):
                pending.append(block[cut + 1 :])
            if body.isascii() and b"\r" not in body:
                for line in body.decode("ascii").split("\n"):
                    if pos >= end:
                        return
                    nxt = pos + len(line) + 1
                    yield SourceRecord(pos, nxt, line if text else line.encode("ascii"))
                    pos = nxt
            else:
                for raw in body.split(b"\n"):
                    if pos >= end:
                        return
                    nxt = pos + len(raw) + 1
                    yield SourceRecord(pos, nxt, _decode(raw, pos, path, split_id, text))
                    pos = nxt


def _decode(raw: bytes, pos: int, path: str, split_id: str, text: bool) -> str | bytes:
    """A line's bytes (without its newline): no trailing CR, no BOM at offset 0; as text when ``text``."""
    if raw[-1:] == b"\r":
        raw = raw[:-1]
    skipped = 0
    if pos == 0 and raw[:3] == _BOM:
        raw, skipped = raw[3:], 3
    if not text:
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(
            f"split {split_id!r}: {path} line at byte {pos} is not valid UTF-8 ({err.reason} at byte "
            f"{pos + skipped + err.start}); fix or remove the file",
            split_id=split_id,
            offset=pos,
        ) from err


def _jsonl(lines: Iterator[SourceRecord], path: str, split_id: str) -> Iterator[SourceRecord]:
    """One record per non-blank line, validated as JSON.

    Blank lines are not records: their bytes belong to the next record of the
    range (its ``offset`` moves back to the first blank line), or, at the end
    of the range, to the last record (its ``next_offset`` moves forward), so
    offsets stay contiguous. A range of blank lines only yields nothing.
    """
    held: SourceRecord | None = None
    blank_from: int | None = None
    last_next = 0
    for rec in lines:
        last_next = rec.next_offset
        if not rec.value.strip():
            if blank_from is None:
                blank_from = rec.offset
            continue
        try:
            json.loads(rec.value)
        except ValueError as err:
            raise SourceError(
                f"split {split_id!r}: {path} line at byte {rec.offset} is not valid JSON ({err}); "
                "fix the file or use source.format 'lines'",
                split_id=split_id,
                offset=rec.offset,
            ) from err
        if blank_from is not None:
            rec = rec._replace(offset=blank_from)
            blank_from = None
        if held is not None:
            yield held
        held = rec
    if held is not None:
        yield held._replace(next_offset=last_next) if blank_from is not None else held
