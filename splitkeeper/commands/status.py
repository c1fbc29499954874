"""``splitkeeper status --config FILE [--json]``: checkpoints, ownership, backlog, timeline (read-only)."""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import add_config_argument, load


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--last", type=int, default=10, help="timeline entries to show")
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="print the metrics of the last run (Prometheus text, <state>/metrics.prom) instead",
    )


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    if args.metrics:
        print(services.metrics_text(load(args)), end="")
        return 0
    result = services.status(load(args), last=args.last)
    if args.json:
        print(json.dumps(result.to_dict(), default=str))
        return 0
    print(f"pipeline {result.pipeline}")
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
    for at, mode in result.interval_switches:
        print(f"  checkpoint interval switched to the {mode} interval after checkpoint {at}")
    for t in result.timeline:
        failed = f" failed regions {list(t.failed_regions)}" if t.failed_regions else ""
        print(f"  checkpoint {t.id:>5} {t.kind:<8}{failed} {t.reason}")
    return 0
