"""``splitkeeper offsets --config FILE [--json]`` and ``offsets reset --split S --to WHERE [--dry-run]``.

The list: per split its owner, position, end, lag, backlog flag and the checkpoint its position
comes from. The reset sets one split's position, like ``kafka-consumer-groups --reset-offsets``
(``--to offset:N | timestamp:MS | earliest | latest | shift:K``): an audited operator checkpoint
(:mod:`splitkeeper.app.incident`), refused while a run holds the lease. Neither starts Spark.
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import load_to_read


def _config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", default=argparse.SUPPRESS, help="the pipeline configuration file (YAML or TOML)"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    _config_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON on stdout")
    sub = parser.add_subparsers(dest="action")
    reset = sub.add_parser(
        "reset", help="set one split's position (audited; never while a run holds the lease)"
    )
    _config_argument(reset)
    reset.add_argument("--split", required=True, help="the split id (splitkeeper offsets lists them)")
    reset.add_argument(
        "--to",
        required=True,
        help="offset:N, timestamp:MS (Kafka: the first offset at or after it), earliest, latest, or shift:K "
        "(K < 0 reads K offsets again)",
    )
    reset.add_argument("--reason", default="", help="why (kept in the audit trail)")
    reset.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    reset.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import incident
    from splitkeeper.errors import InvalidParameterError

    if not getattr(args, "config", None):
        raise InvalidParameterError("--config", None, "the pipeline configuration file (YAML or TOML)")
    if args.action == "reset":
        result = incident.reset_offset(
            load_to_read(args), args.split, args.to, dry_run=args.dry_run, reason=args.reason
        )
        if args.json:
            print(json.dumps(result.to_dict()))
            return 0
        verb = "set" if result.applied else "would be set"
        print(
            f"split {result.split_id}: position {result.position_before} {verb} to {result.position_after} "
            f"(checkpoint {result.epoch})"
        )
        change = result.change
        if change.get("clamped_to"):
            print(
                f"  offset {change['requested']:,} is outside the split's log: clamped to "
                f"{change['clamped_to']} (as kafka-consumer-groups --reset-offsets does)"
            )
        if change.get("skipped"):
            print(f"  {change['skipped']:,} offsets skipped (never read; recorded for the restart checks)")
        if change.get("undone"):
            print(f"  {change['undone']:,} offsets read again")
        for table, rows in result.rows_leaving.items():
            print(f"  {table}: {rows:,} rows leave (read again by the next run)")
        print("dry run: nothing was written" if result.dry_run else f"by {result.operator}")
        return 0
    listed = incident.offsets(load_to_read(args))
    if args.json:
        print(json.dumps(listed.to_dict()))
        return 0
    print(f"pipeline {listed.pipeline}: checkpoint {listed.checkpoint}")
    if listed.lease:
        print(f"a run holds the lease: {listed.lease}")
    print(
        f"  {'split':<40} {'status':<11} {'owner':>5} {'position':>12} {'end':>12} {'lag':>10} "
        "backlog  checkpoint"
    )
    for s in listed.splits:
        print(
            f"  {s.split_id:<40} {s.status:<11} {_n(s.owner):>5} {_n(s.position):>12} {_n(s.end):>12} "
            f"{_n(s.lag):>10} {'yes' if s.backlog else 'no':<8} {s.checkpoint}"
        )
    return 0


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
