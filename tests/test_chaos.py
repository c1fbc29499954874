"""``splitkeeper-tools chaos --source kafka``: a reduced run proves exactly-once under every fault kind.

The chaos command starts its own broker, produces the messages, runs the pipeline as child
processes (six drivers SIGKILLed at the six crash points, a region failure, a stalled region,
a SIGKILLed Python worker, a second driver and a recover refused by the lease, two broker
SIGKILLs, a rescale up and down) and checks the sink against every delivery report itself;
the slow test runs it as a user would, with 1% malformed messages (``--bad-records 0.01``: not
UTF-8, dead letters of a ``decode: text`` pipeline with ``errors.tolerance: all``), and checks what
it reports. The schedule tests check the fault table the seed draws from, the malformed values and
the sink-and-dead-letters comparison, without starting anything.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from runtime.helpers import subprocess_env  # tests/ is on sys.path (no __init__.py)

from splitkeeper.core.backlog import BacklogConfig
from splitkeeper.core.checkpoint import CheckpointConfig
from splitkeeper.core.driver import DriverSettings, EpochDriver
from splitkeeper.core.ports import CrashPoint, EpochPlan, RegionRun
from splitkeeper.core.types import CheckpointKind, Split
from splitkeeper.delta import retries
from splitkeeper.sim.events import RegionFailure
from splitkeeper.sim.simulator import ReassignableSimSource, SimClock, SimEpochSink, SimRegionRunner, SimState
from splitkeeper.sim.sink import SimulatedSink
from splitkeeper_tools.chaos.runner import chaos_value
from splitkeeper_tools.chaos.schedule import (
    PLANNED,
    FaultKind,
    Tuning,
    draw_schedule,
    faults_epoch_records,
    planned_counts,
)
from splitkeeper_tools.chaos.store import versitygw_binary
from splitkeeper_tools.chaos.verify import compare_sink
from splitkeeper_tools.kafka_testbed import value_text

REPO = Path(__file__).resolve().parents[1]
EXPECTED_BY_KIND = {kind.value: count for kind, count in PLANNED.items()}


def chaos(*argv: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -m splitkeeper_tools chaos <argv>`` on the runtime tests' small local Spark."""
    return subprocess.run(
        [sys.executable, "-m", "splitkeeper_tools", "chaos", *argv],
        env=subprocess_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sink", "readers"),
    # the suite runs the upsert sink with a job per epoch (its change table is the append path's
    # records, plus the keyed MERGE) and the append sink with long-lived readers (issue 41: every
    # fault kind and crash point against a reader job held for the run); the append sink's run with a
    # job per epoch is the slow variant
    [
        ("upsert", "per_epoch"),
        ("append", "long_lived"),
        pytest.param("append", "per_epoch", marks=pytest.mark.slow_variant),
    ],
    ids=["upsert", "append-long_lived", "append"],
)
def test_reduced_chaos_run_loses_and_duplicates_nothing_under_every_fault_kind(
    tmp_path: Path, sink: str, readers: str
) -> None:
    done = chaos(
        "--source", "kafka", "--messages", "2000", "--seed", "7", "--bad-records", "0.01", "--json",
        "--sink", sink, "--readers", readers, "--workdir", str(tmp_path / "w"), timeout_s=1800,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["sink"], result["readers"]) == (sink, readers)
    if sink == "upsert":
        # the change table (records_in_sink below) holds every message; the keyed table the latest
        # message of every live key, as the delivery reports' fold says (computed by the chaos run)
        assert result["keyed_matches"] is True and result["keys_wrong"] == []
        assert result["keys_in_table"] == result["keys_expected"] > 0 and result["keys_deleted"] > 0
    assert result["messages"] == 2000 and result["messages_not_delivered"] == 0
    assert result["kafka_matches_delivery_reports"] is True
    # every message in exactly one of sink and dead letters, byte for byte; the 20 malformed ones
    # (1%) are exactly the dead letters, all of them failed to decode
    assert (result["records_in_sink"], result["dead_letters"], result["dead_letters_expected"]) == (
        1980,
        20,
        20,
    )
    assert result["dead_letters_by_stage"] == {"decode": 20}
    assert (result["records_lost"], result["records_duplicated"], result["records_unexpected"]) == (0, 0, 0)
    assert result["records_misrouted"] == 0
    assert result["partitions_contiguous"] is True
    assert result["offsets_aligned"] is True and result["offsets_at_end"] is True
    assert result["restart_checks"] == "passed"
    # every fault of the table, each with its evidence
    assert result["faults_by_kind"] == EXPECTED_BY_KIND
    assert result["faults_missing"] == [] and result["faults_skipped"] == []
    assert result["crash_points"] == sorted(p.value for p in CrashPoint)
    assert result["concurrent_drivers_refused"] == 2
    assert result["concurrent_recover"] == "refused by the lease"
    runs = {r["run"]: r for r in result["runs"]}
    assert sum(1 for r in result["runs"] if r["exit"] == -9) >= len(CrashPoint)  # drivers really SIGKILLed
    assert (runs["second-driver"]["exit"], runs["second-driver"]["epochs"]) == (2, [])
    assert (runs["concurrent-recover"]["exit"], runs["concurrent-recover"]["epochs"]) == (2, [])
    evidence = {f["kind"]: [] for f in result["faults_injected"]}
    for fault in result["faults_injected"]:
        evidence[fault["kind"]].append(fault["evidence"])
    assert all("SIGKILLed (exit -9)" in e and "in flight" in e for e in evidence["broker_sigkill"])
    assert "pyspark.daemon" in evidence["worker_sigkill"][0] and "decline" in evidence["worker_sigkill"][0]
    assert all("[LEASE_HELD]" in e for e in evidence["concurrent_driver"] + evidence["concurrent_recover"])
    assert result["checkpoints"]["regional"] >= 3  # a failed, a timed-out and a worker-killed region
    # every driver that ran an epoch ran its regions the chosen way: on a reader job held for its run
    # (its log says it started one), or on a job per epoch (none started)
    logs = tmp_path / "w" / "logs"
    pooled = {
        r["run"]: "starting reader job 1:" in (logs / f"{i:02d}-{r['run']}.log").read_text(errors="replace")
        for i, r in enumerate(result["runs"])
        if r["epochs"]
    }
    assert len(pooled) >= len(CrashPoint) + 1  # the six crashed drivers and the last
    assert set(pooled.values()) == {readers == "long_lived"}, pooled
    if readers == "long_lived":  # the killed Python worker was a reader slot's, held since its hello
        assert "long-lived reader slot (" in evidence["worker_sigkill"][0]
    assert "PASSED: 2,000 messages, lost 0, duplicated 0" in done.stderr
    assert "dead letters 20 of 20 malformed" in done.stderr


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.slow_variant  # needs versitygw (scripts/setup.sh cluster); the proxy's own tests run in CI
@pytest.mark.skipif(versitygw_binary() is None, reason="versitygw not built (bash scripts/setup.sh cluster)")
def test_a_chaos_run_on_a_faulty_object_store_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """``--store s3``: state, sink and dead letters on versitygw; the drivers reach it through the fault
    proxy (503 SlowDown, resets, slow answers at 2% each, drawn from the seed) under every fault kind."""
    done = chaos(
        "--source", "kafka", "--messages", "200", "--seed", "7", "--bad-records", "0.01", "--json",
        "--store", "s3", "--store-fault-rate", "0.02", "--workdir", str(tmp_path / "w"), timeout_s=1800,
    )  # fmt: skip

    result = _assert_exact_on_a_faulty_store(done)
    assert result["profile"] == "local" and result["spark_master"] == "local[2]"
    assert "spark_cluster" not in result


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.slow_variant  # a Spark master, 2 workers and 2 executors per driver: CI cannot afford it
@pytest.mark.skipif(versitygw_binary() is None, reason="versitygw not built (bash scripts/setup.sh cluster)")
def test_a_chaos_run_on_the_standalone_cluster_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """``--profile cluster``: the same run as ``--store s3`` above, every driver on a Spark standalone
    master with 2 workers (their executors run the region tasks, and the Python worker killed is an
    executor's)."""
    done = chaos(
        "--source", "kafka", "--profile", "cluster", "--messages", "200", "--seed", "7",
        "--bad-records", "0.01", "--store-fault-rate", "0.02", "--json", "--workdir", str(tmp_path / "w"),
        timeout_s=3000,
    )  # fmt: skip

    (tmp_path / "chaos-stderr.log").write_text(done.stderr)  # the whole progress, beside the work folder
    result = _assert_exact_on_a_faulty_store(done)
    assert result["profile"] == "cluster" and result["spark_master"].startswith("spark://127.0.0.1:")
    spark = result["spark_cluster"]
    print("spark block:", json.dumps(spark))  # shown with -s
    assert spark["master"] == result["spark_master"]
    # the drivers that read records (a driver starts Spark at its first epoch with ranges to read: the
    # act with the region faults, and those receiving a share) were applications of the master, each
    # with an executor on each worker (spark.cores.max 2, one core an executor, spread over the workers)
    assert spark["applications"] >= 3, spark
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert spark["workers"][worker]["applications"] == spark["applications"], spark
    for app in (tmp_path / "w" / "cluster" / "spark" / "worker-1").glob("app-*"):
        assert any((executor / "stderr").is_file() for executor in app.iterdir())  # the executor's log
    # the killed Python worker was an executor's, on a Spark worker (not under the driver)
    killed = next(f for f in result["faults_injected"] if f["kind"] == "worker_sigkill")["evidence"]
    assert "java org.apache.spark.executor.CoarseGrainedExecutorBackend" in killed, killed
    assert "java org.apache.spark.deploy.worker.Worker" in killed and "(the driver)" not in killed
    assert f"drivers on {result['spark_master']}" in done.stderr
    assert "cluster: down: stopped spark-worker-1, spark-worker-2, spark-master" in done.stderr


