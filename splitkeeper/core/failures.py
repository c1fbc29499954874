"""Why a region failed, as an incident review reads it, and how long each phase of a checkpoint took.

A region that did not acknowledge carries an error text (:attr:`RegionRun.error`): a
task's ``module.ErrorClass: message`` line, the driver's own words for a split it could
not plan, or a timeout's. :func:`region_failure` turns it into a :class:`RegionFailure`
(error class, first line, the split and offset when the text names them); the driver
persists one per failed region with the checkpoint (``checkpoints.failures``) or the
aborted attempt (``checkpoint_log.failures``), and ``status`` and the report show them.

:data:`PHASES` are the phases of a checkpoint whose times the ``checkpoints`` row keeps:
``plan_ms``, ``read_ms`` and ``sink_ms`` (the driver's laps) and ``commit_ms`` (the state
commit, measured by the store).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from splitkeeper.core.types import RegionOutcome

__all__ = ["PHASES", "RegionFailure", "clip", "first_line", "region_failure"]

#: The timed phases of a checkpoint, in order, as ``checkpoints`` columns (``<phase>_ms``).
PHASES = ("plan", "read", "sink", "commit")

#: ``split "<id>" at offset <n>`` (SplitReadError's message; the id as JSON).
_SPLIT_AT = re.compile(r'split ("(?:[^"\\]|\\.)*") at offset (\d+)')
#: ``split '<id>' cannot be planned`` (the driver's own words for an unplannable split).
_SPLIT_PLANNED = re.compile(r"split '([^']*)' cannot be planned")
#: A leading ``package.module.ErrorClass:`` (a Python exception line).
_CLASS = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*([A-Z][\w]*(?:Error|Exception|Fault|Exit|Interrupt)\w*)\s*:")
#: A ``[CODE]`` of splitkeeper's errors right after the class.
_CODE = re.compile(r"^\s*\[([A-Z][A-Z0-9_]+)\]\s*")

MESSAGE_CHARS = 300


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters; else its first words and its last words
    (an error says what is wrong first and what to do last) around `` [... N characters ...] ``,
    each part cut between words (a word longer than its part is cut, the marker says where)."""
    if len(text) <= limit:
        return text
    room = max(2, limit - len(f" [... {len(text)} characters ...] "))
    head, tail = text[: room * 2 // 3], text[len(text) - (room - room * 2 // 3) :]
    space = head.rfind(" ")
    if space > len(head) // 2 and not text[len(head)].isspace():
        head = head[:space]
    space = tail.find(" ")
    if 0 <= space < len(tail) // 2 and not text[-len(tail) - 1].isspace():
        tail = tail[space + 1 :]
    return f"{head.rstrip()} [... {len(text) - len(head) - len(tail)} characters ...] {tail.lstrip()}"


@dataclass(frozen=True, slots=True)
class RegionFailure:
    """Why region ``region_id`` did not acknowledge a checkpoint attempt."""

    region_id: int
    outcome: str  # RegionOutcome value: "decline" | "timeout"
    error_class: str  # "SplitReadError", "Timeout", ... ("" when the text names none)
    message: str  # the first line of the error, without the class (at most MESSAGE_CHARS)
    split_id: str | None = None
    offset: int | None = None

    def line(self) -> str:
        """One line: ``region 1 decline SplitReadError at split "a" offset 5: message``."""
        where = ""
        if self.split_id is not None:
            where = f" at split {json.dumps(self.split_id)}"
            if self.offset is not None:
                where += f" offset {self.offset}"
        cls = f" {self.error_class}" if self.error_class else ""
        return f"region {self.region_id} {self.outcome}{cls}{where}: {self.message}"


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped ("" for none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def region_failure(
    region_id: int, outcome: RegionOutcome, error: str, failed_splits: Sequence[str] = ()
) -> RegionFailure:
    """The failure of region ``region_id`` from its error text (see the module doc).

    ``failed_splits``: the splits the runner knows failed (:attr:`RegionRun.failed_splits`);
    the first names the split when the text does not.
    """
    line = first_line(error)
    error_class = ""
    found = _CLASS.match(line)
    if found is not None:
        error_class = found.group(1)
        line = line[found.end() :].strip()
    elif outcome is RegionOutcome.TIMEOUT:
        error_class = "Timeout"
    code = _CODE.match(line)
    if code is not None:
        line = line[code.end() :]
    split_id: str | None = None
    offset: int | None = None
    at = _SPLIT_AT.search(error)
    if at is not None:
        split_id, offset = str(json.loads(at.group(1))), int(at.group(2))
        lead = _SPLIT_AT.match(line)
        if lead is not None:  # the split and offset have their own fields: the message says the rest
            line = line[lead.end() :].lstrip(": ")
    else:
        planned = _SPLIT_PLANNED.search(error)
        if planned is not None:
            split_id = planned.group(1)
            error_class = error_class or "SourceError"
    if split_id is None and failed_splits:
        split_id = failed_splits[0]
    return RegionFailure(
        region_id=int(region_id),
        outcome=outcome.value,
        error_class=error_class,
        message=clip(line or outcome.value, MESSAGE_CHARS),
        split_id=split_id,
        offset=offset,
    )
