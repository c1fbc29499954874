"""Generate sample input files for the file-source examples.

Deterministic for a given seed: the same arguments write byte-identical files.
Each record is one JSON object per line (``--format jsonl``, the default) or a
plain text line (``--format lines``)::

    {"id": 17, "user": "u0042", "amount": 12.5, "ts": 1700000000017, "note": "..."}

Files are written under a hidden name (``.name.tmp``) and renamed when
complete, which is how producers should drop files for splitkeeper (the file
source skips names starting with '.' or '_' and expects visible files not to
change).

    python examples/make_files.py var/examples/files/incoming --files 4 --lines 5000
    python examples/make_files.py /tmp/big --files 1 --lines 2000000 --line-bytes 100   # ~200 MB
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from collections.abc import Sequence

BASE_TS_MS = 1_700_000_000_000


def make_line(rng: random.Random, record_id: int, fmt: str, line_bytes: int) -> str:
    """One record line without its newline, about ``line_bytes`` long (varies by +-25%)."""
    user = f"u{rng.randrange(1000):04d}"
    amount = round(rng.lognormvariate(2.5, 1.2), 2)
    if fmt == "lines":
        head = f"{record_id}\t{user}\t{amount}\t"
    else:
        head = json.dumps({"id": record_id, "user": user, "amount": amount, "ts": BASE_TS_MS + record_id})
        head = head[:-1] + ', "note": "'
    target = max(len(head) + 2, int(line_bytes * rng.uniform(0.75, 1.25)))
    pad = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz ", k=max(0, target - len(head) - 2)))
    return head + pad + ("" if fmt == "lines" else '"}')


def write_files(
    out: str,
    files: int,
    lines: int,
    fmt: str = "jsonl",
    line_bytes: int = 100,
    seed: int = 7,
    first_file: int = 0,
) -> list[str]:
    """Write ``files`` files of ``lines`` lines each into ``out``; returns their paths."""
    os.makedirs(out, exist_ok=True)
    rng = random.Random(seed * 1_000_003 + first_file)
    ext = "jsonl" if fmt == "jsonl" else "txt"
    paths = []
    record_id = first_file * lines
    for index in range(first_file, first_file + files):
        name = f"part-{index:05d}.{ext}"
        final, tmp = os.path.join(out, name), os.path.join(out, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            chunk: list[str] = []
            for _ in range(lines):
                chunk.append(make_line(rng, record_id, fmt, line_bytes))
                record_id += 1
                if len(chunk) >= 10_000:
                    f.write("\n".join(chunk) + "\n")
                    chunk.clear()
            if chunk:
                f.write("\n".join(chunk) + "\n")
        os.replace(tmp, final)
        paths.append(final)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write into (created if missing)")
    parser.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    parser.add_argument("--lines", type=int, default=5000, help="lines per file (default 5000)")
    parser.add_argument("--format", choices=("jsonl", "lines"), default="jsonl")
    parser.add_argument("--line-bytes", type=int, default=100, help="mean line length in bytes (default 100)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--first-file", type=int, default=0, help="index of the first file (to drop more files later)"
    )
    args = parser.parse_args(argv)
    if args.files < 0 or args.lines < 0 or args.line_bytes < 1:
        parser.error("--files and --lines must be >= 0, --line-bytes >= 1")
    paths = write_files(
        args.out, args.files, args.lines, args.format, args.line_bytes, args.seed, args.first_file
    )
    total = sum(os.path.getsize(p) for p in paths)
    print(f"wrote {len(paths)} files, {args.files * args.lines} lines, {total} bytes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
