"""``splitkeeper chaos --source kafka``: ingest under injected faults, then prove exactly-once.

Modelled on Kafka's transactions system test (``tests/kafkatest/tests/core/transactions_test.py``):
a known set of messages goes into input topics, the system under test copies it while
processes are killed and the broker bounces, and at the end the output must hold every
input message exactly once.

1. A Kafka broker (the project's :class:`~splitkeeper.runtime.kafka_broker.KafkaBroker`,
   in a temporary folder; or ``--bootstrap-servers``), two topics with 8 partitions in
   all, and N messages whose key and value name them (``<seq>|<topic>|<partition>|<payload>``)
   produced by an idempotent producer; every delivery report (topic, partition, offset,
   value) is the oracle. 70% are produced first, the rest while the pipeline runs.
2. The pipeline (a generated YAML config, P=4, a consumer group of its own) runs as
   separate ``python -m splitkeeper run`` processes, each with its own driver and JVM,
   so that a driver can die for real. Injected, in this order: region failures
   (``--fault fail:R@E``), a stalled region past a short region timeout (``stall``), a
   broker restart (stop and start of the broker process) while a run reads, a driver
   SIGKILLed at a crash point (``SPLITKEEPER_CRASH_AT``), and a rescale
   (``recover --parallelism 6``; the next run returns to the configured 4). Faults and
   crash points are drawn from ``--seed``.
3. Runs continue until the consumer group's offsets reach the end of every partition
   on a global checkpoint; then the Delta sink is compared with the oracle (set equality
   on (topic, partition, offset) and payload; per partition contiguous and in order), the
   group's committed offsets with the last checkpoint's positions and id, and the restart
   checks (Great Expectations) run on the final state.

Progress goes to stderr; ``--json`` prints one JSON object on stdout. Exit 0 when nothing
was lost, duplicated or unexpected, the offsets are aligned, the restart checks passed and
every fault it meant to inject was injected; 1 otherwise; 2 on bad input.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from splitkeeper.errors import InvalidParameterError
from splitkeeper.kafka_testbed import (
    QUIET_CLIENT_LOG,
    BrokerHandle,
    NumberedProducer,
    check_bootstrap_servers,
    create_topics,
    end_offsets,
)

#: What ``--source`` accepts (only Kafka keeps positions outside the pipeline and can bounce).
SOURCES = ("kafka",)
DEFAULT_MESSAGES = 100_000
PARALLELISM = 4
RESCALED_PARALLELISM = 6
TOPIC_PARTITIONS = (5, 3)  # two topics, 8 partitions in all
REGION_TIMEOUT_S = 25.0
FIRST_SHARE = 0.7  # produced before the first run; the rest in three batches while runs go on
RUN_TIMEOUT_S = 1200.0
MAX_FINAL_RUNS = 12

# the progress line of an epoch (splitkeeper.runtime.pipeline.EpochReport.line):
# "epoch    7 regional 3/4 regions ack (r1 decline) committed ..."
_EPOCH_LINE = re.compile(
    r"^epoch\s+(\d+)\s+(global|regional|aborted)\s+(\d+)/(\d+) regions ack(?: \(([^)]*)\))?"
)
_FAILED_REGION = re.compile(r"r(\d+) (decline|timeout)")
_ECHO = re.compile(r"^(epoch |splitkeeper( \w+)?: |restored from )")  # progress, crash and CLI error lines


class FaultKind(enum.Enum):
    READER_FAILURE = "reader_failure"
    STALLED_REGION = "stalled_region"
    BROKER_RESTART = "broker_restart"
    DRIVER_SIGKILL = "driver_sigkill"
    RESCALE = "rescale"


@dataclass
class Fault:
    """One fault the run meant to inject, and whether the evidence says it happened."""

    kind: FaultKind
    run: str
    detail: str
    epoch: int | None = None
    injected: bool = False
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "kind": self.kind.value}


@dataclass(frozen=True)
class EpochLine:
    epoch: int
    kind: str
    failed: dict[int, str]


@dataclass
class RunOutcome:
    label: str
    argv: list[str]
    returncode: int | None
    epochs: list[EpochLine] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    elapsed_s: float = 0.0

    def epoch(self, epoch_id: int) -> EpochLine | None:
        return next((e for e in self.epochs if e.epoch == epoch_id), None)


def _say(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", required=True, choices=SOURCES, help="what to ingest (kafka)")
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        help=f"messages to produce (default {DEFAULT_MESSAGES})",
    )
    parser.add_argument("--seed", type=int, default=1, help="draws the faults, crash point and payloads")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--bootstrap-servers",
        default=None,
        help="use this Kafka instead of starting one (the broker-restart fault is then skipped)",
    )
    parser.add_argument(
        "--workdir", default=None, help="folder for broker, state, sink, logs (default: temporary)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (it is kept anyway on failure)"
    )


def run(args: argparse.Namespace) -> int:
    if isinstance(args.messages, bool) or args.messages < 1:
        raise InvalidParameterError(
            "--messages", args.messages, "an integer >= 1", hint="e.g. --messages 4000"
        )
    check_bootstrap_servers(args.bootstrap_servers)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="splitkeeper-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    chaos = KafkaChaos(workdir, args.messages, args.seed, args.bootstrap_servers)
    try:
        result = chaos.execute()
    finally:
        chaos.shutdown()
    ok = result["passed"]
    if ok and not args.keep and not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        result["workdir"] = None
    _say(
        f"{'PASSED' if ok else 'FAILED'}: {result['messages']:,} messages, lost {result['records_lost']}, "
        f"duplicated {result['records_duplicated']}, unexpected {result['records_unexpected']}, offsets "
        f"aligned {result['offsets_aligned']}, faults {[f['kind'] for f in result['faults_injected']]}, "
        f"{result['elapsed_s']:.0f}s" + ("" if ok else f"; work folder kept: {workdir}")
    )
    if args.json:
        print(json.dumps(result))
    return 0 if ok else 1


class KafkaChaos:
    """One chaos run against Kafka; :meth:`execute` returns the JSON-able result."""

    def __init__(self, workdir: Path, messages: int, seed: int, bootstrap_servers: str | None) -> None:
        self.workdir = workdir.resolve()
        self.messages = messages
        self.seed = seed
        self.rng = random.Random(seed)
        self.run_id = f"{int(time.time()) % 100000:05d}{random.Random().randrange(1000):03d}"
        self.broker = BrokerHandle(self.workdir, bootstrap_servers)
        self.bootstrap = ""
        self.topics = [f"chaos-{self.run_id}-{name}" for name in ("orders", "payments")]
        self.group_id = f"splitkeeper-chaos-{self.run_id}"
        self.name = f"chaos-{self.run_id}"
        self.config_path = self.workdir / "pipeline.yaml"
        self.faults: list[Fault] = []
        self.runs: list[RunOutcome] = []
        self.last_epoch = 0
        self.producer: NumberedProducer | None = None
        self._background: list[threading.Thread] = []
        self._started = time.monotonic()

    # -- setup -----------------------------------------------------------------------------

    def _setup(self) -> None:
        _say(f"work folder {self.workdir}")
        if self.broker.restartable:
            _say("starting a Kafka broker (KRaft) ...")
        self.bootstrap = self.broker.start()
        _say(f"Kafka at {self.bootstrap}")
        create_topics(self.bootstrap, dict(zip(self.topics, TOPIC_PARTITIONS, strict=True)))
        partitions = [(t, p) for t, n in zip(self.topics, TOPIC_PARTITIONS, strict=True) for p in range(n)]
        shown = (f"{t} ({n} partitions)" for t, n in zip(self.topics, TOPIC_PARTITIONS, strict=True))
        _say(f"topics {', '.join(shown)}")
        self.producer = NumberedProducer(
            self.bootstrap, partitions, self.seed, weights=[1 + i for i in range(len(partitions))]
        )  # uneven partitions
        first = max(1, int(self.messages * FIRST_SHARE))
        self.producer.produce(first)
        _say(f"produced {first:,} of {self.messages:,} messages; the rest arrive while the pipeline runs")
        # per split about 1/48 of the messages per epoch: the fullest partition (~22%) takes
        # about a dozen epochs, so every fault meets data
        budget = max(100, self.messages // 6)
        config = {
            "name": self.name,
            "parallelism": PARALLELISM,
            "regions": "per_reader",
            "strategy": "least-loaded",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": self.bootstrap,
                "topics": list(self.topics),
                "starting": "earliest",
                "group_id": self.group_id,
                "on_offset_out_of_range": "fail",
            },
            "checkpoint": {
                "max_consecutive_failures": 3,
                "max_failure_ratio": 0.5,
                "region_timeout_s": REGION_TIMEOUT_S,
                "retain_checkpoints": 3,
            },
            "backlog": {"backlog_epoch_records": budget, "normal_epoch_records": budget},
            "state": {"path": str(self.workdir / "state")},
            "sink": {"path": str(self.workdir / "sink")},
        }
        self.config_path.write_text(
            "# generated by splitkeeper chaos\n" + yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
        )
        _say(f"pipeline config {self.config_path} (P={PARALLELISM}, {budget:,} records per epoch)")

    def _produce_later(self, share: int) -> None:
        assert self.producer is not None
        rest = self.messages - int(self.messages * FIRST_SHARE)
        count = rest // 3 + (rest % 3 if share == 2 else 0)
        if count > 0:
            self._background.append(self.producer.in_background(count, chunks=10, pause_s=1.0))

    # -- runs ------------------------------------------------------------------------------

    def _cli(
        self,
        label: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        on_line: Callable[[str, subprocess.Popen[str]], None] | None = None,
    ) -> RunOutcome:
        """Run ``python -m splitkeeper <argv>`` in a child process; echo its progress lines."""
        child_env = {k: v for k, v in os.environ.items() if k != "SPLITKEEPER_CRASH_AT"}
        child_env.setdefault("SPLITKEEPER_SPARK_UI", "false")
        child_env["PYSPARK_PYTHON"] = sys.executable
        child_env.update(env or {})
        cmd = [sys.executable, "-m", "splitkeeper", *argv]
        _say(
            f"[{label}] {' '.join(['splitkeeper', *argv])}"
            + "".join(f" {k}={v}" for k, v in (env or {}).items())
        )
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
            cwd=str(self.workdir),
        )
        outcome = RunOutcome(label, list(argv), None)
        err_lines: list[str] = []
        out_chunks: list[str] = []

        def read_out() -> None:
            assert proc.stdout is not None
            out_chunks.append(proc.stdout.read())

        reader = threading.Thread(target=read_out, daemon=True)
        reader.start()
        watchdog = threading.Timer(RUN_TIMEOUT_S, proc.kill)  # a hung run is killed, and reported
        watchdog.start()
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.rstrip("\n")
            err_lines.append(line)
            parsed = _parse_epoch_line(line)
            if parsed is not None:
                outcome.epochs.append(parsed)
                self.last_epoch = max(self.last_epoch, parsed.epoch)
            if _ECHO.match(line):
                _say(f"[{label}]   {line[:220]}")
            if on_line is not None:
                on_line(line, proc)
        outcome.returncode = proc.wait()
        watchdog.cancel()
        reader.join(timeout=30)
        outcome.stdout = "".join(out_chunks)
        outcome.stderr = "\n".join(err_lines)
        outcome.elapsed_s = round(time.monotonic() - started, 1)
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{len(self.runs):02d}-{label}.log").write_text(
            f"$ {' '.join(cmd)}\n--- stdout\n{outcome.stdout}\n--- stderr\n{outcome.stderr}\n",
            encoding="utf-8",
        )
        _say(f"[{label}] exit {outcome.returncode} after {outcome.elapsed_s:.0f}s")
        self.runs.append(outcome)
        return outcome

    def _run(
        self, label: str, epochs: int, *extra: str, env: Mapping[str, str] | None = None, **kw: Any
    ) -> RunOutcome:
        return self._cli(
            label, ["run", "--config", str(self.config_path), "--epochs", str(epochs), *extra], env=env, **kw
        )

    def _region_faults(self) -> None:
        """One run of five epochs: a normal one, two region failures, a stalled region, a forced global.

        Three regional checkpoints in a row reach max_consecutive_failures=3, so the fifth
        epoch must be global (protocol rule 2.2).
        """
        first = self.last_epoch + 1
        failing, stalling = self.rng.sample(range(PARALLELISM), 2), self.rng.randrange(PARALLELISM)
        stall_s = int(REGION_TIMEOUT_S * 4)
        planned = [
            (FaultKind.READER_FAILURE, region, first + 1 + i, f"fail:{region}@{first + 1 + i}", "decline")
            for i, region in enumerate(failing)
        ]
        planned.append(
            (
                FaultKind.STALLED_REGION,
                stalling,
                first + 3,
                f"stall:{stall_s}:{stalling}@{first + 3}",
                "timeout",
            )
        )
        self._produce_later(0)
        out = self._run("region-faults", 5, *[a for *_x, spec, _o in planned for a in ("--fault", spec)])
        for kind, region, epoch, spec, outcome in planned:
            if kind is FaultKind.READER_FAILURE:
                detail = f"{spec}: region {region}'s task raises after reading"
            else:
                detail = f"{spec}: region {region}'s task sleeps past the {REGION_TIMEOUT_S:g}s timeout"
            line = out.epoch(epoch)
            self.faults.append(
                Fault(
                    kind,
                    out.label,
                    detail,
                    epoch,
                    injected=line is not None and line.failed.get(region) == outcome,
                    evidence=f"epoch {epoch}: not run"
                    if line is None
                    else f"epoch {epoch} {line.kind}, failed regions {line.failed or 'none'}",
                )
            )

    def _broker_restart(self) -> None:
        fault = Fault(
            FaultKind.BROKER_RESTART,
            "broker-restart",
            "the broker process is stopped and started while a run reads",
        )
        if not self.broker.restartable:
            fault.evidence = "skipped: --bootstrap-servers names a broker this command does not own"
            self.faults.append(fault)
            _say(f"[broker-restart] {fault.evidence}")
            self._produce_later(1)
            self._run("no-broker-restart", 2)
            return
        done = threading.Event()
        restarted: list[str] = []

        def bounce(line: str, proc: subprocess.Popen[str]) -> None:
            if done.is_set() or _parse_epoch_line(line) is None:
                return
            done.set()
            epoch = self.last_epoch + 1

            def body() -> None:
                alive = proc.poll() is None
                _say(f"[broker-restart] stopping the broker during epoch {epoch} (run alive: {alive})")
                self._produce_later(1)  # producing across the restart
                detail = self.broker.restart(down_s=3.0)
                restarted.append(f"during epoch {epoch} of a live run: {detail}" if alive else detail)
                _say(f"[broker-restart] broker back ({detail})")

            threading.Thread(target=body, name="chaos-broker-restart", daemon=True).start()

        out = self._run("broker-restart", 3, on_line=bounce)
        deadline = time.monotonic() + 240
        while done.is_set() and not restarted and time.monotonic() < deadline:
            time.sleep(0.5)
        fault.injected = bool(restarted) and "live run" in restarted[0]
        fault.evidence = (
            restarted[0] if restarted else "the run printed no epoch line"
        ) + f"; the run exited {out.returncode}"
        self.faults.append(fault)
        if out.returncode != 0:  # the run may fail while Kafka is away: a later run recovers
            self._run("after-broker-restart", 1)

    def _driver_sigkill(self) -> None:
        from splitkeeper.runtime.faults import CRASH_ENV, CrashPoint

        epoch = self.last_epoch + 2  # one epoch of the run completes first
        point = self.rng.choice(list(CrashPoint)).value
        fault = Fault(
            FaultKind.DRIVER_SIGKILL,
            "driver-sigkill",
            f"{CRASH_ENV}={point}@{epoch}: the driver SIGKILLs itself",
            epoch,
        )
        out = self._run("driver-sigkill", 3, env={CRASH_ENV: f"{point}@{epoch}"})
        fault.injected = out.returncode == -9 and f"crash injected at {point} of epoch {epoch}" in out.stderr
        fault.evidence = f"exit {out.returncode}" + (" (SIGKILL)" if out.returncode == -9 else "")
        self.last_epoch = max(self.last_epoch, epoch)
        self.faults.append(fault)

    def _rescale(self) -> None:
        fault = Fault(
            FaultKind.RESCALE,
            "rescale",
            f"recover --checkpoint latest --parallelism {RESCALED_PARALLELISM}, then back to {PARALLELISM}",
        )
        self._produce_later(2)
        out = self._cli(
            "rescale",
            [
                "recover",
                "--config",
                str(self.config_path),
                "--checkpoint",
                "latest",
                "--parallelism",
                str(RESCALED_PARALLELISM),
                "--epochs",
                "2",
                "--json",
            ],
        )
        summary = _last_json(out.stdout)
        fault.injected = (
            out.returncode == 0
            and summary.get("parallelism") == RESCALED_PARALLELISM
            and summary.get("previous_parallelism") == PARALLELISM
        )
        fault.evidence = (
            f"restored from checkpoint {summary.get('restored_from')} at P={summary.get('parallelism')} "
            f"(was {summary.get('previous_parallelism')}); exit {out.returncode}"
        )
        self.faults.append(fault)

    def _finish(self) -> bool:
        """Run until the group's offsets sit at every partition's end on a global checkpoint."""
        for thread in self._background:
            thread.join()
            errors = getattr(thread, "errors", [])
            if errors:
                raise errors[0]
        assert self.producer is not None
        ends = end_offsets(self.producer.delivered)
        _say(
            f"all {len(self.producer.delivered):,} messages delivered; running to the end of every partition"
        )
        for i in range(MAX_FINAL_RUNS):
            # Every message is delivered, so "caught up with the ends at the start" is the end.
            out = self._run(f"final-{i + 1}", 20, "--until-caught-up")
            committed = self._committed()
            at_end = {sid: p.position for sid, p in committed.items()} == ends
            last = out.epochs[-1] if out.epochs else None  # none: already there on a global checkpoint
            if out.returncode == 0 and at_end and (last is None or last.kind == "global"):
                return True
        return False

    def _committed(self) -> dict[str, Any]:
        from splitkeeper.runtime.sources.kafka import KafkaSource

        source = KafkaSource(self.bootstrap, topics=self.topics, group_id=self.group_id)
        try:
            return dict(source.committed_positions())
        finally:
            source.close()

    # -- verification ----------------------------------------------------------------------

    def _verify(self, caught_up: bool) -> dict[str, Any]:
        from splitkeeper.quality.checks import run_restart_checks
        from splitkeeper.runtime.config import load_config
        from splitkeeper.runtime.sources.kafka import KafkaSource, split_id_of
        from splitkeeper.runtime.spark import SparkSettings, get_spark
        from splitkeeper.state.checkpoints import DeltaStateStore

        assert self.producer is not None
        _say("verifying: the sink against every delivered message, the group offsets, the restart checks")
        produced: dict[str, dict[int, str]] = {}
        for (topic, partition, offset), value in self.producer.delivered.items():
            produced.setdefault(split_id_of(topic, partition), {})[offset] = value
        in_kafka = _read_topics(self.bootstrap, self.topics)
        spark = get_spark(SparkSettings.from_env(ui_enabled=False))
        sink = [
            (r["split_id"], int(r["offset"]), int(r["next_offset"]), r["value"])
            for r in spark.read.format("delta")
            .load(str(self.workdir / "sink"))
            .select("split_id", "offset", "next_offset", "value")
            .collect()
        ]
        keys = Counter((sid, off) for sid, off, _n, _v in sink)
        duplicated = sum(n - 1 for n in keys.values() if n > 1)
        expected = {(sid, off): v for sid, recs in produced.items() for off, v in recs.items()}
        lost = sum(1 for k in expected if k not in keys)
        values = {(sid, off): v for sid, off, _n, v in sink}
        unexpected = sum(1 for k, v in values.items() if expected.get(k) != v)
        broken: list[str] = []
        by_split: dict[str, list[tuple[int, int]]] = {}
        for sid, off, nxt, _v in sink:
            by_split.setdefault(sid, []).append((off, nxt))
        for sid, recs in produced.items():
            got = sorted(by_split.get(sid, []))
            offsets = sorted(recs)
            if [o for o, _n in got] != offsets or any(n != o + 1 for o, n in got):
                broken.append(sid)
        config = load_config(self.config_path)
        source = KafkaSource(self.bootstrap, topics=self.topics)
        try:
            store = DeltaStateStore(config.state_path, config.name, source.fingerprint(), read_only=True)
            latest = store.latest_checkpoint()
            positions = (
                {}
                if latest is None
                else {s.split_id: s.position for r in latest.regions.values() for s in r.splits}
            )
            committed = self._committed()
            aligned = (
                latest is not None
                and set(committed) == set(positions)
                and all(
                    committed[sid].position == pos and committed[sid].checkpoint_id == latest.checkpoint_id
                    for sid, pos in positions.items()
                )
            )
            report = run_restart_checks(
                spark,
                store,
                config.sink_path,
                strategy=config.strategy,
                max_consecutive_failures=config.checkpoint.max_consecutive_failures,
                subscriptions=source.subscriptions(),
                data_docs_dir=self.workdir / "data_docs",
                source_splits=source.discover_splits(),
            )
        finally:
            source.close()
        if not report.success:
            _say(report.summary())
        kinds = Counter(e.kind for r in self.runs for e in r.epochs)
        return {
            "messages": len(self.producer.delivered),
            "messages_requested": self.messages,
            "messages_not_delivered": len(self.producer.failed),
            "messages_in_kafka": len(in_kafka),
            "kafka_matches_delivery_reports": in_kafka
            == {(split_id_of(t, p), o): v for (t, p, o), v in self.producer.delivered.items()},
            "records_in_sink": len(sink),
            "records_lost": lost,
            "records_duplicated": duplicated,
            "records_unexpected": unexpected,
            "partitions_contiguous": not broken,
            "splits_not_contiguous": broken,
            "offsets_aligned": bool(aligned),
            "last_checkpoint": None if latest is None else latest.checkpoint_id,
            "caught_up": caught_up,
            "restart_checks": "passed" if report.success else "failed",
            "checkpoints": {k: kinds.get(k, 0) for k in ("global", "regional", "aborted")},
        }

    # -- driver ----------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        self._setup()
        self._region_faults()
        self._broker_restart()
        self._driver_sigkill()
        self._rescale()
        caught_up = self._finish()
        result: dict[str, Any] = {"source": "kafka", "seed": self.seed, **self._verify(caught_up)}
        injected = [f for f in self.faults if f.injected]
        missing = [f for f in self.faults if not f.injected and not f.evidence.startswith("skipped")]
        result.update(
            {
                "faults_injected": [f.to_json() for f in injected],
                "faults_missing": [f.to_json() for f in missing],
                "faults_skipped": [f.to_json() for f in self.faults if f.evidence.startswith("skipped")],
                "runs": [
                    {
                        "run": r.label,
                        "exit": r.returncode,
                        "epochs": [e.epoch for e in r.epochs],
                        "elapsed_s": r.elapsed_s,
                    }
                    for r in self.runs
                ],
                "parallelism": PARALLELISM,
                "rescaled_to": RESCALED_PARALLELISM,
                "topics": {t: n for t, n in zip(self.topics, TOPIC_PARTITIONS, strict=True)},
                "elapsed_s": round(time.monotonic() - self._started, 1),
                "workdir": str(self.workdir),
            }
        )
        result["passed"] = (
            result["records_lost"] == 0
            and result["records_duplicated"] == 0
            and result["records_unexpected"] == 0
            and result["partitions_contiguous"]
            and result["offsets_aligned"]
            and result["restart_checks"] == "passed"
            and not missing
        )
        for fault in self.faults:
            state = (
                "injected"
                if fault.injected
                else ("skipped" if fault.evidence.startswith("skipped") else "MISSING")
            )
            _say(f"fault {fault.kind.value:<15} {state:<8} {fault.detail} -- {fault.evidence}")
        return result

    def shutdown(self) -> None:
        """Stop the broker this command started (the Spark session ends with the process)."""
        for thread in self._background:
            thread.join(timeout=60)
        self.broker.stop()


# --------------------------------------------------------------------------- helpers


def _parse_epoch_line(line: str) -> EpochLine | None:
    m = _EPOCH_LINE.match(line)
    if m is None:
        return None
    failed = {int(r): how for r, how in _FAILED_REGION.findall(m.group(5) or "")}
    return EpochLine(int(m.group(1)), m.group(2), failed)


def _last_json(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _read_topics(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], str]:
    """Every message of ``topics`` as Kafka holds it now, read without splitkeeper.

    Returns (split id, offset) -> value.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from splitkeeper.runtime.sources.kafka import split_id_of

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"chaos-oracle-{os.getpid()}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "logger": QUIET_CLIENT_LOG,  # the clients' own logs: the broker bounces on purpose
    }
    consumer = Consumer(conf)
    try:
        metadata = consumer.list_topics(timeout=30).topics
        ends: dict[tuple[str, int], int] = {}
        for topic in topics:
            for partition in metadata[topic].partitions:
                _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                if high > 0:
                    ends[(topic, partition)] = high
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
        out: dict[tuple[str, int], str] = {}
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + 300
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=1.0):
                if msg.error() is not None:
                    continue
                topic, partition, offset = str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)
                out[(split_id_of(topic, partition), offset)] = (msg.value() or b"").decode()
                if offset + 1 >= ends[(topic, partition)]:
                    done.add((topic, partition))
        return out
    finally:
        consumer.close()
