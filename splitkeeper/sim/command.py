"""``splitkeeper simulate``: run the seeded fault simulator and check the protocol section 6 invariants.

Exit codes: 0 when every invariant held after every step, 1 when one broke
(the shortest event sequence that still breaks it is printed), 2 for bad input
(the message names the option, the value and what is allowed).

With ``--json`` stdout carries exactly one JSON object (the keys of
:meth:`SimulationResult.to_dict` plus ``config``) and nothing goes to stderr
unless the input is bad; without it a readable summary goes to stdout and a
progress line every ``--progress-every`` steps to stderr. The output depends
only on the options (no timings in the JSON).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from splitkeeper.core.assignment import STRATEGIES
from splitkeeper.errors import InvalidParameterError
from splitkeeper.sim.broken import BUGS, bug_by_name
from splitkeeper.sim.shrink import simulate
from splitkeeper.sim.simulator import Components, SimConfig, SimulationResult

#: Violations listed in the text summary (all of them are in the JSON).
SHOWN_VIOLATIONS = 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--readers", type=int, default=4, help="starting parallelism (>= 1; default 4)")
    parser.add_argument("--splits", type=int, default=64, help="splits in the source at start (default 64)")
    parser.add_argument("--steps", type=int, default=1000, help="events after the start (default 1000)")
    parser.add_argument(
        "--failure-rate",
        type=float,
        default=0.1,
        help="probability that a step is a fault, 0..1 (default 0.1)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the event generator (default 0)")
    parser.add_argument(
        "--strategy",
        default="least-loaded",
        help="assignment strategy: " + ", ".join(sorted(STRATEGIES)) + " (default least-loaded)",
    )
    parser.add_argument(
        "--max-consecutive-failures",
        type=int,
        default=3,
        help="regional checkpoints in a row before one is forced global (>= 0; default 3)",
    )
    parser.add_argument(
        "--max-failure-ratio",
        type=float,
        default=0.5,
        help="largest share of regions that may fail a regional checkpoint, 0..1 (default 0.5)",
    )
    parser.add_argument(
        "--legacy-readers",
        action="store_true",
        help="readers keep their restored splits (no FLIP-537 deferred assignment)",
    )
    parser.add_argument(
        "--inject-bug",
        default=None,
        metavar="NAME",
        help="run with a deliberately broken component to see it caught: " + ", ".join(sorted(BUGS)),
    )
    parser.add_argument(
        "--no-shrink", action="store_true", help="do not look for the shortest failing sequence"
    )
    parser.add_argument(
        "--max-shrink-runs", type=int, default=400, help="replays the shrinker may use (default 400)"
    )
    parser.add_argument(
        "--progress-every", type=int, default=1000, help="a progress line every N steps on stderr (0: none)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _config(args: argparse.Namespace) -> SimConfig:
    for name in ("max_shrink_runs", "progress_every"):
        if getattr(args, name) < 0:
            raise InvalidParameterError(_flag(name), getattr(args, name), "an integer >= 0")
    try:
        return SimConfig(
            readers=args.readers,
            splits=args.splits,
            steps=args.steps,
            failure_rate=args.failure_rate,
            seed=args.seed,
            strategy=args.strategy,
            max_consecutive_failures=args.max_consecutive_failures,
            max_failure_ratio=args.max_failure_ratio,
            reassign_on_recovery=not args.legacy_readers,
        )
    except InvalidParameterError as err:
        # name the command-line option, not the field
        raise InvalidParameterError(_flag(err.name), err.value, err.allowed) from err


def _config_dict(config: SimConfig, bug: str | None) -> dict[str, Any]:
    return {
        "readers": config.readers,
        "splits": config.splits,
        "steps": config.steps,
        "failure_rate": config.failure_rate,
        "seed": config.seed,
        "strategy": config.strategy,
        "max_consecutive_failures": config.max_consecutive_failures,
        "max_failure_ratio": config.max_failure_ratio,
        "legacy_readers": not config.reassign_on_recovery,
        "inject_bug": bug,
    }


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    components = Components()
    if args.inject_bug is not None:
        try:
            components = bug_by_name(args.inject_bug).components
        except InvalidParameterError as err:
            raise InvalidParameterError("--inject-bug", err.value, err.allowed) from err

    def progress(step: int, total: int, partial: SimulationResult) -> None:
        c = partial.checkpoints
        print(
            f"step {step}/{total}: checkpoints {c.global_} global, {c.regional} regional, "
            f"{c.aborted} aborted; {partial.records_committed:,} records committed; "
            f"{len(partial.violations)} violation(s)",
            file=sys.stderr,
            flush=True,
        )

    started = time.perf_counter()
    # With --json the JSON is the whole output: the driver's log lines (rebalances, dropped
    # subscriptions) stay out of stderr.
    driver_log = logging.getLogger("splitkeeper.driver")
    level = driver_log.level
    if args.json:
        driver_log.setLevel(logging.ERROR)
    try:
        result = simulate(
            config,
            components=components,
            shrink=not args.no_shrink,
            max_shrink_runs=args.max_shrink_runs,
            progress=None if args.json else progress,
            progress_every=0 if args.json else args.progress_every,
        )
    finally:
        driver_log.setLevel(level)
    elapsed = time.perf_counter() - started
    if args.json:
        payload = {"config": _config_dict(config, args.inject_bug), **result.to_dict()}
        print(json.dumps(payload, sort_keys=False))
    else:
        print(_summary(config, result, args.inject_bug, elapsed))
    return 0 if result.ok else 1


def _summary(config: SimConfig, result: SimulationResult, bug: str | None, elapsed: float) -> str:
    c = result.checkpoints
    mode = "legacy readers" if not config.reassign_on_recovery else "deferred assignment"
    lines = [
        f"splitkeeper simulate: {config.readers} readers, {config.splits} splits, {config.steps} steps, "
        f"failure rate {config.failure_rate}, seed {config.seed}, strategy {config.strategy}, "
        f"max consecutive failures {config.max_consecutive_failures}, {mode}"
        + (f", injected bug {bug}" if bug else ""),
    ]
    if result.ok:
        lines.append("result: OK: every invariant held after every step")
    else:
        lines.append(f"result: FAILED: {len(result.violations)} violation(s)")
    rate = result.steps_run / elapsed if elapsed > 0 else 0.0
    lines += [
        f"  steps run               {result.steps_run}"
        + (" (stopped early)" if result.stopped_early else ""),
        f"  checkpoints             {c.global_} global, {c.regional} regional, {c.aborted} aborted "
        f"({result.refused_during_restore} refused during a restore)",
        f"  records committed       {result.records_committed:,} (lost {result.records_lost}, "
        f"duplicated {result.records_duplicated}, beyond the checkpoint {result.records_unexpected})",
        f"  splits                  lost {result.splits_lost}, duplicated {result.splits_duplicated}",
        f"  max imbalance           {result.max_imbalance} (max - min splits per reader)",
        f"  max ref chain depth     {result.max_ref_chain_depth} "
        f"(bound: max_consecutive_failures={config.max_consecutive_failures})",
        f"  partial failovers       {result.partial_failovers}, {result.moves_per_failover} split(s) moved "
        f"per failover ({result.foreign_moves} of other readers)",
        f"  restores                {result.global_restores} global, {result.rescales} of them rescales; "
        f"final parallelism {result.final_parallelism}",
        f"  elapsed                 {elapsed:.1f} s ({rate:.0f} steps/s)",
    ]
    if result.violations:
        lines.append("violations (first occurrence of each):")
        lines += [f"  {f}" for f in result.violations[:SHOWN_VIOLATIONS]]
        if len(result.violations) > SHOWN_VIOLATIONS:
            lines.append(f"  ... and {len(result.violations) - SHOWN_VIOLATIONS} more (see --json)")
    if result.shrunk is not None:
        s = result.shrunk
        lines.append(
            f"shortest failing sequence for {s.kind.value} ({len(s.scenario.events)} of "
            f"{s.original_events} events, {s.runs} replays):"
        )
        lines += [f"  {line}" for line in s.describe()]
        lines.append(f"  -> {s.finding}")
    return "\n".join(lines)
