"""Shared pieces of the pipeline CLI commands: the config and fault arguments, restart-check lines."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

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


#: In-run restart checks a command prints one by one (the rest are counted; --json lists all).
CHECKS_SHOWN = 10


def restart_check_lines(name: str, checks: Sequence[str]) -> list[str]:
    """What run and recover print of their in-run restart checks (each restore proven before reading on)."""
    if not checks:
        return []
    lines = [f"{name}: {len(checks)} restart check(s) inside the run:"]
    lines += [f"  {line}" for line in checks[:CHECKS_SHOWN]]
    if len(checks) > CHECKS_SHOWN:
        lines.append(f"  ... and {len(checks) - CHECKS_SHOWN} more (--json lists every one)")
    return lines
