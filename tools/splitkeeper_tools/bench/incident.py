"""``splitkeeper-tools bench incident``: how fast the on-call commands answer, each as a fresh process.

``status``, ``offsets``, ``recover --dry-run``, ``recover --checkpoint N --rewind`` (the plan) and
``offsets reset --dry-run`` read the state and the sink with delta-rs; none may start Spark. Each
runs ``--repeat`` times as a new ``splitkeeper`` process (what a user waits for, Python start
included) with ``JAVA_HOME`` pointing nowhere, so a command that started a JVM would fail instead
of being timed. Prints the median per command, the 2-second target, and the machine's load.

With ``--config`` it times that pipeline (the demo's is ``var/demo/pipeline.yaml`` after
``bash scripts/run.sh``); without, it first builds a demo-sized one (6 files, 3 runs with a region
failure, a rescale) under ``--workspace``, which takes Spark once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_S = 2.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="an existing pipeline's file (default: build one)")
    parser.add_argument("--workspace", default="var/bench/incident", help="where a built pipeline lives")
    parser.add_argument("--lines", type=int, default=3000, help="lines per input file of a built pipeline")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command (the median is reported)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def _build(workspace: Path, lines: int) -> Path:
    """A demo-sized pipeline: 6 files of ``lines`` lines, read in several runs, one region failing."""
    import shutil

    import yaml

    shutil.rmtree(workspace, ignore_errors=True)
    incoming = workspace / "incoming"
    incoming.mkdir(parents=True)
    for i in range(6):
        with open(incoming / f"orders-{i:02d}.jsonl", "w", encoding="utf-8") as out:
            for n in range(lines):
                out.write(json.dumps({"id": i * lines + n, "amount": n % 997}) + "\n")
    mapping = {
        "name": "incident-bench",
        "parallelism": 3,
        "source": {"kind": "files", "path": str(incoming), "format": "lines"},
        "checkpoint": {"retain_checkpoints": 20},
        "backlog": {"backlog_epoch_records": max(1, lines), "normal_epoch_records": max(1, lines)},
        "state": {"path": str(workspace / "state")},
        "sink": {"path": str(workspace / "sink")},
    }
    config = workspace / "pipeline.yaml"
    config.write_text(yaml.safe_dump(mapping, sort_keys=False), encoding="utf-8")
    for argv in (["run", "--epochs", "3"], ["run", "--epochs", "2", "--fault", "fail:1@4"]):
        _cli([*argv, "--config", str(config)], spark=True)
    return config


def _cli(argv: list[str], *, spark: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if not spark:
        env["JAVA_HOME"] = "/nonexistent/splitkeeper-bench-no-jvm"  # a JVM start fails, loudly
    done = subprocess.run(
        [sys.executable, "-m", "splitkeeper", *argv],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"splitkeeper {' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def _commands(config: str) -> list[tuple[str, list[str]]]:
    """The on-call commands, with a split and an older checkpoint of this pipeline."""
    listed = json.loads(_cli(["offsets", "--config", config, "--json"]).stdout)
    live = [s for s in listed["splits"] if s["status"] != "finished" and s["position"] is not None]
    from splitkeeper.config.settings import load_config
    from splitkeeper.delta.checkpoints import DeltaStateStore

    loaded = load_config(config)
    ids = DeltaStateStore(loaded.state.path, loaded.name, None, read_only=True).checkpoint_ids()
    older = ids[0] if ids else 1  # the oldest retained checkpoint: the largest rewind
    commands = [
        ("status", ["status", "--config", config]),
        ("offsets", ["offsets", "--config", config]),
        ("recover --dry-run", ["recover", "--config", config, "--dry-run", "--epochs", "0"]),
        ("recover --rewind (plan)", ["recover", "--config", config, "--checkpoint", str(older), "--rewind"]),
    ]
    if live:
        split = live[0]
        commands.append(
            (
                "offsets reset --dry-run",
                [
                    "offsets",
                    "reset",
                    "--config",
                    config,
                    "--split",
                    split["split_id"],
                    "--to",
                    "latest",
                    "--dry-run",
                ],
            )
        )
    return commands


def run(args: argparse.Namespace) -> int:
    config = args.config or str(_build(Path(args.workspace).resolve(), args.lines))
    print(f"pipeline {config}; each command {args.repeat}x as a new process, no JVM allowed", file=sys.stderr)
    load_before = os.getloadavg()
    figures: dict[str, dict[str, Any]] = {}
    for name, argv in _commands(config):
        times = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            _cli(argv)
            times.append(time.perf_counter() - started)
        median = statistics.median(times)
        figures[name] = {"median_s": round(median, 3), "runs_s": [round(t, 3) for t in times]}
        figures[name]["within_target"] = median <= TARGET_S
        print(f"  {name:<26} {median:6.2f} s  (runs {', '.join(f'{t:.2f}' for t in times)})", file=sys.stderr)
    load = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    result = {"config": config, "target_s": TARGET_S, "load_before_after": load, "commands": figures}
    if args.json:
        print(json.dumps(result))
    else:
        ok = sum(1 for f in figures.values() if f["within_target"])
        print(f"{ok}/{len(figures)} commands within {TARGET_S:.0f} s; load {load[:3]} -> {load[3:]}")
    return 0
