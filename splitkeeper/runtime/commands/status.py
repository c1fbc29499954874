"""``splitkeeper status --config FILE [--json]``: checkpoints, ownership, backlog, timeline, lease.

Read-only: the state is opened with ``read_only=True`` (nothing is created or written,
a missing state directory reads as empty) and the source is not asked (no broker or
input folder is needed).
"""

from __future__ import annotations

import argparse
import json

from splitkeeper.runtime.commands.common import add_config_argument, load


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--last", type=int, default=10, help="timeline entries to show")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.state.checkpoints import DeltaStateStore
    from splitkeeper.state.lease import PipelineLease

    config = load(args)
    store = DeltaStateStore(config.state_path, config.name, None, read_only=True)
    latest = store.latest_checkpoint()
    timeline = store.history.timeline()[-args.last :]
    holder = PipelineLease(store.tables, config.name).holder()
    status: dict[str, object] = {"pipeline": config.name, "latest_checkpoint": None, "lease": None}
    if holder is not None:
        status["lease"] = {
            "holder": holder.owner.describe(),
            "since": holder.acquired_at.isoformat(),
            "until": holder.expires_at.isoformat(),
            "released": holder.released,
        }
    if latest is not None:
        enum = latest.enumerator
        loads = {r: len(s) for r, s in (enum.assignments.items() if enum else [])}
        status["latest_checkpoint"] = {
            "id": latest.checkpoint_id,
            "kind": latest.kind.value,
            "parallelism": latest.parallelism,
            "consecutive_regional": latest.consecutive_regional,
            "processing_backlog": latest.processing_backlog,
            "failed_regions": list(latest.failed_regions),
            "ref_chain": store.ref_chain(latest.checkpoint_id),
            "loads": {str(k): v for k, v in sorted(loads.items())},
            "pool": 0 if enum is None else len(enum.pool),
            "finished_splits": 0 if enum is None else len(enum.finished),
        }
    status["timeline"] = [
        {
            "id": t.checkpoint_id,
            "kind": t.kind.value,
            "failed_regions": list(t.failed_regions),
            "reason": t.reason,
        }
        for t in timeline
    ]
    if args.json:
        print(json.dumps(status, default=str))
        return 0
    print(f"pipeline {config.name}")
    if holder is not None:
        state = "released" if holder.released else f"until {holder.expires_at.isoformat(timespec='seconds')}"
        print(
            f"  lease: {holder.owner.describe()} "
            f"since {holder.acquired_at.isoformat(timespec='seconds')}, {state}"
        )
    if latest is None:
        print("  no completed checkpoint yet")
    else:
        info = status["latest_checkpoint"]
        assert isinstance(info, dict)
        print(
            f"  latest checkpoint {info['id']} ({info['kind']}) at parallelism {info['parallelism']}, "
            f"{'processing backlog' if info['processing_backlog'] else 'caught up'}"
        )
        print(
            f"  ref chain {info['ref_chain']}, per-reader load {info['loads']}, pool {info['pool']}, "
            f"finished splits {info['finished_splits']}"
        )
    for t in timeline:
        failed = f" failed regions {list(t.failed_regions)}" if t.failed_regions else ""
        print(f"  checkpoint {t.checkpoint_id:>5} {t.kind.value:<8}{failed} {t.reason}")
    return 0
