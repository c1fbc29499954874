"""``splitkeeper-tools``: the checkout's tools, beside the product's ``splitkeeper`` command.

``bench`` and ``chaos`` follow the product's command contract (``configure(parser)`` and
``run(args) -> int``); ``demo``, ``cluster``, ``kafka`` and ``s3`` are programs with their own
``main(argv)``. Each module is imported only when its command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from splitkeeper import logs
from splitkeeper.errors import RunInterrupted, SplitkeeperError

#: command -> (module, kind, one-line help); kind "command" = configure/run, "main" = main(argv)
TOOLS: dict[str, tuple[str, str, str]] = {
    "bench": ("splitkeeper_tools.bench.command", "command", "run a benchmark and print figures"),
    "chaos": ("splitkeeper_tools.chaos", "command", "ingest under injected faults and prove exactly-once"),
    "demo": ("splitkeeper_tools.demo", "main", "the demo of scripts/run.sh"),
    "cluster": ("splitkeeper_tools.cluster.local", "main", "the local cluster of scripts/cluster.sh"),
    "kafka": ("splitkeeper_tools.kafka_broker", "main", "a local Kafka broker (scripts/kafka.sh)"),
    "s3": ("splitkeeper_tools.cluster.s3", "main", "buckets of an S3-compatible store (create-bucket)"),
}


def _help() -> str:
    width = max(len(name) for name in TOOLS)
    rows = "\n".join(f"  {name.ljust(width)}  {help_text}" for name, (_, _, help_text) in TOOLS.items())
    return f"usage: splitkeeper-tools COMMAND [options]\n\n{__doc__.splitlines()[0]}\n\ncommands:\n{rows}\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_help(), end="")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(
            f"splitkeeper-tools: unknown command {name!r}; choose one of: {', '.join(TOOLS)}", file=sys.stderr
        )
        return 2
    module_name, kind, help_text = TOOLS[name]
    module = importlib.import_module(module_name)
    if kind == "main":
        return int(module.main(rest) or 0)
    parser = argparse.ArgumentParser(prog=f"splitkeeper-tools {name}", description=help_text)
    module.configure(parser)
    parser.add_argument("--log-level", default=logs.default_level(), choices=logs.LEVELS)
    parser.add_argument("--log-format", default=logs.default_format(), choices=logs.FORMATS)
    args = parser.parse_args(rest)
    logs.configure(args.log_level, args.log_format)
    try:
        return int(module.run(args) or 0)
    except RunInterrupted as err:
        print(f"splitkeeper-tools {name}: {err}", file=sys.stderr)
        return err.exit_code
    except SplitkeeperError as err:
        print(f"splitkeeper-tools {name}: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
