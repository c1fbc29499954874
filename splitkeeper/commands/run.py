"""``splitkeeper run --config FILE [--epochs N] [--until-caught-up] [--fault SPEC ...]``: run epochs."""

from __future__ import annotations

import argparse
import json

from splitkeeper.commands.common import (
    add_config_argument,
    add_fault_argument,
    add_reader_mode_argument,
    load,
    reader_mode,
    restart_check_lines,
)
from splitkeeper.config.settings import PipelineConfig, load_config, load_json
from splitkeeper.errors import InvalidParameterError


def configure(parser: argparse.ArgumentParser) -> None:
    add_config_argument(parser)
    parser.add_argument(
        "--epochs", type=int, default=None, help="epochs to run (default: until a bounded source is done)"
    )
    parser.add_argument(
        "--until-caught-up",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="unbounded sources (Kafka): end on the global checkpoint at which every split has reached "
        "the end it had when the run began (like Trigger.AvailableNow); --epochs still caps the run",
    )
    parser.add_argument(
        "--continuous",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="checkpoint every backlog.backlog_interval_s while processing backlog, every "
        "backlog.normal_interval_s afterwards, until SIGTERM/SIGINT: then end on a global checkpoint",
    )
    parser.add_argument(
        "--reset-backlog",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="unbounded sources: the end offsets now become every split's new backlog boundary "
        "(throughput epoch size and interval until caught up)",
    )
    add_reader_mode_argument(parser)
    add_fault_argument(parser)
    parser.add_argument(
        "--faults-json",
        default=None,
        metavar="JSON",
        help="faults as a JSON list, e.g. '[\"fail:1@3\"]' (what the ingest DAG passes to spark-submit)",
    )
    parser.add_argument(
        "--pipeline-json",
        default=None,
        metavar="JSON",
        help="this run's overrides of the config's tuning sections, a JSON object, e.g. "
        '\'{"backlog": {"normal_epoch_records": 5000}}\' (the ingest DAG\'s pipeline Param)',
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")


_FAULTS_JSON = 'a JSON list of fault specs, e.g. ["fail:1@3"]'


def _faults(args: argparse.Namespace) -> list[str]:
    faults = list(args.fault)
    if args.faults_json:
        try:
            extra = json.loads(args.faults_json)
        except json.JSONDecodeError as err:
            raise InvalidParameterError(
                "--faults-json", args.faults_json, "a JSON list of fault specs"
            ) from err
        if not isinstance(extra, list) or not all(isinstance(f, str) for f in extra):
            raise InvalidParameterError("--faults-json", args.faults_json, "a JSON list of fault specs")
        faults += extra
    return faults


def _load(args: argparse.Namespace) -> PipelineConfig:
    """The config with the run's ``--pipeline-json`` overrides (validated with the file)."""
    if not args.pipeline_json:
        return load(args)
    try:
        overrides = load_json(args.pipeline_json, "--pipeline-json")
    except json.JSONDecodeError as err:
        raise InvalidParameterError("--pipeline-json", args.pipeline_json, "a JSON object") from err
    return load_config(args.config, overrides=overrides)


def run(args: argparse.Namespace) -> int:
    from splitkeeper.app import services

    config = _load(args)
    result = services.run(
        config,
        epochs=args.epochs,
        faults=_faults(args),
        until_caught_up=args.until_caught_up,
        reset_backlog=args.reset_backlog,
        continuous=args.continuous,
        reader_mode=reader_mode(args),
    )
    if args.json:
        data = result.to_dict()
        print(json.dumps({**data, "epochs": len(result.epochs), "epoch_lines": data["epochs"]}))
    else:
        print(
            f"{config.name}: {len(result.epochs)} epochs, checkpoints {result.checkpoints}, "
            f"{result.committed_records:,} records committed"
            + (", source finished on a global checkpoint" if result.finished else "")
            + (", caught up with the source on a global checkpoint" if result.caught_up else "")
            + (", stopped on a global checkpoint" if result.stopped else "")
        )
        for line in restart_check_lines(config.name, result.restart_checks):
            print(line)
        if result.quarantined:
            print(
                f"{config.name}: {len(result.quarantined)} split(s) quarantined, read by nobody until "
                f"'splitkeeper recover --release SPLIT': {', '.join(result.quarantined)}"
            )
    return 0