def _assert_exact_on_a_faulty_store(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """What a ``--messages 200 --bad-records 0.01 --store-fault-rate 0.02`` run on the object store
    must show, whatever runs the drivers; returns its JSON."""
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    store = result["store"]
    assert store["kind"] == "s3" and store["fault_rate"] == 0.02
    assert all(store["faults"][kind] > 0 for kind in ("slowdown", "delay", "reset")), store
    assert sum(store["faults"].values()) < 0.15 * store["requests"]  # ~6% of the requests faulted
    # resets reach Delta commits too (before and after forwarding); the drivers' own retries, by operation
    assert set(store["conditional_put_resets"]) == {"before_forwarding", "after_forwarding"}
    assert set(store["driver_retries"]) == set(retries.OPERATIONS)  # every operation, 0 included
    print("store block:", json.dumps(store))  # shown with -s
    # by content: every message once in the sink or the dead letters, byte for byte
    assert (result["records_in_sink"], result["dead_letters"], result["dead_letters_expected"]) == (198, 2, 2)
    assert (result["records_lost"], result["records_duplicated"], result["records_unexpected"]) == (0, 0, 0)
    assert result["records_misrouted"] == 0 and result["partitions_contiguous"] is True
    assert result["offsets_aligned"] is True and result["offsets_at_end"] is True
    assert result["restart_checks"] == "passed"
    # every fault of the table, plus a driver SIGSTOPped past its lease's ttl while a takeover committed
    assert result["faults_by_kind"] == {**EXPECTED_BY_KIND, "driver_sigstop": 1}
    assert result["faults_missing"] == []
    paused = next(f for f in result["faults_injected"] if f["kind"] == "driver_sigstop")
    assert "takeover exit 0" in paused["evidence"] and "committed after waking nothing" in paused["evidence"]
    assert "[LEASE_LOST]" in paused["evidence"] or "[CONCURRENT_RUN]" in paused["evidence"]
    assert "store faults {'slowdown': " in done.stderr
    assert "AWS_SECRET_ACCESS_KEY" not in done.stderr  # the drivers' command lines do not show the keys
    assert "spark.authenticate.secret" not in done.stderr  # nor the Spark secret (--profile cluster)
    return result


@pytest.mark.parametrize("seed", range(40))
def test_every_seed_schedules_the_whole_fault_table_on_six_drivers_one_crash_point_each(seed: int) -> None:
    acts = draw_schedule(seed, Tuning(2000))

    assert planned_counts(acts) == dict(PLANNED)
    assert sorted(a.crash.value for a in acts) == sorted(p.value for p in CrashPoint)
    first = acts[0]
    assert sorted(f.epoch for f in first.region_faults) == [2, 3, 4]  # after checkpoint 1, before the crash
    assert all(0 <= f.region < 4 for f in first.region_faults)
    assert first.crash_after + 1 > max(f.epoch for f in first.region_faults)
    assert [a.rescale_to for a in acts if a.rescale_to] == [6, 4]
    assert sum(a.broker_kill for a in acts) == PLANNED[FaultKind.BROKER_SIGKILL]
    # a driver that meets a broker SIGKILL is alive through it: it dies in a later epoch
    assert all(a.crash_after >= 2 and a.epochs > a.crash_after + 1 for a in acts if a.broker_kill)


@pytest.mark.parametrize("seed", range(6))
def test_the_act_with_the_region_faults_finds_every_region_reading_in_each_fault_epoch(seed: int) -> None:
    """faults_epoch_records on the real epoch driver (in memory): 8 uneven unbounded splits (the chaos
    producer's weights 1..8, each at least 5 records), P=4, the schedule's region faults: every
    region gets a task in each of the act's epochs up to its crash, so every region fault fires."""
    rng = random.Random(seed)
    act = draw_schedule(seed, Tuning(200))[0]
    epochs = act.crash_after + 1
    sizes = [epochs + sum(rng.random() < (1 + i) / 36 for _ in range(100)) for i in range(8)]
    budget = faults_epoch_records(sizes, epochs)
    reports, asked = _first_epochs(sizes, budget, act.region_faults, epochs)

    assert [r.epoch for r in reports] == list(range(1, epochs + 1))
    assert all(asked[r.epoch] == set(range(4)) and not r.idle_regions for r in reports)
    for fault in act.region_faults:  # each fault's region ran, and failed, in its epoch
        assert reports[fault.epoch - 1].kind is CheckpointKind.REGIONAL
    # the old sizing (100 records per epoch) drains small splits: a region goes idle before the crash
    old, _ = _first_epochs(sizes, 100, (), epochs)
    assert any(r.idle_regions for r in old)
    with pytest.raises(ValueError, match="at least 5 records"):
        faults_epoch_records([4, *sizes[1:]], epochs)


def _first_epochs(
    sizes: list[int], budget: int, faults: Any, epochs: int
) -> tuple[list[Any], dict[int, set[int]]]:
    """The first ``epochs`` epochs of the in-memory epoch driver over unbounded splits of ``sizes``
    records, P=4, ``budget`` records per epoch, ``faults`` failing: the reports, and the regions run."""
    source = ReassignableSimSource(subscriptions={"t"})
    source.add([Split(f"t-{i}", "t", 0) for i in range(len(sizes))])
    source.ends.update({f"t-{i}": n for i, n in enumerate(sizes)})
    runner = _AskedRunner({(f.epoch, f.region): RegionFailure.DECLINE for f in faults})
    sink = SimEpochSink(SimulatedSink(), runner)
    backlog = BacklogConfig(backlog_epoch_records=budget, normal_epoch_records=budget)
    settings = DriverSettings(pipeline="t", parallelism=4, checkpoint=CheckpointConfig(), backlog=backlog)
    driver = EpochDriver(settings, source, runner, sink, SimState(), SimClock())
    driver.open()
    return [driver.run_epoch() for _ in range(epochs)], runner.asked


class _AskedRunner(SimRegionRunner):
    """The simulated region runner, remembering which regions it was asked to run, per epoch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: dict[int, set[int]] = {}

    def run(self, epoch: int, plan: EpochPlan, timeout_s: float) -> dict[int, RegionRun]:
        self.asked[epoch] = {r for r, ranges in plan.items() if ranges}
        return super().run(epoch, plan, timeout_s)


def test_an_act_that_the_store_fails_before_its_faults_came_due_is_played_again() -> None:
    """A driver the store failed before any fault of its act came due is played again (bounded by
    ACT_REPLAYS); one that failed later, was SIGKILLed or ended well is not."""
    from splitkeeper_tools.chaos.processes import EpochLine, RunOutcome
    from splitkeeper_tools.chaos.runner import KafkaChaos

    faults, ingest = draw_schedule(7, Tuning(200), pause=True)[:2]
    first_due = min(f.epoch for f in faults.region_faults)
    assert first_due == 2

    def out(returncode: int, *epochs: int) -> RunOutcome:
        return RunOutcome(
            "x", [], returncode=returncode, epochs=[EpochLine(e, "global", 4, {}) for e in epochs]
        )

    again = KafkaChaos._failed_before_its_faults
    assert again(faults, out(1)) and again(ingest, out(1))  # failed at open
    assert again(faults, out(1, 1)) is False  # epoch 1 done: the faults' epoch 2 may have begun
    assert again(ingest, out(1, 7)) is False  # an ingest act's faults come with its epochs
    assert not again(faults, out(-9)) and not again(faults, out(0)) and not again(ingest, out(2, 7))


def test_a_takeover_the_store_failed_before_it_committed_runs_again_while_the_driver_is_frozen(
    tmp_path: Path,
) -> None:
    """DriverPause: the frozen driver (here a real ``sleep``, SIGSTOPped) stays frozen while a takeover
    that a store fault stopped is run again; the second's commit is the fault's evidence."""
    from splitkeeper_tools.chaos.live import TAKEOVER_RUNS, DriverPause
    from splitkeeper_tools.chaos.processes import EpochLine, RunOutcome

    driver = subprocess.Popen(["sleep", "60"])
    launched: list[tuple[str, str]] = []

    def state(wanted: str) -> str:  # the process state letter, once it is ``wanted`` (signals are async)
        deadline = time.monotonic() + 10
        while True:
            now = Path(f"/proc/{driver.pid}/stat").read_text().split(") ")[1][0]
            if now == wanted or time.monotonic() > deadline:
                return now
            time.sleep(0.01)

    def launch(label: str, argv: list[str]) -> RunOutcome:
        launched.append((label, state("T")))
        if len(launched) == 1:
            return RunOutcome(
                label,
                argv,
                returncode=2,
                stderr="[STATE_ERROR] ... failed in the store (Generic S3 error: ...)",
            )
        return RunOutcome(label, argv, returncode=0, epochs=[EpochLine(9, "global", 4, {})])

    pause = DriverPause("rescale-down", 8, tmp_path / "takeover.yaml", 0.0, launch)
    try:
        pause.inject(EpochLine(8, "global", 4, {}), driver)
        assert [label for label, _state in launched] == ["takeover", "takeover-again1"] and TAKEOVER_RUNS >= 2
        assert {state for _label, state in launched} == {"T"}  # frozen through both takeovers
        assert pause.outcome is not None and pause.outcome.returncode == 0
        assert state("S") == "S"  # SIGCONTed after: asleep again, no longer stopped
    finally:
        driver.kill()
        driver.wait()


def test_the_reliability_schedule_adds_a_paused_driver_whose_crash_comes_after_the_takeover() -> None:
    plain, paused = draw_schedule(3, Tuning(2000)), draw_schedule(3, Tuning(2000), pause=True)

    assert planned_counts(paused) == {**PLANNED, FaultKind.DRIVER_SIGSTOP: 1}
    assert FaultKind.DRIVER_SIGSTOP not in planned_counts(plain) and not any(a.pause for a in plain)
    (act,) = [a for a in paused if a.pause]
    assert act.label == "rescale-down" and act.crash_after == 2 and act.epochs > act.crash_after + 1
    assert [a.crash for a in paused] == [a.crash for a in plain]  # the same seed, the same crash points


def test_the_schedule_is_a_function_of_the_seed() -> None:
    def layout(seed: int) -> list[tuple[str, str, tuple[str, ...], bool]]:
        return [
            (a.label, a.crash.value, tuple(f.spec for f in a.region_faults), a.broker_kill)
            for a in draw_schedule(seed, Tuning(2000))
        ]

    assert layout(3) == layout(3)
    assert len({tuple(layout(seed)) for seed in range(10)}) > 1


def test_a_smaller_run_keeps_every_fault_and_shrinks_its_epochs() -> None:
    small, large = Tuning(2000), Tuning(200_000)

    assert planned_counts(draw_schedule(1, small)) == planned_counts(draw_schedule(1, large))
    assert small.epoch_records < large.epoch_records
    assert small.slow_s < small.region_timeout_s < small.stall_s  # slow: within the timeout; stall: past


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--source", "kafka", "--messages", "0"], "--messages=0 is not allowed: an integer >= 100"),
        (["--source", "kafka", "--messages", "99"], "--messages=99 is not allowed: an integer >= 100"),
        (["--source", "files"], "argument --source: invalid choice: 'files'"),
        (["--source", "kafka", "--bootstrap-servers", "localhost"], "--bootstrap-servers='localhost'"),
        (["--source", "kafka", "--store", "gcs"], "argument --store: invalid choice: 'gcs'"),
        (["--source", "kafka", "--profile", "yarn"], "argument --profile: invalid choice: 'yarn'"),
        (["--source", "kafka", "--readers", "pooled"], "argument --readers: invalid choice: 'pooled'"),
        (
            ["--source", "kafka", "--profile", "cluster", "--store", "local"],
            "[INVALID_PARAMETER] --store='local' is not allowed: s3 with --profile cluster",
        ),
        (
            ["--source", "kafka", "--store", "s3", "--store-fault-rate", "0.5"],
            "--store-fault-rate=0.5 is not allowed: a share > 0 and <= 0.1",
        ),
    ],
    ids=[
        "no-messages",
        "too-few-messages",
        "unknown-source",
        "bad-bootstrap",
        "unknown-store",
        "unknown-profile",
        "unknown-readers",
        "cluster-on-a-local-store",
        "fault-rate",
    ],
)
def test_bad_input_exits_2_naming_the_option_before_anything_starts(argv: list[str], message: str) -> None:
    done = chaos(*argv, timeout_s=120)

    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stdout == ""
    assert "starting a Kafka broker" not in done.stderr


def test_one_percent_of_the_chaos_values_are_malformed_evenly_and_not_utf8() -> None:
    value_of = chaos_value(0.01)
    values = [value_of(seq, "chaos-orders", 3, "00ff") for seq in range(2000)]
    bad = [seq for seq, v in enumerate(values) if not _utf8(v)]
    assert bad == list(range(99, 2000, 100))  # 20, one in every 100
    assert values[0] == b"m00000000|chaos-orders|3|00ff"
    assert values[99] == b"m00000099|chaos-orders|3|\xff00ff"
    assert all(_utf8(v) for v in map(chaos_value(0.0), range(300), ["t"] * 300, [0] * 300, ["ab"] * 300))


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_sink_and_dead_letters_together_must_hold_every_message_once_and_the_malformed_as_dead() -> None:
    good, bad = b"m00000000|t|0|aa", b"m00000001|t|0|\xffbb"
    delivered = {("t", 0, 0): value_text(good), ("t", 0, 1): value_text(bad), ("t", 0, 2): "m00000002|t|0|cc"}
    names = frozenset({"m00000001"})
    sink = [("t-0", 0, 1, good), ("t-0", 2, 3, b"m00000002|t|0|cc")]
    exact = compare_sink(sink, delivered, [("t-0", 1, 2, bad)], names)
    assert (exact["records_lost"], exact["records_duplicated"], exact["records_unexpected"]) == (0, 0, 0)
    assert (exact["dead_letters"], exact["records_misrouted"], exact["partitions_contiguous"]) == (1, 0, True)
    lost = compare_sink(sink, delivered, [], names)  # the dead letter is missing: lost, a gap
    assert (lost["records_lost"], lost["partitions_contiguous"], lost["records_misrouted"]) == (1, False, 1)
    twice = compare_sink([*sink, ("t-0", 1, 2, bad)], delivered, [("t-0", 1, 2, bad)], names)
    assert twice["records_duplicated"] == 1 and twice["records_misrouted"] == 0
    changed = compare_sink(sink, delivered, [("t-0", 1, 2, b"m00000001|t|0|?bb")], names)  # bytes replaced
    assert changed["records_unexpected"] == 1
    misrouted = compare_sink([*sink, ("t-0", 1, 2, bad)], delivered, [], names)  # a bad record in the sink
    assert misrouted["records_misrouted"] == 1 and misrouted["records_lost"] == 0


@pytest.mark.parametrize("option, value", [("--store", "s3"), ("--profile", "cluster")])
def test_store_s3_or_profile_cluster_without_the_local_s3_server_exits_2_naming_how_to_build_it(
    tmp_path: Path, option: str, value: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "splitkeeper_tools", "chaos", "--source", "kafka", option, value],
        env=subprocess_env(SPLITKEEPER_TOOLS_DIR=str(tmp_path)),  # no versitygw there
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"[INVALID_PARAMETER] {option}='{value}' is not allowed" in done.stderr
    assert "bash scripts/setup.sh cluster" in done.stderr and "starting a Kafka broker" not in done.stderr


@pytest.mark.parametrize("option, value", [("--store", "s3"), ("--profile", "cluster")])
def test_store_s3_without_the_s3a_jars_exits_2_before_anything_starts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
) -> None:
    """The verification reads the sink with Spark through S3A: without the s3a jar group the command
    refused only after the whole run (minutes); now before anything starts, naming the fix."""
    import splitkeeper_tools.chaos as chaos_cli
    from splitkeeper_tools import cli

    monkeypatch.setattr(chaos_cli, "versitygw_binary", lambda: tmp_path / "versitygw")  # the store is there
    monkeypatch.setenv("SPLITKEEPER_JARS_DIR", str(tmp_path / "jars"))  # no s3a group there
    code = cli.main(["chaos", "--source", "kafka", option, value, "--workdir", str(tmp_path / "w")])

    err = capsys.readouterr().err
    assert code == 2, err
    assert f"[INVALID_PARAMETER] {option}='{value}' is not allowed" in err
    assert "no hadoop-aws jar in" in err and "bash scripts/setup.sh cluster" in err
    assert not (tmp_path / "w").exists()  # nothing started, not even the work folder


def test_profile_cluster_without_spark_exits_2_naming_the_profile_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import splitkeeper_tools.chaos as chaos_cli
    from splitkeeper_tools import cli

    monkeypatch.setattr(chaos_cli, "versitygw_binary", lambda: tmp_path / "versitygw")  # the store is there
    monkeypatch.setattr("splitkeeper_tools.cluster.local.spark_home", lambda: tmp_path)  # no bin/spark-class
    code = cli.main(["chaos", "--source", "kafka", "--profile", "cluster", "--workdir", str(tmp_path / "w")])

    err = capsys.readouterr().err
    assert code == 2, err
    assert "[INVALID_PARAMETER] --profile='cluster' is not allowed" in err
    assert f"{tmp_path / 'bin' / 'spark-class'} is missing" in err
    assert not (tmp_path / "w").exists()  # nothing started, not even the work folder


def test_bad_records_share_is_checked_before_anything_starts() -> None:
    done = chaos("--source", "kafka", "--bad-records", "0.7", timeout_s=120)
    assert done.returncode == 2 and "--bad-records=0.7 is not allowed" in done.stderr
    assert "starting a Kafka broker" not in done.stderr


def test_a_drivers_python_workers_are_found_by_its_tag_off_its_process_tree_too() -> None:
    """``--profile cluster``: an executor's ``pyspark.daemon`` is a child of a Spark worker, not of the
    driver; it carries the driver's tag (``spark.executorEnv``), and only that driver's are its workers."""
    import os
    import time

    from splitkeeper_tools.chaos.processes import DRIVER_TAG_ENV, ancestry, in_sleep, pyspark_workers

    # a "daemon" forks a "worker" that sleeps, as pyspark.daemon forks its workers
    daemon = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    env = {k: v for k, v in os.environ.items() if k != DRIVER_TAG_ENV}
    driver = [sys.executable, "-c", "import time; time.sleep(60)"]
    procs = [
        subprocess.Popen(driver, env={**env, DRIVER_TAG_ENV: "a"}),
        subprocess.Popen([sys.executable, "-c", daemon, "pyspark.daemon"], env={**env, DRIVER_TAG_ENV: "a"}),
        subprocess.Popen([sys.executable, "-c", daemon, "pyspark.daemon"], env={**env, DRIVER_TAG_ENV: "b"}),
    ]
    try:
        deadline = time.monotonic() + 20
        while len(workers := pyspark_workers(procs[0].pid)) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(workers) == 1, workers  # the worker forked by driver a's daemon, not driver b's
        worker = workers[0]
        assert worker not in (p.pid for p in procs)
        chain = ancestry(worker, procs[0].pid)  # worker <- its daemon <- the first process without the tag
        assert chain.startswith(f"{worker} (python -c ") and f"<- {procs[1].pid} (python -c " in chain
        assert f"<- {os.getpid()} (" in chain and "(the driver)" not in chain
        deadline = time.monotonic() + 10
        while not in_sleep(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_sleep(worker)
        # untagged (this process): its descendants are its workers, as local Spark's under a driver
        assert worker in pyspark_workers(os.getpid()) and len(pyspark_workers(os.getpid())) == 2
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_with_long_lived_readers_the_killed_worker_must_be_the_reader_slot_its_pid_names() -> None:
    """WorkerKill's evidence with ``--readers long_lived`` (lines of a real run's driver log): the pid
    killed must be a reader slot's (its hello line), else the fault is not counted as injected."""
    from splitkeeper_tools.chaos.live import WorkerKill
    from splitkeeper_tools.chaos.processes import EpochLine, RunOutcome

    log = (
        "info splitkeeper.spark.readers: starting reader job 1: 2 slots [pipeline=chaos-71596953]\n"
        "info splitkeeper.spark.readers: reader slot (1, 1) ready (task 1, pid 31204) [pipeline=c]\n"
        "info splitkeeper.spark.readers: reader slot (1, 0) ready (task 0, pid 31201) [pipeline=c]\n"
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed).\n"
        "info splitkeeper.spark.readers: starting reader job 2: 2 slots [pipeline=chaos-71596953]\n"
    )
    epochs = [EpochLine(1, "global", 4, {}), EpochLine(2, "regional", 4, {0: "decline"})]

    def verdict(pid: int, long_lived: bool) -> tuple[bool, str]:
        kill = WorkerKill("faults", 2, 0, 30.0, long_lived=long_lived)
        kill.killed = (pid, f"{pid} (python -m pyspark.daemon pyspark.worker)", "python -m pyspark.daemon")
        (fault,) = kill.faults(RunOutcome("faults", [], returncode=-9, epochs=epochs, stderr=log))
        return fault.injected, fault.evidence

    injected, evidence = verdict(31204, long_lived=True)
    assert injected and "long-lived reader slot (1, 1) (task 1) was that worker" in evidence
    assert "2 reader jobs started in the run" in evidence
    injected, evidence = verdict(4242, long_lived=True)  # a worker no slot said hello from
    assert not injected and "no long-lived reader slot had pid 4242" in evidence
    assert verdict(4242, long_lived=False)[0]  # a job per epoch: no slot to name
