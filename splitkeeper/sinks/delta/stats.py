"""Delta file statistics of a parquet file, from its footer (no data read): what an add action carries
(numRecords, minValues, maxValues, nullCount), so readers prune files of a committed epoch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.parquet as pq

__all__ = ["STRING_STATS_PREFIX", "file_statistics"]

#: Delta statistics keep string bounds short; longer minimums are cut, longer maximums left out.
STRING_STATS_PREFIX = 32


def _stat_value(value: Any, *, upper: bool) -> Any:
    """A footer min/max as Delta statistics JSON holds it; None when it cannot be a safe bound."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        moment = moment.astimezone(UTC)
        millis = moment.replace(microsecond=(moment.microsecond // 1000) * 1000)
        if upper and millis != moment:  # milliseconds in the JSON: round the upper bound up
            millis += timedelta(milliseconds=1)
        return millis.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis.microsecond // 1000:03d}Z"
    if isinstance(value, str):
        if len(value) <= STRING_STATS_PREFIX:
            return value
        return None if upper else value[:STRING_STATS_PREFIX]
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


def file_statistics(metadata: pq.FileMetaData, columns: Sequence[str]) -> dict[str, Any]:
    """Delta file statistics of ``columns`` from a parquet footer: numRecords, minValues,
    maxValues, nullCount (a column whose row groups lack statistics gets none)."""
    names = metadata.schema.to_arrow_schema().names
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        if name not in names:
            continue
        index = names.index(name)
        low = high = None
        count = 0
        complete = True
        for group in range(metadata.num_row_groups):
            chunk = metadata.row_group(group).column(index)
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                complete = False
                break
            count += int(stats.null_count)
            if chunk.num_values == stats.null_count:
                continue  # all NULL: no bounds from this group
            if not stats.has_min_max:
                complete = False
                break
            low = stats.min if low is None or stats.min < low else low
            high = stats.max if high is None or stats.max > high else high
        if not complete:
            continue
        nulls[name] = count
        if low is not None and high is not None:
            low_value, high_value = _stat_value(low, upper=False), _stat_value(high, upper=True)
            if low_value is not None:
                mins[name] = low_value
            if high_value is not None:
                maxs[name] = high_value
    return {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
