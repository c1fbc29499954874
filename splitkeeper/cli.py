"""The ``splitkeeper`` console script.

Each subcommand lives in its own module, imported only when that subcommand
runs (so ``splitkeeper simulate`` never imports Spark). A command module
exposes ``configure(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from splitkeeper.errors import SplitkeeperError

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("splitkeeper.sim.command", "run the seeded fault simulator and check the invariants"),
    "bench": ("splitkeeper.bench.command", "run a benchmark and print figures"),
    "doctor": ("splitkeeper.doctor", "check Java, Spark, Delta jars, Airflow, Great Expectations, Kafka"),
    "run": ("splitkeeper.commands.run", "run epochs of a pipeline"),
    "status": ("splitkeeper.commands.status", "show checkpoints, ownership and backlog state"),
    "recover": ("splitkeeper.commands.recover", "restore from a checkpoint (global or rescale)"),
    "validate": ("splitkeeper.commands.validate", "check the DESIGN 6 invariants on state and sink"),
    "chaos": ("splitkeeper.chaos", "ingest under injected faults and prove exactly-once"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="splitkeeper", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_module, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            print(f"splitkeeper {name}: not available in this build ({module_name} missing)", file=sys.stderr)
            return 2
        raise
    parser = argparse.ArgumentParser(prog=f"splitkeeper {name}", description=help_text)
    module.configure(parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except SplitkeeperError as err:
        print(f"splitkeeper {name}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
