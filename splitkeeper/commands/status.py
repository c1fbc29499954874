"""``splitkeeper status --config FILE [--json]``: checkpoints, ownership, backlog, timeline (read-only)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from splitkeeper.commands.common import add_config_argument, load_to_read

if TYPE_CHECKING:  # pragma: no cover
    from splitkeeper.app.results import SplitLine


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--last", type=int, default=10, help="timeline entries to show")
    parser.add_argument(
        "--splits", type=int, default=20, help="splits to list, most lag first (--json lists all)"
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="print the metrics of the last run (Prometheus text, <state>/metrics.prom) instead",
    )


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    if args.metrics:
        print(services.metrics_text(load_to_read(args)), end="")
        return 0
    result = services.status(load_to_read(args), last=args.last)
    blocked = 1 if result.problems else 0  # a run cannot proceed (or reads nothing): not healthy
    if args.json:
        print(json.dumps(result.to_dict(), default=str))
        return blocked
    print(f"pipeline {result.pipeline}")
    for problem in result.problems:
        print(f"  BLOCKED: {problem}")
    info = result.latest_checkpoint
    if info is None:
        print("  no completed checkpoint yet")
    else:
        print(
            f"  latest checkpoint {info.id} ({info.kind}) at parallelism {info.parallelism}, "
            f"{'processing backlog' if info.processing_backlog else 'caught up'}"
        )
        print(
            f"  ref chain {list(info.ref_chain)}, per-reader load {info.loads}, pool {info.pool}, "
            f"finished splits {info.finished_splits}"
        )
        if info.quarantined:
            parked = ", ".join(f"{sid} at {pos}" for sid, pos in sorted(info.quarantined.items()))
            print(f"  quarantined (read by nobody until 'recover --release SPLIT'): {parked}")
    lease = result.lease
    if lease is not None:
        state = "released" if lease["released"] else f"until {lease['until']}"
        print(f"  lease: {lease['holder']} since {lease['since']}, {state}")
    for line in result.restart_checks:
        print(f"  {line}")
    if result.discovery:
        counts = result.discovery
        print(
            f"  event discovery (last run): {counts.get('listings', 0)} full listings, "
            f"{counts.get('skipped_events', 0)} messages of the event topic skipped (not S3 events)"
        )
    for at, mode in result.interval_switches:
        print(f"  checkpoint interval switched to the {mode} interval after checkpoint {at}")
    _print_splits(result.splits, args.splits)
    for t in result.timeline:
        failed = f" failed regions {list(t.failed_regions)}" if t.failed_regions else ""
        phases = " ".join(f"{p}={ms}ms" for p, ms in t.phases_ms.items())
        print(f"  checkpoint {t.id:>5} {t.kind:<8}{failed} {phases} {t.reason}".rstrip())
        for cause in t.failures:
            print(f"      {cause}")
    return blocked


def _print_splits(splits: Sequence[SplitLine], shown: int) -> None:
    """The splits table: split, owner, position, end, lag, backlog flag; most lag first."""
    if not splits:
        return
    head = ("split", "owner", "position", "end", "lag", "backlog")
    rows = [
        (
            s.split,
            str(s.owner) if s.owner is not None else s.status,
            f"{s.position:,}",
            "-" if s.end is None else f"{s.end:,}",
            "?" if s.lag is None else f"{s.lag:,}",
            "yes" if s.backlog else "no",
        )
        for s in splits[: max(0, shown)]
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    total = sum(s.lag or 0 for s in splits)
    print(
        f"  splits: {len(splits)} live, total lag {total:,} offsets "
        "(lag: to the end, or to the backlog boundary)"
    )
    for row in (head, *rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = (v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in pairs)
        print("    " + "  ".join(cells))
    if len(splits) > len(rows):
        print(f"    ... {len(splits) - len(rows)} more (--splits N, or --json)")
