"""``splitkeeper chaos --source kafka``: a reduced run proves exactly-once under every fault kind.

The chaos command starts its own broker, produces the messages, runs the pipeline as child
processes (region failures, a stalled region, a broker restart, a SIGKILLed driver, a
rescale) and checks the sink against every delivery report itself; this test runs it as a
user would and checks what it reports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime.helpers import subprocess_env  # tests/ is on sys.path (no __init__.py)

REPO = Path(__file__).resolve().parents[1]
FAULT_KINDS = {"reader_failure", "stalled_region", "broker_restart", "driver_sigkill", "rescale"}


def chaos(*argv: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``python -m splitkeeper chaos <argv>`` with the small local Spark of the runtime tests' children."""
    return subprocess.run(
        [sys.executable, "-m", "splitkeeper", "chaos", *argv],
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
def test_reduced_chaos_run_loses_and_duplicates_nothing_under_every_fault_kind(tmp_path: Path) -> None:
    done = chaos(
        "--source", "kafka", "--messages", "4000", "--seed", "7", "--json", "--workdir", str(tmp_path / "w"),
        timeout_s=3600,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["messages"] == 4000 and result["messages_not_delivered"] == 0
    assert result["kafka_matches_delivery_reports"] is True
    assert result["records_in_sink"] == 4000
    assert (result["records_lost"], result["records_duplicated"], result["records_unexpected"]) == (0, 0, 0)
    assert result["partitions_contiguous"] is True
    assert result["offsets_aligned"] is True
    assert result["restart_checks"] == "passed"
    assert {f["kind"] for f in result["faults_injected"]} == FAULT_KINDS
    assert result["faults_missing"] == [] and result["faults_skipped"] == []
    assert any(r["exit"] == -9 for r in result["runs"])  # the driver really died by SIGKILL
    assert result["checkpoints"]["regional"] >= 3  # two failed regions and a timed-out one
    assert result["elapsed_s"] > 0
    assert "PASSED: 4,000 messages, lost 0, duplicated 0" in done.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--source", "kafka", "--messages", "0"], "--messages=0 is not allowed: an integer >= 1"),
        (["--source", "files"], "argument --source: invalid choice: 'files'"),
        (["--source", "kafka", "--bootstrap-servers", "localhost"], "--bootstrap-servers='localhost'"),
    ],
    ids=["no-messages", "unknown-source", "bad-bootstrap"],
)
def test_bad_input_exits_2_naming_the_option_before_anything_starts(argv: list[str], message: str) -> None:
    done = chaos(*argv, timeout_s=120)

    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stdout == ""
    assert "starting a Kafka broker" not in done.stderr
