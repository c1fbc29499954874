"""The ``splitkeeper`` console script.

Each subcommand lives in its own module, imported only when that subcommand
runs (so ``splitkeeper simulate`` never imports Spark). A command module
exposes ``configure(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``. :data:`COMMANDS` registers each one
with a function that imports its module in plain ``from ... import`` form, so
the import contracts of pyproject.toml see every arrow from the CLI.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from splitkeeper import logs
from splitkeeper.errors import RunInterrupted, SplitkeeperError


class CommandModule(Protocol):
    """What a command module exposes."""

    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class Command(NamedTuple):
    """A subcommand: its one-line help, and ``load``, which imports its module when it runs.

    (A named tuple, not a dataclass: importing dataclasses would slow ``--help`` by importing
    inspect.)"""

    help: str
    load: Callable[[], CommandModule]


#: subcommand -> its command, in the order ``--help`` lists them
COMMANDS: dict[str, Command] = {}


def _command(
    name: str, help_text: str
) -> Callable[[Callable[[], CommandModule]], Callable[[], CommandModule]]:
    def register(load: Callable[[], CommandModule]) -> Callable[[], CommandModule]:
        COMMANDS[name] = Command(help_text, load)
        return load

    return register


@_command("simulate", "run the seeded fault simulator and check the invariants")
def _simulate() -> CommandModule:
    from splitkeeper.sim import command

    return command


@_command("doctor", "check Java, Spark, Delta jars, Airflow, Great Expectations, Kafka")
def _doctor() -> CommandModule:
    from splitkeeper.commands import doctor

    return doctor


@_command("run", "run epochs of a pipeline")
def _run() -> CommandModule:
    from splitkeeper.commands import run

    return run


@_command("status", "show checkpoints, ownership and backlog state")
def _status() -> CommandModule:
    from splitkeeper.commands import status

    return status


@_command("recover", "restore from a checkpoint (global or rescale)")
def _recover() -> CommandModule:
    from splitkeeper.commands import recover

    return recover


@_command("offsets", "list every split's position and lag; reset one (offsets reset)")
def _offsets() -> CommandModule:
    from splitkeeper.commands import offsets

    return offsets


@_command("config", "print the JSON Schema of the pipeline file (config schema)")
def _config() -> CommandModule:
    from splitkeeper.commands import config

    return config


@_command("validate", "check the restart invariants on state and sink")
def _validate() -> CommandModule:
    from splitkeeper.commands import validate

    return validate


@_command("report", "render the run report (HTML with charts) from state and sink")
def _report() -> CommandModule:
    from splitkeeper.commands import report

    return report


@_command("maintain", "compact and VACUUM the state tables and the sink")
def _maintain() -> CommandModule:
    from splitkeeper.commands import maintain

    return maintain


@_command("stop", "end a continuous run on a final global checkpoint")
def _stop() -> CommandModule:
    from splitkeeper.commands import stop

    return stop


@_command("jars", "download the Spark jars an installed splitkeeper needs (jars fetch)")
def _jars() -> CommandModule:
    from splitkeeper.commands import jars

    return jars


# third-party top-level module -> the extra of pyproject.toml that installs it
ENGINE_EXTRAS: dict[str, str] = {
    "pyspark": "spark",
    "py4j": "spark",
    "delta": "spark",
    "deltalake": "spark",
    "pyarrow": "spark",
    "pandas": "spark",
    "confluent_kafka": "kafka",
    "airflow": "airflow",
    "great_expectations": "quality",
    "prometheus_client": "metrics",
    "opentelemetry": "metrics",
}


def package_version() -> str:
    """The installed distribution's version (package metadata), e.g. ``0.1.0``."""
    try:
        return importlib.metadata.version("splitkeeper")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed: pip install the wheel, or bash scripts/setup.sh in a checkout)"


EXAMPLES = """\
examples:
  splitkeeper run      --config orders.yaml --epochs 5          # five epochs, then exit
  splitkeeper run      --config orders.yaml --continuous        # until 'splitkeeper stop' or SIGTERM
  splitkeeper status   --config orders.yaml [--json|--metrics]  # checkpoints, owners, backlog
  splitkeeper recover  --config orders.yaml --parallelism 3 --dry-run   # what a rescale would do
  splitkeeper recover  --config orders.yaml --checkpoint 12 --rewind     # what a rewind to 12 would undo
  splitkeeper offsets  --config orders.yaml                     # every split: position, end, lag
  splitkeeper validate --config orders.yaml                     # the restart checks (exit 1 on a failure)
  splitkeeper report   --config orders.yaml                     # the run report: report: <path>
  splitkeeper jars fetch                                        # the Spark jars, for an installed wheel
  splitkeeper COMMAND --help                                    # every option of a command
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="splitkeeper",
        description=__doc__.splitlines()[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {package_version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"splitkeeper {package_version()}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        parser = build_parser()
        if argv and argv[0] not in ("-h", "--help"):
            parser.error(f"unknown command {argv[0]!r}; choose one of: {', '.join(COMMANDS)}")
        parser.print_help()
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    command = COMMANDS[name]
    try:
        module = command.load()
    except ModuleNotFoundError as err:
        if err.name and (err.name == "splitkeeper" or err.name.startswith("splitkeeper.")):
            print(f"splitkeeper {name}: not available in this build ({err.name} missing)", file=sys.stderr)
            return 2
        return _missing_engine(name, err)
    parser = argparse.ArgumentParser(prog=f"splitkeeper {name}", description=command.help)
    module.configure(parser)
    parser.add_argument(
        "--log-level",
        default=logs.default_level(),
        choices=logs.LEVELS,
        help=f"log level (default {logs.default_level()}; ${logs.LEVEL_ENV})",
    )
    parser.add_argument(
        "--log-format",
        default=logs.default_format(),
        choices=logs.FORMATS,
        help=f"text, or json lines with pipeline, epoch, checkpoint id and region (${logs.FORMAT_ENV})",
    )
    args = parser.parse_args(rest)
    logs.configure(args.log_level, args.log_format)
    try:
        return int(module.run(args) or 0)
    except RunInterrupted as err:  # SIGINT/SIGTERM: one line, 128 + the signal, like a shell reports it
        print(f"splitkeeper {name}: {err}", file=sys.stderr)
        return err.exit_code
    except SplitkeeperError as err:
        print(f"splitkeeper {name}: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        return _missing_engine(name, err)
    except KeyboardInterrupt:  # SIGINT outside a run's own handling (start-up, a read-only command)
        print(f"splitkeeper {name}: interrupted (SIGINT); nothing more was done", file=sys.stderr)
        return 130


def _missing_engine(command: str, err: ModuleNotFoundError) -> int:
    """An engine that an extra installs is missing: say which extra (exit 2); anything else re-raises."""
    missing = (err.name or "").partition(".")[0]
    extra = ENGINE_EXTRAS.get(missing)
    if extra is None:
        raise err
    print(
        f"splitkeeper {command}: needs {missing}, which is not installed: pip install 'splitkeeper[{extra}]'",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
