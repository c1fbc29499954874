"""Shared pieces of the pipeline CLI commands: the config and fault arguments, restart-check lines."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from splitkeeper.config.settings import PipelineConfig, ReaderMode, load_config


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


#: ``--reader-mode`` values: the two of ``source.reader_mode``, and ``configured`` (the file's).
READER_MODE_CHOICES = ("configured", "deferred", "legacy")


def add_reader_mode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reader-mode",
        default="configured",
        choices=READER_MODE_CHOICES,
        help="this run's source.reader_mode: deferred (readers wait to be assigned on recovery, "
        "FLIP-537), legacy (they keep and read the splits they restored), or configured (default: "
        "the file's)",
    )


def reader_mode(args: argparse.Namespace) -> ReaderMode | None:
    """``--reader-mode`` as the services take it (None: the file's)."""
    value = getattr(args, "reader_mode", "configured")
    return None if value in (None, "", "configured") else ReaderMode(value)


#: In-run restart checks a command prints one by one (the rest are counted; --json lists all).
CHECKS_SHOWN = 10


def restart_check_lines(name: str, checks: Sequence[str]) -> list[str]:
    """What run and recover print of their in-run restart checks (each restore proven before reading
    on): one line when every one passed, and each check that noted something (an external position
    that disagreed) in full; a failed check stopped the run with its error instead."""
    if not checks:
        return []
    passed = sum(1 for line in checks if " passed" in line and "FAILED" not in line)
    if passed == len(checks):
        head = f"{name}: every restore inside the run was proven ({passed} restart check"
        lines = [head + ("s passed)" if passed > 1 else " passed)")]
        noted = [line for line in checks if "(noted: " in line]
    else:
        lines = [f"{name}: {len(checks)} restart check(s) inside the run, {len(checks) - passed} FAILED:"]
        noted = list(checks)
    lines += [f"  {line}" for line in noted[:CHECKS_SHOWN]]
    if len(noted) > CHECKS_SHOWN:
        lines.append(f"  ... and {len(noted) - CHECKS_SHOWN} more (--json lists every one)")
    return lines
