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
