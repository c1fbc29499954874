"""``splitkeeper run --config FILE [--epochs N] [--until-caught-up] [--fault SPEC ...]``: run epochs."""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import (
    add_config_argument,
    add_fault_argument,
    load,
    progress,
    spark_session,
)


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs to run (default: until a bounded source is done)"
    )
    parser.add_argument(
        "--until-caught-up",
        action="store_true",
        help="unbounded sources (Kafka): end on the global checkpoint at which every split has reached "
        "the end it had when the run began (like Trigger.AvailableNow); --epochs still caps the run",
    )
    add_fault_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


def run(args: argparse.Namespace) -> int:
    from splitkeeper.runtime.pipeline import run_pipeline

    config = load(args)
    summary = run_pipeline(
        config,
        spark_session(),
        epochs=args.epochs,
        faults=args.fault,
        progress=progress,
        until_caught_up=args.until_caught_up,
    )
    result = {
        "pipeline": config.name,
        "epochs": len(summary.epochs),
        "checkpoints": summary.counts(),
        "committed_records": summary.committed_records,
        "finished": summary.finished,
        "caught_up": summary.caught_up,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{config.name}: {result['epochs']} epochs, checkpoints {result['checkpoints']}, "
            f"{summary.committed_records:,} records committed"
            + (", source finished on a global checkpoint" if summary.finished else "")
            + (", caught up with the source on a global checkpoint" if summary.caught_up else "")
        )
    return 0
