"""``splitkeeper maintain --config FILE [--history-hours H] [--dry-run] [--json]``: compaction and VACUUM.

Deletes state rows nothing reads any more, bin-packs the small files of the state
tables and the sink, and VACUUMs the files commits removed more than ``--history-hours``
ago (default ``maintenance.history_hours``), printing every file it removed; then it removes the
files in the sink's folder that no Delta version names and the staged files of epochs the sink
recorded, once older than ``maintenance.untracked_hours`` (count and bytes in the summary). It holds
the pipeline's lease while it writes, so it never runs beside an ingest. Never removes a
file a kept checkpoint (and so a retained ref chain) or an epoch not committed yet needs.
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import add_config_argument, load


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--history-hours",
        type=float,
        default=None,
        help="VACUUM keeps files removed less than this long ago (default: maintenance.history_hours)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="list what VACUUM would remove; change nothing"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    result = services.maintain(load(args), history_hours=args.history_hours, dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    verb = "would remove" if result.dry_run else "removed"
    for table, files in sorted(result.vacuumed.items()):
        for path in files:
            print(f"{verb} {table}: {path}")
    for where, files in sorted(result.untracked.items()):
        for path in files:
            print(f"{verb} untracked {where}: {path}")
    if not result.dry_run:
        rows = ", ".join(f"{t} {n}" for t, n in sorted(result.deleted_rows.items()) if n) or "none"
        packed = ", ".join(f"{t} {n}" for t, n in sorted(result.compacted_files.items()) if n) or "none"
        print(f"state rows nothing reads, deleted: {rows}; small files compacted: {packed}")
    print(
        f"{result.pipeline}: {verb} {result.untracked_count} untracked file(s), {result.untracked_bytes} "
        f"bytes, that no Delta version names, older than {result.untracked_hours:g} h"
    )
    print(
        f"{result.pipeline}: {verb} {result.vacuumed_count} file(s) older than {result.history_hours:g} h"
        + (" (dry run: nothing changed)" if result.dry_run else "")
    )
    return 0
