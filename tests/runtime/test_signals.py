"""SIGTERM and SIGINT on a bounded ``splitkeeper run`` (issue 19): a clean stop, not a crash.

A real ``splitkeeper run`` in a child process (its own driver and JVM) on a small files
pipeline; region 0 of epoch 2 stalls (a ``stall`` fault) so the signal lands in that epoch's
read phase. The run must abandon the epoch (nothing of it committed), release the lease and
exit 143 (SIGTERM) or 130 (SIGINT) with one error line and no traceback; the next run then
finishes with the sink equal to the input, line by line.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import load_config

from .helpers import (
    REPO,
    assert_sink_equals_source,
    pipeline_mapping,
    run_cli,
    subprocess_env,
    write_config,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STALL_S = 90


@pytest.mark.parametrize(
    ("sig", "code"),
    # SIGINT takes the same path as SIGTERM (one handler): its run is the slow variant
    [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow_variant)],
)
def test_a_signal_abandons_the_epoch_releases_the_lease_and_exits_128_plus_the_signal(
    spark: Any, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    input_dir = tmp_path / "in"
    write_input(input_dir, files=3, lines=40)
    mapping = pipeline_mapping(
        tmp_path, "sig", input_dir, parallelism=2, epoch_records=30, region_timeout_s=300
    )
    config_path = write_config(tmp_path / "p.yaml", mapping)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "splitkeeper",
            "run",
            "--config",
            str(config_path),
            "--fault",
            f"stall:{STALL_S}:0@2",
        ],
        env=subprocess_env(),
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if any(line.startswith("epoch    1 ") for line in lines):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "".join(lines[-30:])
        assert any(line.startswith("epoch    1 ") for line in lines), "".join(lines[-30:])
        time.sleep(3)  # epoch 2 is in its read phase: region 0 stalls for STALL_S
        signalled = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=120)
        stopped_after = time.monotonic() - signalled
        out = proc.stdout.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(timeout=10)
    err = "".join(lines)
    assert proc.returncode == code, err[-3000:]
    assert out == ""
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if "[INTERRUPTED]" in x]
    assert line == (
        f"splitkeeper run: [INTERRUPTED] {sig.name}: pipeline 'sig' stopped: epoch 2 was abandoned in its "
        "read phase (nothing of it is committed); the lease is released (latest checkpoint 1); run it again "
        "to go on from there"
    ), line
    assert stopped_after < STALL_S / 2  # abandoned, not waited out

    config = load_config(str(config_path))
    lease = services.status(config).lease
    assert lease is not None and lease["released"] is True, lease
    code_again, out_again, err_again = run_cli(["run", "--config", str(config_path)])
    assert code_again == 0, err_again
    assert "source finished on a global checkpoint" in out_again
    assert_sink_equals_source(spark, tmp_path / "sink", input_dir)
