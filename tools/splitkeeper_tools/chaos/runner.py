"""One chaos run against Kafka: set up, play the schedule's driver processes, catch up, verify."""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from splitkeeper_tools.chaos.cluster import ChaosCluster
from splitkeeper_tools.chaos.live import BrokerKill, ConcurrentDrivers, DriverPause, LiveFault, WorkerKill
from splitkeeper_tools.chaos.processes import DRIVER_TAG_ENV, EpochLine, RunOutcome, run_splitkeeper, say
from splitkeeper_tools.chaos.schedule import (
    PARALLELISM,
    Act,
    Fault,
    FaultKind,
    Tuning,
    draw_schedule,
    faults_epoch_records,
    planned_counts,
)
from splitkeeper_tools.chaos.store import DEFAULT_FAULT_RATE, ChaosStore, driver_retries, store_failures
from splitkeeper_tools.chaos.verify import group_offsets, verify
from splitkeeper_tools.kafka_testbed import (
    BrokerHandle,
    NumberedProducer,
    create_topics,
    end_offsets,
    in_share,
    numbered_key,
    numbered_value,
)

TOPIC_PARTITIONS = (5, 3)  # two topics, 8 partitions in all
FIRST_SHARE = 0.7  # produced before the first driver; the rest in one share per ingest process
CRASH_RETRIES = 2  # a driver that did not reach its crash point (it failed first) is run again
#: An act whose driver failed before its faults came due (the store failed it: at a 2% fault rate of
#: each kind a driver meets several store faults) is played again as it was, up to this often.
ACT_REPLAYS = 5
MAX_FINAL_RUNS = 12
#: ``errors.max_bad_ratio`` of a run with ``--bad-records``: a region's epoch may read a single
#: record, a malformed one, so any lower limit could fail a region by chance; the guard itself is
#: proven by the dead-letter tests, the chaos run proves that every record is accounted for.
BAD_RATIO_LIMIT = 1.0
#: The byte that makes a malformed message: 0xFF never occurs in UTF-8 (``decode: text`` rejects it).
MALFORMED = b"\xff"


def chaos_value(share: float, deletes: float = 0.0) -> Any:
    """The chaos producer's values: :func:`numbered_value`, and for the ``share`` of malformed
    messages (:func:`~splitkeeper_tools.kafka_testbed.in_share`) the same with :data:`MALFORMED`
    before the payload: not UTF-8. With ``deletes`` (``--sink upsert``), that share of the messages
    (drawn apart from the malformed ones) ends with :data:`DELETE_MARK`: a delete of its key."""

    def value_of(seq: int, topic: str, partition: int, payload: str) -> bytes:
        value = numbered_value(seq, topic, partition, payload)
        if in_share(seq, share):
            head, _sep, tail = value.rpartition(b"|")
            value = head + b"|" + MALFORMED + tail
        if is_delete(seq, deletes):
            value += DELETE_MARK
        return value

    return value_of


#: ``--sink upsert``: a value that ends with this deletes its key (``sink.delete_when``).
DELETE_MARK = b"|delete"
DELETE_WHEN = "value LIKE '%|delete'"
#: ``--sink upsert``: the share of messages that are deletes, and how many keys each partition has.
DELETE_SHARE = 0.02
KEYS_PER_PARTITION = 40


def is_delete(seq: int, deletes: float) -> bool:
    """Whether message ``seq`` is a delete (``deletes``' share, shifted off the malformed ones)."""
    return in_share(seq + 7, deletes)


def chaos_key(seq: int, topic: str, partition: int) -> str:
    """``--sink upsert``'s keys: :data:`KEYS_PER_PARTITION` per partition, each in one partition only
    (as a Kafka producer's partitioner keeps a key in one partition), so its latest message is the
    one with the highest offset there."""
    return f"{topic}:{partition}:k{seq % KEYS_PER_PARTITION:02d}"


