"""``splitkeeper recover --config FILE --checkpoint ID|latest [--parallelism P] [--dry-run]``.

A global restore (optionally a rescale): the enumerator is restored from the
checkpoint, every reader reports its restored splits, each split's recovery
decision is printed, and (unless ``--dry-run``) one epoch runs so that the new
assignment is committed by a checkpoint at the new parallelism. A dry run opens the
state and the sink read-only: it creates and writes nothing.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from splitkeeper.errors import InvalidParameterError
from splitkeeper.runtime.commands.common import (
    add_config_argument,
    add_fault_argument,
    load,
    progress,
    spark_session,
)


def checkpoint_arg(text: str) -> int | None:
    if text == "latest":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise InvalidParameterError("--checkpoint", text, "'latest' or a checkpoint id (a positive integer)")


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument("--checkpoint", default="latest", help="checkpoint id or 'latest' (default)")
    parser.add_argument("--parallelism", type=int, default=None, help="new parallelism (a rescale)")
    parser.add_argument("--dry-run", action="store_true", help="only print the recovery plan")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to run after the restore (default 1)")
    add_fault_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.runtime.faults import FaultPlan
    from splitkeeper.runtime.pipeline import Pipeline

    checkpoint = checkpoint_arg(args.checkpoint)
    if args.parallelism is not None and args.parallelism < 1:
        raise InvalidParameterError("--parallelism", args.parallelism, "an integer >= 1")
    pipeline = Pipeline(
        load(args),
        spark_session(),
        faults=FaultPlan.parse(args.fault),
        progress=progress,
        read_only=bool(args.dry_run),
    )
    try:
        opened = pipeline.open(
            checkpoint_id=checkpoint, parallelism=args.parallelism, read_only=bool(args.dry_run)
        )
        decisions = Counter(d.decision.value for d in opened.decisions)
        loads = pipeline.enumerator.loads() if pipeline.enumerator else {}
        summary = {
            "restored_from": opened.restored_from,
            "redone_checkpoint": opened.redone_checkpoint,
            "parallelism": opened.parallelism,
            "previous_parallelism": opened.previous_parallelism,
            "decisions": dict(decisions),
            "loads": {str(k): v for k, v in sorted(loads.items())},
            "external_disagreements": list(opened.external_disagreements),
            "dry_run": bool(args.dry_run),
        }
        if not args.json:
            print(
                f"restored from checkpoint {opened.restored_from} at parallelism {opened.parallelism}"
                + (f" (was {opened.previous_parallelism})" if opened.previous_parallelism else "")
            )
            print(opened.mode_reason)
            for d in opened.decisions:
                print(f"  {d.split_id:<40} reader {d.reader_id!s:<5} {d.decision.value:<32} {d.detail}")
            print("per-reader load:", summary["loads"])
        if not args.dry_run and args.epochs > 0:
            run_summary = pipeline.run(args.epochs)
            summary["checkpoints"] = run_summary.counts()
            summary["committed_records"] = run_summary.committed_records
        if args.json:
            print(json.dumps(summary))
    finally:
        pipeline.close()
    return 0
