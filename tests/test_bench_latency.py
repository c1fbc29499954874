"""``splitkeeper-tools bench latency --source kafka``: a small end-to-end run (own broker, Spark), pieces.

No latency bound is asserted (the figures depend on the machine's load): the run must produce
at the asked rate, both sinks must hold every produced message exactly once with its bytes,
and the percentiles must be real (positive, ordered) on both sides. The small run also SIGKILLs
one of our long-lived reader slots' Python workers in the middle (``--fault worker-kill``): the
data must still be exact, and the run must show it met the fault.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from splitkeeper.errors import InvalidParameterError
from splitkeeper_tools import cli
from splitkeeper_tools.bench.latency import (
    LatencySettings,
    ReaderSlots,
    by_second,
    check_exact,
    epoch_phases,
    percentile,
    percentiles,
    produced_between,
    stamped_value,
    steady,
)

RATE, SECONDS = 100, 5
FIELDS = {
    "ours_p50_s", "ours_p90_s", "ours_p99_s", "ss_p50_s", "ss_p90_s", "ss_p99_s", "p99_ratio",
    "rate_reached", "messages", "ours_exact", "ss_exact", "load_avg",
}  # fmt: skip


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
def test_a_small_latency_run_with_a_reader_killed_sees_every_message_once_in_both_sinks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "charts"
    code = cli.main(
        [
            "bench", "latency", "--source", "kafka", "--rate", str(RATE), "--seconds", str(SECONDS),
            "--partitions", "2", "--parallelism", "2", "--fault", "worker-kill", "--out", str(out),
            "--work-dir", str(tmp_path / "work"), "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-5000:]
    lines = [line for line in captured.out.splitlines() if line.strip()]
    assert len(lines) == 1, "exactly one JSON object on stdout"
    result = json.loads(lines[0])

    assert set(result) >= FIELDS
    assert result["messages"] == pytest.approx(RATE * SECONDS, rel=0.1)
    assert result["rate_reached"] == pytest.approx(RATE, rel=0.1)
    assert result["ours_exact"] is True and result["ss_exact"] is True and result["passed"] is True
    for side in ("ours", "ss"):
        assert result[f"{side}_visible"] == result["messages"]  # every message seen becoming visible
        assert result[f"{side}_check"]["rows"] == result["messages"]
        p50, p90, p99 = (result[f"{side}_p{q}_s"] for q in (50, 90, 99))
        assert 0 < p50 <= p90 <= p99 <= result[f"{side}_max_s"], (side, p50, p90, p99)
    assert result["p99_ratio"] == pytest.approx(result["ours_p99_s"] / result["ss_p99_s"], abs=1e-3)
    for side in ("ours", "ss"):  # the steady figures leave out the first 2 s: never above all messages'
        steady = [result[f"{side}_steady_p{q}_s"] for q in (50, 90, 99)]
        assert 0 < steady[0] <= steady[1] <= steady[2] <= result[f"{side}_max_s"], (side, steady)
    assert result["ramp_s"] == 2.0 and result["steady_p99_ratio"] is not None
    assert result["ours_epochs"] > SECONDS  # continuous: about two epochs a second (interval 0.5 s)
    assert {"start", "run", "end"} <= set(result["load_avg"])
    assert "[bench latency] produced 500" in captured.err
    # the fault: one of our reader slots' Python workers SIGKILLed halfway, a real process of the run
    fault = result["fault"]
    assert fault["kind"] == "worker-kill" and fault["injected"] is True, fault["evidence"]
    assert fault["at_s"] == SECONDS / 2 and fault["killed_at_s"] >= SECONDS / 2
    assert f"(pid {fault['pid']})" in captured.err and "Python worker exited unexpectedly" in captured.err
    assert fault["reader_jobs_started_after"] >= 1 or fault["epochs_with_a_failed_region_after"]
    assert result["reader_jobs_started"] >= 2  # the first job, and the one that replaced it
    for side in ("ours", "ss"):  # the messages produced around the fault, on both sides
        window = [fault[f"{side}_window_p{q}_s"] for q in (50, 90, 99)]
        assert 0 < window[0] <= window[1] <= window[2] <= fault[f"{side}_window_max_s"], (side, window)
    html = (out / "latency_kafka.html").read_text(encoding="utf-8")
    assert 'id="latency-kafka"' in html
    assert 'id="latency-kafka-by-second"' in html and f"{SECONDS // 2}s (fault)" in html
    assert len(result["p99_by_second"]["ours"]) == SECONDS  # the p99 of each second of production


def test_the_steady_figures_leave_out_the_messages_of_the_first_ramp_seconds() -> None:
    latency = {seq: (5.0 if seq < 200 else 0.5) for seq in range(1000)}  # 100/s: 2 s of 5 s latency
    assert set(steady(latency, 100, 2.0)) == set(range(200, 1000))
    assert percentiles(steady(latency, 100, 2.0), "x")["x_p99_s"] == 0.5
    assert percentiles(latency, "x")["x_p99_s"] == 5.0  # all messages keep the ramp
    assert steady(latency, 100, 0.0) == latency
    assert set(steady(latency, 100, 0.015)) == set(range(2, 1000))  # message 2 is produced at 0.02 s


def test_the_p99_by_second_takes_each_seconds_messages() -> None:
    latency = {seq: (2.0 if 100 <= seq < 200 else 0.5) for seq in range(300) if seq not in range(200, 300)}
    assert by_second(latency, 100, 3.0) == [0.5, 2.0, None]  # second 2: nothing seen
    assert by_second({}, 100, 0.5) == [None]


def test_the_worker_to_kill_is_the_live_slot_that_said_hello_last(tmp_path: Path) -> None:
    """The pool's own records name the slots' workers; a slot's later hello replaces its earlier one,
    and a worker that already ended is passed over."""
    import logging
    import subprocess
    import sys

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        slots = ReaderSlots()
        with slots.attached():
            log = logging.getLogger(ReaderSlots.LOGGER)
            log.info("starting reader job %s: %s slots", 1, 2)
            log.info("reader slot %s ready (task %s, pid %s)", (1, 0), 7, alive.pid)
            log.info("reader slot %s ready (task %s, pid %s)", (1, 1), 8, os.getpid())
            log.info(
                "reader slot %s ready (task %s, pid %s)", (1, 0), 9, ended.pid
            )  # (1, 0) again, now ended
        log.info("reader slot %s ready (task %s, pid %s)", (2, 0), 10, alive.pid)  # not listened to any more
        assert slots.live_worker() == ((1, 1), os.getpid())
        assert len(slots.jobs) == 1 and len(slots.ready) == 3
        slots.ready.append((slots.ready[-1][0] + 1, (1, 2), alive.pid))
        assert slots.live_worker() == ((1, 2), alive.pid)  # the latest hello of a live worker
    finally:
        alive.kill()
        alive.wait()


def test_the_fault_window_takes_the_messages_produced_in_it() -> None:
    latency = {seq: float(seq) for seq in range(1000)}  # 100/s: message k at k / 100 s
    assert set(produced_between(latency, 100, 2.0, 5.0)) == set(range(200, 500))
    assert produced_between(latency, 100, 20.0, 30.0) == {}


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 90), percentile(values, 99)) == (50.0, 90.0, 99.0)
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_the_content_check_refuses_a_missing_a_changed_or_a_repeated_message() -> None:
    value_of = stamped_value(4)
    expected = {("t-0", 0): value_of(0, "t", 0, "aabbccdd"), ("t-0", 1): value_of(1, "t", 0, "00112233")}
    (k0, v0), (k1, v1) = expected.items()

    def check(rows: list[tuple[tuple[str, int], bytes]]) -> bool:
        table = pa.table(
            {
                "split_id": [k[0] for k, _ in rows],
                "offset": pa.array([k[1] for k, _ in rows], pa.int64()),
                "value": pa.array([v for _, v in rows], pa.binary()),
            }
        )
        return bool(check_exact(table, expected)["exact"])

    assert json.loads(v0)["seq"] == 0 and json.loads(v1)["produced_at"] > 0
    assert check([(k0, v0), (k1, v1)])
    assert not check([(k0, v0)])  # missing
    assert not check([(k0, v0), (k1, v1[:-2] + b"x}")])  # a changed byte
    assert not check([(k0, v0), (k1, v1), (k1, v1)])  # twice


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rate", "0"], "rate=0"),
        (["--seconds", "-1"], "seconds=-1.0"),
        (["--partitions", "0"], "partitions=0"),
        (["--interval-s", "0"], "interval_s=0.0"),
        (["--ramp-s", "30"], "ramp_s=30.0"),
        (["--fault", "worker-kill", "--readers", "per_epoch"], "fault='worker-kill'"),
        (["--fault", "worker-kill", "--fault-at", "1"], "fault_at=1.0"),
    ],
)
def test_bad_input_exits_2_naming_the_value_before_starting_anything(
    argv: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    assert cli.main(["bench", "latency", "--source", "kafka", "--work-dir", str(work), *argv]) == 2
    assert named in capsys.readouterr().err
    assert not work.exists()


def test_default_settings_are_the_issue_reference_load() -> None:
    d = LatencySettings()
    assert (d.rate, d.seconds, d.partitions, d.interval_s, d.poll_s) == (500, 30.0, 8, 0.5, 0.05)
    assert d.messages == 15_000
    with pytest.raises(InvalidParameterError):
        LatencySettings(rate=True)  # a bool is not a rate


def test_epoch_phases_are_read_from_the_epoch_lines_with_the_gap_between_epochs() -> None:
    """Where our epochs' time goes: each phase of the driver's epoch lines, the epoch itself, and the
    gap between an epoch's end and the next one's start (line times minus the next epoch's length)."""
    line = (
        "epoch {n:>4} global   4/4 regions ack                    committed     1,305 records  [normal] "
        "  {s:.2f}s plan=0.10 read={r:.2f} decide=0.00 sink=0.06 state=0.05 retain=0.09 finish=0.00"
    )
    ends = [
        (10.0, line.format(n=1, s=0.50, r=0.20)),
        (10.6, line.format(n=2, s=0.50, r=0.30)),  # started 0.1 s after epoch 1 ended
        (11.2, line.format(n=3, s=0.60, r=0.40)),  # started at once
    ]
    phases = epoch_phases(ends)
    assert phases["read"] == {"p50": 0.3, "p90": 0.4, "max": 0.4, "n": 3}
    assert phases["epoch"]["p50"] == 0.5 and phases["epoch"]["max"] == 0.6
    assert phases["gap"]["n"] == 2 and phases["gap"]["max"] == pytest.approx(0.1, abs=1e-3)
    assert phases["gap"]["p50"] == pytest.approx(0.0, abs=1e-3)
    assert set(phases) == {"epoch", "gap", "plan", "read", "decide", "sink", "state", "retain", "finish"}
    assert epoch_phases([]) == {}
