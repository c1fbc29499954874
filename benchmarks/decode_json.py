"""How long ``records.decode`` takes for JSON: ``python -m benchmarks.decode_json [N]``.

N records of 5 fields (BIGINT, STRING, DECIMAL(10,2), TIMESTAMP, BOOLEAN), all good, decoded with
the declared schema and ``on_new_fields: rescue``; prints the median of 3 runs.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import pyarrow as pa

from splitkeeper.records.ddl import parse_ddl
from splitkeeper.records.decode import decode_values
from splitkeeper.records.spec import DecodeSpec

COLUMNS = parse_ddl("id BIGINT NOT NULL, user STRING, amount DECIMAL(10,2), at TIMESTAMP, ok BOOLEAN")


def values(n: int) -> pa.Array:
    return pa.array(
        [
            json.dumps(
                {
                    "id": i,
                    "user": f"user-{i % 977}",
                    "amount": f"{i % 10000 / 100:.2f}",
                    "at": f"2024-01-{1 + i % 28:02d}T10:{i % 60:02d}:00Z",
                    "ok": i % 3 == 0,
                }  # fmt: skip
            ).encode()
            for i in range(n)
        ],
        pa.binary(),
    )


def measure(n: int, runs: int = 3) -> tuple[float, int]:
    """The median seconds of ``runs`` decodes of ``n`` records, and ``n``."""
    data = values(n)
    spec = DecodeSpec(kind="json", columns=COLUMNS)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        out = decode_values(spec, data)
        times.append(time.perf_counter() - start)
        assert out.table.num_rows == n and not out.bad
    return statistics.median(times), n


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    seconds, _ = measure(count)
    print(f"decode json: {count} records of 5 fields in {seconds:.3f} s ({count / seconds:,.0f} records/s)")