class KafkaChaos:
    """One chaos run against Kafka: :meth:`execute` returns the JSON-able result; :meth:`shutdown` after."""

    def __init__(
        self,
        workdir: Path,
        messages: int,
        seed: int,
        bootstrap_servers: str | None,
        bad_records: float = 0.0,
        sink: str = "append",
        store: str = "local",
        store_fault_rate: float = DEFAULT_FAULT_RATE,
        profile: str = "local",
        readers: str = "per_epoch",
    ) -> None:
        self.workdir = workdir.resolve()
        self.profile = profile
        self.readers = readers  # the pipeline's ``readers:``, every driver's
        self.messages = messages
        self.bad_records = bad_records
        self.sink = sink
        self.deletes = DELETE_SHARE if sink == "upsert" else 0.0
        self.seed = seed
        self.tuning = Tuning(messages)
        self.schedule = draw_schedule(seed, self.tuning, pause=store == "s3")
        self.run_id = f"{int(time.time()) % 100000:05d}{random.Random().randrange(1000):03d}"
        self.broker = BrokerHandle(self.workdir, bootstrap_servers)
        self.bootstrap = ""
        self.topics = [f"chaos-{self.run_id}-{name}" for name in ("orders", "payments")]
        self.group_id = f"splitkeeper-chaos-{self.run_id}"
        self.name = f"chaos-{self.run_id}"
        #: ``--store s3``: versitygw behind the fault proxy, its schedule drawn from the seed
        self.store = ChaosStore(self.workdir, seed, store_fault_rate, self.name) if store == "s3" else None
        #: ``--profile cluster``: the drivers on a Spark standalone master and 2 workers
        self.cluster = ChaosCluster(self.workdir) if profile == "cluster" else None
        self.config_path = self.workdir / "pipeline.yaml"
        self.takeover_path = self.workdir / "pipeline-takeover.yaml"
        self.faults_config_path = self.workdir / "pipeline-faults.yaml"
        self.faults: list[Fault] = []
        self.runs: list[RunOutcome] = []
        self.last_epoch = 0  # the highest epoch any driver printed or died in
        self.parallelism = PARALLELISM  # of the last epoch line
        self.producer: NumberedProducer | None = None
        self._shares = self._share_sizes()
        self._background: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._started = time.monotonic()
        #: splitkeeper_store_retries_total of the drivers, summed over their metrics files
        self.retries: Counter[str] = Counter()
        self._metrics_seen = ""  # the metrics file as last read (a run that wrote none leaves it)

    # -- setup -----------------------------------------------------------------------------

    def _share_sizes(self) -> list[int]:
        rest = self.messages - int(self.messages * FIRST_SHARE)
        shares = sum(1 for act in self.schedule if act.produce)
        return [rest // shares + (1 if i < rest % shares else 0) for i in range(shares)]

    def _setup(self) -> None:
        say(f"work folder {self.workdir}")
        if self.broker.restartable:
            say("starting a Kafka broker (KRaft) ...")
        self.bootstrap = self.broker.start()
        say(f"Kafka at {self.bootstrap}")
        if self.store is not None:  # the drivers inherit it (and their logs do not show the keys)
            self.store.start()
            os.environ.update(self.store.driver_env())
        if self.cluster is not None:  # each driver gets its settings (_launch); this process stays local
            self.cluster.start()
        create_topics(self.bootstrap, dict(zip(self.topics, TOPIC_PARTITIONS, strict=True)))
        partitions = [(t, p) for t, n in zip(self.topics, TOPIC_PARTITIONS, strict=True) for p in range(n)]
        say(
            "topics "
            + ", ".join(f"{t} ({n} partitions)" for t, n in zip(self.topics, TOPIC_PARTITIONS, strict=True))
        )
        self.producer = NumberedProducer(
            self.bootstrap,
            partitions,
            self.seed,
            weights=[1 + i for i in range(len(partitions))],  # uneven partitions
            value_of=chaos_value(self.bad_records, self.deletes),
            key_of=chaos_key if self.sink == "upsert" else numbered_key,
        )
        first = int(self.messages * FIRST_SHARE)
        # every partition holds enough for each epoch of the act with the region faults (below)
        self.producer.produce(first, each=self._faults_epochs())
        say(f"produced {first:,} of {self.messages:,} messages; the rest arrive while the pipeline runs")
        tuning = self.tuning
        config = {
            "name": self.name,
            "parallelism": PARALLELISM,
            "readers": self.readers,
            "regions": "per_reader",
            "strategy": "least-loaded",
            "source": {
                "kind": "kafka",
                "bootstrap_servers": self.bootstrap,
                "topics": list(self.topics),
                "starting": "earliest",
                "group_id": self.group_id,
                "on_offset_out_of_range": "fail",
                "connect_timeout_s": tuning.connect_timeout_s,
            },
            "checkpoint": {
                "max_consecutive_failures": 3,
                "max_failure_ratio": 0.5,
                "region_timeout_s": tuning.region_timeout_s,
                "retain_checkpoints": 3,
            },
            "lease": {"ttl_s": tuning.lease_ttl_s},
            "backlog": {
                "backlog_epoch_records": tuning.epoch_records,
                "normal_epoch_records": tuning.epoch_records,
            },
            "state": {"path": self._location("state")},
            "sink": {"path": self._location("sink")},
        }
        # no staging key: <state>/_staging, on the object store with --store s3 (the region tasks write
        # their staged files there; with --profile cluster the executors share no disk with the drivers)
        if self.sink == "upsert":  # keyed by the Kafka key, a value ending with |delete deletes it
            config["decode"] = {"kind": "text"}
            config["sink"] = {
                "path": self._location("sink"),
                "mode": "upsert",
                "key": ["key"],
                "delete_when": DELETE_WHEN,
            }
            say(
                f"sink upsert: {KEYS_PER_PARTITION} keys per partition, {self.deletes:.0%} of the messages "
                f"delete their key (sink.delete_when: {DELETE_WHEN}); change table "
                f"{self.workdir / 'sink_changes'}"
            )
        if self.bad_records > 0:  # text values; the malformed ones are dead letters
            config["decode"] = {"kind": "text"}
            config["errors"] = {
                "tolerance": "all",
                "dead_letter": {"path": self._location("dead_letters")},
                "max_bad_ratio": BAD_RATIO_LIMIT,
            }
            say(
                f"{self.bad_records:.2%} of the messages are malformed (not UTF-8): decode text, "
                f"errors.tolerance all, dead letters in {self.workdir / 'dead_letters'}"
            )
        self.config_path.write_text(
            "# generated by splitkeeper-tools chaos\n" + yaml.safe_dump(config, sort_keys=False),
            encoding="utf-8",
        )
        # the act with the region faults reads every split in each of its epochs: no region is idle
        # when its fault is due (faults_epoch_records)
        per_split = Counter((t, p) for t, p, _o in self.producer.delivered)
        faults_budget = faults_epoch_records([per_split[sp] for sp in partitions], self._faults_epochs())
        faulty = {
            **config,
            "backlog": {"backlog_epoch_records": faults_budget, "normal_epoch_records": faults_budget},
        }
        self.faults_config_path.write_text(
            "# generated by splitkeeper-tools chaos: the act with the region faults\n"
            + yaml.safe_dump(faulty, sort_keys=False),
            encoding="utf-8",
        )
        # the paused driver's takeover: the same pipeline, waiting out the frozen holder's ttl
        takeover = {**config, "lease": {"ttl_s": tuning.lease_ttl_s, "wait_s": 3 * tuning.lease_ttl_s}}
        self.takeover_path.write_text(
            "# generated by splitkeeper-tools chaos: the takeover of a paused driver\n"
            + yaml.safe_dump(takeover, sort_keys=False),
            encoding="utf-8",
        )
        say(
            f"pipeline config {self.config_path} (P={PARALLELISM}, readers {self.readers}, "
            f"{tuning.epoch_records:,} records per "
            f"epoch, region timeout {tuning.region_timeout_s:g}s, lease ttl {tuning.lease_ttl_s:g}s); "
            f"the act with the region faults reads {faults_budget:,} records per epoch "
            f"({self.faults_config_path.name})"
        )
        for act in self.schedule:
            extra = [f.spec for f in act.region_faults] + [
                k.value for k in act.meets if k.value.endswith("sigkill")
            ]
            say(
                f"schedule: {act.label:<12} dies at {act.crash.value}"
                + (f"; {', '.join(extra)}" if extra else "")
            )

    def _faults_epochs(self) -> int:
        """The epochs of the act with the region faults that must find every region reading (to its crash)."""
        return max(a.crash_after + 1 for a in self.schedule if a.region_faults)

    def _location(self, name: str) -> str:
        """Where table ``name`` lives: in the work folder, or on the object store (``--store s3``)."""
        return str(self.workdir / name) if self.store is None else self.store.location(name)

    def _produce(self, count: int) -> None:
        assert self.producer is not None
        if count > 0:
            self._background.append(self.producer.in_background(count, chunks=10, pause_s=0.5))

    # -- driver processes ------------------------------------------------------------------

    def _launch(
        self,
        label: str,
        argv: list[str],
        env: Mapping[str, str] | None = None,
        live: Sequence[LiveFault] = (),
    ) -> RunOutcome:
        """Run one ``splitkeeper`` command in a child process; the live faults watch its epoch lines."""
        with self._lock:
            log_path = self.workdir / "logs" / f"{len(self.runs):02d}-{label}.log"
            self.runs.append(RunOutcome(label, argv))  # a placeholder keeps the numbering
            index = len(self.runs) - 1

        def on_epoch(line: EpochLine, proc: Any) -> None:
            self.parallelism = line.regions
            for fault in live:
                fault.on_epoch(line, proc)

        tag = f"{self.run_id}-{index:02d}"  # its processes' and executors' (WorkerKill finds them by it)
        hidden = {
            DRIVER_TAG_ENV: tag,
            **(
                {}
                if self.cluster is None
                else self.cluster.driver_env(tag, None if self.store is None else self.store.driver_env())
            ),
        }
        outcome = run_splitkeeper(
            label,
            argv,
            cwd=self.workdir,
            log_path=log_path,
            env=env,
            on_epoch=on_epoch,
            hidden_env=hidden,
        )
        self._read_retries()
        with self._lock:
            self.runs[index] = outcome
            self.last_epoch = max([self.last_epoch, *(e.epoch for e in outcome.epochs)])
            if outcome.crash is not None:
                self.last_epoch = max(self.last_epoch, outcome.crash[1])
        return outcome

    def _read_retries(self) -> None:
        """Add the retries in the driver's metrics file, once per file a driver wrote (each run writes
        its own counts, from 0: its process's). A SIGKILLed driver's retries after its last epoch are
        not in it."""
        try:
            env = None if self.store is None else self.store.store_env()
            found = driver_retries(self._location("state"), env)
        except Exception as err:  # noqa: BLE001 - reported, the verdict does not depend on it
            say(f"metrics file unreadable: {err!r}")
            return
        with self._lock:
            if found is not None and found[0] != self._metrics_seen:
                self._metrics_seen = found[0]
                self.retries.update(found[1])

    def _live_faults(self, act: Act) -> list[LiveFault]:
        live: list[LiveFault] = []
        assert self.producer is not None
        producer = self.producer
        if act.produce:
            share = self._shares.pop(0)
            if act.broker_kill and self.broker.restartable:
                burst = max(1, share // 4)
                live.append(
                    BrokerKill(
                        act.label,
                        self.broker,
                        act.broker_kill_delay_s,
                        enqueue=lambda: producer.enqueue(burst),
                        after=lambda: self._produce(share - burst),
                    )
                )
            else:
                self._produce(share)
        if act.broker_kill and not self.broker.restartable:
            self.faults.append(
                Fault(
                    FaultKind.BROKER_SIGKILL,
                    act.label,
                    "the broker process is SIGKILLed while a driver reads",
                    skipped=True,
                    evidence="skipped: --bootstrap-servers names a broker this command does not own",
                )
            )
        slow = act.slow_region()
        if slow is not None:
            window = self.tuning.region_timeout_s + self.tuning.slow_s + 10
            # on the standalone master Spark gives a task 4 attempts: the killed one runs again
            reruns = self.cluster is not None
            live.append(
                WorkerKill(
                    act.label,
                    slow.epoch,
                    slow.region,
                    window,
                    reruns=reruns,
                    long_lived=self.readers == "long_lived",
                )
            )
        if act.pause:
            live.append(
                DriverPause(
                    act.label,
                    self.last_epoch + 1,
                    self.takeover_path,
                    self.tuning.lease_ttl_s,
                    lambda lb, av: self._launch(lb, av),
                )
            )
        if act.concurrent_epoch is not None:
            live.append(
                ConcurrentDrivers(
                    act.label, act.concurrent_epoch, self.config_path, lambda lb, av: self._launch(lb, av)
                )
            )
        return live

    def _act(self, act: Act) -> None:
        """Run one driver process of the schedule, with its faults; record what the evidence says."""
        from splitkeeper.spark.faults import CRASH_ENV

        cfg = str(self.faults_config_path if act.region_faults else self.config_path)
        before = self.parallelism
        crash_epoch = self.last_epoch + 1 + act.crash_after
        if act.rescale_to is None:
            argv = ["run", "--config", cfg, "--epochs", str(act.epochs)]
        else:
            argv = [
                "recover",
                "--config",
                cfg,
                "--checkpoint",
                "latest",
                "--parallelism",
                str(act.rescale_to),
            ]
            argv += ["--epochs", str(act.epochs)]
        argv += [a for f in act.region_faults for a in ("--fault", f.spec)]
        live = self._live_faults(act)
        env = {CRASH_ENV: f"{act.crash.value}@{crash_epoch}+"}
        out = self._launch(act.label, argv, env, live)
        replays = 0
        while self._failed_before_its_faults(act, out) and replays < ACT_REPLAYS:
            # it failed (a store error) before any of its faults came due: the act is played again as
            # it was, faults and all (their epochs, and its crash epoch, are absolute and still ahead)
            replays += 1
            say(f"[{act.label}] exit {out.returncode} before its faults came due: act again ({replays})")
            out = self._launch(f"{act.label}-again{replays}", argv, env, live)
        for fault in live:
            fault.join()
            if isinstance(fault, BrokerKill):
                fault.settle()
            self.faults += fault.faults(out)
        self.faults += self._region_faults(act, out)
        if act.rescale_to is not None:
            self.faults.append(self._rescale(act, out, before))
        retries = 0
        while not out.killed and retries < CRASH_RETRIES:  # it failed before its crash point: again
            retries += 1
            crash_epoch = self.last_epoch + 1
            out = self._launch(
                f"{act.label}-retry{retries}",
                ["run", "--config", cfg, "--epochs", "3"],
                {CRASH_ENV: f"{act.crash.value}@{crash_epoch}+"},
            )
        self.faults.append(self._crash(act, out, crash_epoch))

    @staticmethod
    def _failed_before_its_faults(act: Act, out: RunOutcome) -> bool:
        """Whether ``out`` failed (not SIGKILLed, not 0) before any fault of ``act`` came due: before
        its first epoch, or, for the act with the region faults, before the epoch of its first one
        started (its live faults come due in those epochs too)."""
        if out.killed or out.returncode in (0, None):
            return False
        due = min((f.epoch for f in act.region_faults), default=None)
        if due is None:
            return not out.epochs
        return max((e.epoch for e in out.epochs), default=0) < due - 1

    def _region_faults(self, act: Act, out: RunOutcome) -> list[Fault]:
        """The region faults the driver injected itself; the worker kill is WorkerKill's."""
        faults = []
        for spec in act.region_faults:
            line = out.epoch(spec.epoch)
            seen = "not printed" if line is None else f"{line.kind}, failed regions {line.failed or 'none'}"
            if spec.kind is FaultKind.READER_FAILURE:
                raised = f"region {spec.region} fails at epoch {spec.epoch}" in out.stderr
                ok = raised and line is not None and line.failed.get(spec.region) == "decline"
                detail = f"--fault {spec.spec}: region {spec.region}'s task raises after reading"
                evidence = f"epoch {spec.epoch} {seen}; the task's InjectedFault in the driver log: {raised}"
            elif spec.kind is FaultKind.STALLED_REGION:
                ok = line is not None and line.failed.get(spec.region) == "timeout"
                detail = (
                    f"--fault {spec.spec}: region {spec.region}'s task sleeps past the "
                    f"{self.tuning.region_timeout_s:g}s region timeout and is cancelled"
                )
                evidence = f"epoch {spec.epoch} {seen}"
            else:
                continue
            faults.append(Fault(spec.kind, act.label, detail, spec.epoch, injected=ok, evidence=evidence))
        return faults

    def _rescale(self, act: Act, out: RunOutcome, before: int) -> Fault:
        assert act.rescale_to is not None
        kind = FaultKind.RESCALE_UP if act.rescale_to > before else FaultKind.RESCALE_DOWN
        done = [e for e in out.epochs if e.completed and e.regions == act.rescale_to]
        return Fault(
            kind,
            act.label,
            f"recover --checkpoint latest --parallelism {act.rescale_to} (from {before})",
            done[0].epoch if done else None,
            injected=bool(done) and before != act.rescale_to,
            evidence=(
                f"checkpoint {done[0].epoch} {done[0].kind} at P={act.rescale_to} after P={before}"
                if done
                else f"no checkpoint completed at P={act.rescale_to}; exit {out.returncode}"
            ),
        )

    def _crash(self, act: Act, out: RunOutcome, crash_epoch: int) -> Fault:
        point = act.crash.value
        fault = Fault(
            FaultKind.DRIVER_SIGKILL,
            out.label,
            f"SPLITKEEPER_CRASH_AT={point}@{crash_epoch}+: the driver SIGKILLs itself at {point}",
            None if out.crash is None else out.crash[1],
            crash_point=point,
        )
        fault.injected = (
            out.killed and out.crash is not None and out.crash[0] == point and out.crash[1] >= crash_epoch
        )
        fault.evidence = f"exit {out.returncode}" + (
            f" (SIGKILL) at {out.crash[0]} of epoch {out.crash[1]}"
            if out.crash is not None
            else ", no crash line"
        )
        return fault

    def _finish(self) -> bool:
        """Run until the group's offsets sit at every partition's end on a global checkpoint."""
        assert self.producer is not None
        for thread in self._background:
            thread.join()
            errors = getattr(thread, "errors", [])
            if errors:
                raise errors[0]
        self.producer.flush()
        ends = end_offsets(self.producer.delivered)
        say(f"all {len(self.producer.delivered):,} messages delivered; running to the end of every partition")
        cfg = str(self.config_path)
        for i in range(MAX_FINAL_RUNS):
            # Every message is delivered, so "caught up with the ends at the start" is the end.
            out = self._launch(
                f"final-{i + 1}", ["run", "--config", cfg, "--epochs", "20", "--until-caught-up"]
            )
            at_end = {
                sid: off for sid, (off, _tag) in group_offsets(self.bootstrap, self.group_id).items()
            } == ends
            last = out.epochs[-1] if out.epochs else None  # none: already there on a global checkpoint
            if out.returncode == 0 and at_end and (last is None or last.kind == "global"):
                return True
        return False

    # -- the run ---------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        self._setup()
        for act in self.schedule:
            self._act(act)
        caught_up = self._finish()
        assert self.producer is not None
        if self.store is not None:  # the verdict reads the store itself, not through the proxy
            os.environ.update(self.store.direct_env())
        checks = verify(
            self.config_path,
            self.workdir,
            self.bootstrap,
            self.topics,
            self.group_id,
            self.producer.delivered,
            frozenset(f"m{seq:08d}" for seq in range(self.messages) if in_share(seq, self.bad_records)),
            keyed=(chaos_key, DELETE_MARK) if self.sink == "upsert" else None,
        )
        return self._result(caught_up, checks)

    def _result(self, caught_up: bool, checks: dict[str, Any]) -> dict[str, Any]:
        assert self.producer is not None
        injected = [f for f in self.faults if f.injected]
        missing = [f for f in self.faults if not f.injected and not f.skipped]
        skipped = [f for f in self.faults if f.skipped]
        planned: dict[str, int] = {
            k.value: n - sum(1 for f in skipped if f.kind is k)
            for k, n in planned_counts(self.schedule).items()
        }
        by_kind: dict[str, int] = {
            k.value: sum(1 for f in injected if f.kind is k) for k in FaultKind if k.value in planned
        }
        short = {k: (by_kind[k], n) for k, n in planned.items() if by_kind[k] < n}
        refused = [
            f for f in injected if f.kind in (FaultKind.CONCURRENT_DRIVER, FaultKind.CONCURRENT_RECOVER)
        ]
        recover = next((f for f in self.faults if f.kind is FaultKind.CONCURRENT_RECOVER), None)
        kinds = [e.kind for r in self.runs for e in r.epochs]
        result: dict[str, Any] = {
            "source": "kafka",
            "profile": self.profile,
            "spark_master": self.cluster.master_url
            if self.cluster is not None
            else os.environ.get("SPLITKEEPER_SPARK_MASTER", "").strip() or "local[*]",
            "seed": self.seed,
            "messages": len(self.producer.delivered),
            "messages_requested": self.messages,
            "messages_not_delivered": len(self.producer.failed),
            "bad_records": self.bad_records,
            "sink": self.sink,
            "readers": self.readers,
            "store": self._store_result(),
            **({} if self.cluster is None else {"spark_cluster": self.cluster.evidence()}),
            **checks,
            "caught_up": caught_up,
            "faults_by_kind": by_kind,
            "faults_planned_by_kind": planned,
            "concurrent_drivers_refused": len(refused),
            "concurrent_recover": "refused by the lease"
            if recover is not None and recover.injected
            else "not refused",
            "crash_points": sorted({f.crash_point for f in injected if f.crash_point}),
            "faults_injected": [f.to_json() for f in injected],
            "faults_missing": [f.to_json() for f in missing],
            "faults_skipped": [f.to_json() for f in skipped],
            "checkpoints": {k: kinds.count(k) for k in ("global", "regional", "aborted")},
            "runs": [r.to_json() for r in self.runs],
            "parallelism": PARALLELISM,
            "topics": dict(zip(self.topics, TOPIC_PARTITIONS, strict=True)),
            "elapsed_s": round(time.monotonic() - self._started, 1),
            "workdir": str(self.workdir),
        }
        result["passed"] = (
            result["records_lost"] == 0
            and result["records_duplicated"] == 0
            and result["records_unexpected"] == 0
            and result["records_misrouted"] == 0
            and result["dead_letters"] == result["dead_letters_expected"]
            and result["messages_not_delivered"] == 0
            and result["messages"] == self.messages
            and result["partitions_contiguous"]
            and result["kafka_matches_delivery_reports"]
            and result["offsets_aligned"]
            and result["offsets_at_end"]
            and result["restart_checks"] == "passed"
            and (self.sink != "upsert" or result["keyed_matches"] is True)
            and not missing
            and not short
            and (self.store is None or result["store"]["faults_complete"])
        )
        for fault in self.faults:
            state = "injected" if fault.injected else ("skipped" if fault.skipped else "MISSING")
            say(f"fault {fault.kind.value:<18} {state:<8} [{fault.run}] {fault.detail} -- {fault.evidence}")
        if short:
            say(f"fault kinds short of the plan (injected, planned): {short}")
        if self.store is not None:
            store = result["store"]
            say(
                f"object store faults injected {store['faults']} in {store['requests']:,} requests "
                f"(resets of Delta commits: {store['conditional_put_resets']}); the drivers' own retries "
                f"(splitkeeper_store_retries_total) {store['driver_retries']}; "
                f"{len(store['runs_failed_by_store'])} driver runs failed on the store and were "
                f"recovered by the next: {[r['run'] for r in store['runs_failed_by_store']]}"
            )
        return result

    def _store_result(self) -> dict[str, Any]:
        """``--store s3``: what the proxy injected, and the driver runs the store made fail."""
        from splitkeeper.delta.retries import OPERATIONS

        retries = {op: self.retries[op] for op in OPERATIONS}
        if self.store is None:
            return {"kind": "local", "driver_retries": retries}
        counts = self.store.counts()
        faults = {k: v for k, v in counts.items() if k != "requests"}
        return {
            "kind": "s3",
            "fault_rate": self.store.fault_rate,
            "requests": counts["requests"],
            "faults": faults,
            "faults_complete": all(n > 0 for n in faults.values()),
            "conditional_put_resets": self.store.conditional_resets(),
            "driver_retries": retries,
            "runs_failed_by_store": store_failures(self.runs),
        }

    def shutdown(self) -> None:
        """Stop the broker, the store and the Spark cluster this command started (the local Spark
        session ends with the process)."""
        for thread in self._background:
            thread.join(timeout=60)
        self.broker.stop()
        if self.store is not None:
            self.store.stop()
        if self.cluster is not None:
            self.cluster.stop()
