"""Two recovery runs at once: the lease refuses the second, and when the first freezes past its
lease, the fence keeps exactly-once (protocol rules 5.2 and 5.6).

Two ``splitkeeper recover`` processes (what two hand-triggered recovery DAG runs
start: each its own driver and JVM) restore the same pipeline from the same
checkpoint with a rescale to 3. The first is caught inside its epoch (a stalled
region keeps it reading) and frozen there with SIGSTOP — a driver paused by the
machine, as a long GC pause or an overloaded host does. A second one started at
once is refused by the lease, naming the holder, and writes nothing. Once the
frozen driver's lease expired (it cannot heartbeat), the next one takes it over,
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
from splitkeeper.spark.sources import build_source

from .helpers import (
    CLI,
    REPO,
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    run_pipeline,
    splitkeeper_subprocess,
    subprocess_env,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STALL_S = 30  # keeps the first recovery inside its epoch until the test has frozen it
LEASE_TTL_S = 15  # a frozen driver's lease expires this long after its last heartbeat
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
    assert [e.epoch for e in run_pipeline(config, spark, epochs=1).epochs] == [1]
    store = DeltaStateStore(
        config.state_path, config.name, build_source(config.source).fingerprint(), read_only=True
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
            refused = splitkeeper_subprocess(recover, timeout_s=300)  # the frozen run's lease is live
            time.sleep(max(0.0, frozen_at + LEASE_TTL_S + 1 - time.monotonic()))  # until it expired
            second = splitkeeper_subprocess(recover, timeout_s=600)
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
    sink_epochs = {r.epoch for r in spark.read.format("delta").load(config.sink_path).collect()}
    assert sink_epochs == {1, 3}

    code, out, err = run_cli(["validate", "--config", str(config_file), "--json"])
    assert code == 0, err + out
    code, out, err = run_cli(["run", "--config", str(config_file), "--json"])
    assert code == 0, err
    assert json.loads(out)["finished"] is True
    assert_sink_equals_source(spark, config.sink_path, input_dir)
