"""``splitkeeper-tools bench NAME [options]``: dispatch to one benchmark module.

Each benchmark is a module exposing ``configure(parser)`` and ``run(args) -> int``
(the same contract as the top-level commands). To add one, add a row to
:data:`BENCHMARKS`; its module is imported only when it runs.
"""

from __future__ import annotations

import argparse
import importlib

from splitkeeper.errors import InvalidParameterError

# benchmark name -> (module, one-line help)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "assign": (
        "splitkeeper_tools.bench.assign",
        "full balanced assignment of N splits over R readers, then one reader fails",
    ),
    "balance": (
        "splitkeeper_tools.bench.balance",
        "weighted balancing with a hot partition (8 partitions, one at 10x, P=4) vs least-loaded",
    ),
    "scale": (
        "splitkeeper_tools.bench.scale",
        "the driver's cost as the work grows: epoch overhead, restore after 200 checkpoints, RSS at 1M",
    ),
    "incident": (
        "splitkeeper_tools.bench.incident",
        "the on-call commands (status, offsets, every --dry-run) as fresh processes, no JVM: the 2 s target",
    ),
    "ingest": (
        "splitkeeper_tools.bench.ingest",
        "exactly-once ingest into Delta: splitkeeper pipeline vs Structured Streaming (--source files|kafka)",
    ),
    "latency": (
        "splitkeeper_tools.bench.latency",
        "produce-to-visible latency at a steady Kafka rate: continuous splitkeeper vs Structured Streaming",
    ),
    "table": (
        "splitkeeper_tools.bench.table",
        "run the README's speed benchmarks and regenerate its table (--write README.md), with the load",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    names = ", ".join(BENCHMARKS)
    parser.add_argument("benchmark", metavar="BENCHMARK", help=f"one of: {names}")
    parser.add_argument(
        "options", nargs=argparse.REMAINDER, help="options of that benchmark (see BENCHMARK --help)"
    )


def run(args: argparse.Namespace) -> int:
    name = args.benchmark
    if name not in BENCHMARKS:
        raise InvalidParameterError("benchmark", name, "one of " + ", ".join(BENCHMARKS))
    module_name, help_text = BENCHMARKS[name]
    if name == "ingest":  # --source kafka runs its own module once it exists
        from splitkeeper_tools.bench.ingest import module_for_source

        module_name = module_for_source(args.options)
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"splitkeeper-tools bench {name}", description=help_text)
    module.configure(parser)
    return int(module.run(parser.parse_args(args.options)) or 0)
