"""Shared pieces of the pipeline CLI commands: the config and fault arguments."""

from __future__ import annotations

import argparse

from splitkeeper.config.settings import PipelineConfig, load_config


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the pipeline configuration file (YAML or TOML)")


def add_fault_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault: fail:REGION@EPOCH, flaky:REGION@EPOCH (first task attempt only) or "
        "stall[:SECONDS]:REGION@EPOCH (repeatable)",
    )


def load(args: argparse.Namespace) -> PipelineConfig:
    return load_config(args.config)


def load_to_read(args: argparse.Namespace) -> PipelineConfig:
    """The config of a command that runs no record through the pipeline (``status``, ``offsets``,
    ``stop``): every rule of the file holds, but the transform and notification modules and the
    Kafka client library are not imported to check them, so such a command works while a
    transform's module cannot be imported (``run`` still refuses it)."""
    return load_config(args.config, imports=False)
