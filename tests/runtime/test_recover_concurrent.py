"""Two recovery runs at once: the lease refuses the second, and when the first freezes past its
lease, the fence keeps exactly-once (protocol rules 5.2 and 5.6).

Two ``splitkeeper recover`` processes (what two hand-triggered recovery DAG runs
start: each its own driver and JVM) restore the same pipeline from the same
checkpoint with a rescale to 3. The first is caught inside its epoch (a stalled
region keeps it reading) and frozen there with SIGSTOP — a driver paused by the
machine, as a long GC pause or an overloaded host does. A second one started at
once is refused by the lease, naming the holder, and writes nothing. The next one
waits (``lease.wait_s``): once it saw the frozen driver's lease unchanged for its ttl
(it cannot heartbeat), it takes it over,
plans the next epoch and commits it. When the first is resumed (SIGCONT) and its
stall ends, it must find that another run committed, stop with a
ConcurrentRunError naming the situation, and write nothing. Afterwards the
restart checks pass on the state the second one left, and the pipeline finishes
with the sink equal to the source.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.config.settings import config_from_mapping
from splitkeeper.delta.checkpoints import DeltaStateStore
from splitkeeper.sources import build_source

from .helpers import (
    CLI,
    REPO,
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    run_pipeline,
    sink_rows,
    splitkeeper_subprocess,
    subprocess_env,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

# keeps the first recovery inside its epoch until the test has frozen it (a poll of the plan
# after it is written); the freeze itself outlasts it (the refused run, the ttl, the second's epoch)
STALL_S = 20
# a frozen driver's lease expires this long after its last heartbeat: the second recovery waits it
# out in full; the refused one is refused whatever the ttl (wait_s 0: a holder alive on this host)
LEASE_TTL_S = 6
ONLY_ONE_RUN = "only one run may drive a pipeline"


def test_two_recovery_runs_at_once_one_commits_the_other_fails_and_state_is_intact(
    spark: Any, tmp_path: Path
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=4, lines=60)
    mapping = pipeline_mapping(tmp_path, "recover-twice", input_dir, parallelism=2, epoch_records=80)
    mapping["checkpoint"]["region_timeout_s"] = STALL_S * 3  # the stall is a slow region, not a failed one
    mapping["lease"] = {"ttl_s": LEASE_TTL_S}
    config = config_from_mapping(mapping)
    config_file = write_config(tmp_path / "recover-twice.yaml", mapping)
    waiting = {**mapping, "lease": {"ttl_s": LEASE_TTL_S, "wait_s": LEASE_TTL_S * 8}}
    waiting_file = write_config(tmp_path / "recover-waiting.yaml", waiting)
    assert [e.epoch for e in run_pipeline(config, spark, epochs=1).epochs] == [1]
    store = DeltaStateStore(
        config.state.path, config.name, build_source(config.source).fingerprint(), read_only=True
    )
    assert store.checkpoint_ids() == [1]

    recover = [
        "recover",
        "--config",
        str(config_file),
        "--checkpoint",
        "latest",
        "--parallelism",
        "3",
        "--json",
    ]
    first = subprocess.Popen(
        [str(CLI), *recover, "--fault", f"stall:{STALL_S}:0@2"],
        env=subprocess_env(),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the driver, its JVM and Python workers
    )
    try:
        deadline = time.monotonic() + 240
        while store.latest_plan_epoch() != 2:  # the first recovery restored and is reading epoch 2
            assert first.poll() is None, f"the first recovery ended early: {first.communicate()}"
            assert time.monotonic() < deadline, "the first recovery never planned epoch 2"
            time.sleep(0.5)
        os.killpg(first.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            refused = splitkeeper_subprocess(recover, timeout_s=300)  # the frozen run's lease is held
            # watches the frozen run's lease for its ttl of its own clock, then takes it over
            second = splitkeeper_subprocess(
                [a if a != str(config_file) else str(waiting_file) for a in recover], timeout_s=600
            )
            assert time.monotonic() - frozen_at >= LEASE_TTL_S
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        first_out, first_err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)

    # The recovery started at once was refused by the lease, naming the holder, before it wrote.
    assert refused.returncode == 2 and "[LEASE_HELD]" in refused.stderr, refused.stderr
    assert f"pid {first.pid}" in refused.stderr and "is driven by" in refused.stderr

    # The next one took the expired lease over, restored checkpoint 1 too, rescaled to 3, committed epoch 3.
    assert second.returncode == 0, second.stderr
    summary = json.loads(second.stdout)
    assert summary["restored_from"] == 1 and summary["parallelism"] == 3
    assert summary["checkpoints"].get("global", 0) + summary["checkpoints"].get("regional", 0) == 1

    # The first recovery found the second one's commit when it tried to commit: a clear refusal.
    assert first.returncode == 2, first_err
    assert first_out == ""
    assert "[CONCURRENT_RUN]" in first_err and ONLY_ONE_RUN in first_err
    assert "the state is intact" in first_err

    # Only the second recovery's checkpoint exists, at the new parallelism, and epoch 2 left nothing.
    assert store.checkpoint_ids() == [1, 3]
    latest = store.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == 3 and latest.parallelism == 3
    sink_epochs = {r.epoch for r in spark.read.format("delta").load(config.sink.path).collect()}
    assert sink_epochs == {1, 3}

    code, out, err = run_cli(["validate", "--config", str(config_file), "--json"])
    assert code == 0, err + out
    code, out, err = run_cli(["run", "--config", str(config_file), "--json"])
    assert code == 0, err
    assert json.loads(out)["finished"] is True
    assert_sink_equals_source(spark, config.sink.path, input_dir)


def _until_stopped(proc: subprocess.Popen[str], what: str) -> None:
    """Block until ``proc`` stopped itself at its SPLITKEEPER_PAUSE_AT point (no polling, no sleep)."""
    _pid, status = os.waitpid(proc.pid, os.WUNTRACED)
    if not os.WIFSTOPPED(status):
        proc.returncode = os.waitstatus_to_exitcode(status)
        out, err = proc.communicate()
        pytest.fail(f"{what} ended (exit {proc.returncode}) before its pause point: {err}{out}")


def test_a_paused_holder_woken_before_the_new_holders_first_commit_commits_nothing(tmp_path: Path) -> None:
    """A run paused mid-epoch past its lease ttl, a second run that watched its lease go silent for
    the ttl and took it over, and the first resumed BEFORE the second commits anything: the first
    re-reads its lease before its sink commit, finds it taken over and stops with [LEASE_LOST]
    without writing; the second goes on and the sink equals the source record by record.

    The order is made by pause points (each run SIGSTOPs itself after planning an epoch), not sleeps.
    """
    input_dir = tmp_path / "in"
    write_input(input_dir, files=2, lines=40)
    ttl_s = 4.0
    mapping = pipeline_mapping(tmp_path, "paused-holder", input_dir, parallelism=2, epoch_records=40)
    mapping["lease"] = {"ttl_s": ttl_s}
    config_file = write_config(tmp_path / "paused-holder.yaml", mapping)
    config = config_from_mapping(mapping)
    run = ["run", "--config", str(config_file), "--json"]
    procs: list[subprocess.Popen[str]] = []

    def start(argv: list[str], pause_at: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [str(CLI), *argv],
            env=subprocess_env(SPLITKEEPER_PAUSE_AT=pause_at),
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    try:
        first = start(run, "after_plan@2")  # epoch 1 committed, epoch 2 planned: paused mid-epoch
        _until_stopped(first, "the first run")
        paused_at = time.monotonic()
        # the second watches the paused run's lease for its ttl of its own clock, takes it over,
        # restores checkpoint 1, plans its first epoch and pauses there, before its first commit
        second = start([*run, "--pipeline-json", json.dumps({"lease": {"wait_s": 60}})], "after_plan")
        _until_stopped(second, "the second run")
        assert time.monotonic() - paused_at >= ttl_s
        holder = DeltaStateStore(
            config.state.path, config.name, build_source(config.source).fingerprint(), read_only=True
        )
        assert {r.epoch for r in sink_rows(config.sink.path)} == {1}
        os.kill(first.pid, signal.SIGCONT)
        first_out, first_err = first.communicate(timeout=300)
        assert first.returncode == 2, first_err
        assert "[LEASE_LOST]" in first_err and "taken over by" in first_err, first_err
        assert first_out == ""
        assert {r.epoch for r in sink_rows(config.sink.path)} == {1}  # the first committed nothing
        assert holder.checkpoint_ids() == [1]
        os.kill(second.pid, signal.SIGCONT)
        second_out, second_err = second.communicate(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert second.returncode == 0, second_err
    assert json.loads(second_out)["finished"] is True
    rows = assert_sink_equals_source(None, config.sink.path, input_dir)
    assert 1 in {r.epoch for r in rows} and len({r.epoch for r in rows}) >= 2
