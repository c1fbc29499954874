"""``splitkeeper status`` only reads: no Spark, no broker, nothing created; it shows the lease holder.

Runs the real CLI in a fresh interpreter, as a user's shell would, against a Kafka
pipeline whose broker address is a closed port.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from splitkeeper.delta.lease import LeaseOwner, PipelineLease
from splitkeeper.delta.tables import StateTables
from splitkeeper.process import identity as process_identity

REPO = Path(__file__).resolve().parents[1]

# The CLI's status, then which engines the interpreter ended up importing.
PROBE = """
import json, sys
from splitkeeper.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in ("pyspark", "py4j", "confluent_kafka", "airflow") if m in sys.modules)
print("PROBE " + json.dumps({"code": code, "loaded": loaded}))
"""


def _config(tmp_path: Path) -> Path:
    mapping = {
        "name": "orders-kafka",
        "parallelism": 2,
        "source": {"kind": "kafka", "bootstrap_servers": "127.0.0.1:1", "topics": ["orders"]},
        "state": {"path": str(tmp_path / "state")},
        "sink": {"path": str(tmp_path / "sink")},
    }
    path = tmp_path / "orders-kafka.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def _status(config: Path, *extra: str) -> tuple[dict, str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "status", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(config.parent),
    )
    elapsed = time.monotonic() - started
    probe = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert probe, done.stdout + done.stderr
    output = "\n".join(line for line in done.stdout.splitlines() if not line.startswith("PROBE "))
    return json.loads(probe[0][len("PROBE ") :]), output, elapsed


def test_status_of_a_pipeline_never_run_creates_nothing_and_needs_no_broker_or_spark(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "state").mkdir()  # a state folder without a checkpoint yet: nothing to complain about
    probe, output, elapsed = _status(config, "--json")
    assert probe == {"code": 0, "loaded": []}, output
    assert json.loads(output)["latest_checkpoint"] is None
    assert not any((tmp_path / "state").iterdir()) and not (tmp_path / "sink").exists()
    assert elapsed < 60  # a closed broker port must not make it wait out a connect timeout


def test_status_on_a_missing_state_folder_says_so_and_fails(tmp_path: Path) -> None:
    """Issue 19: a typo in state.path gave "no completed checkpoint yet" with exit code 0."""
    config = _config(tmp_path)
    probe, output, _elapsed = _status(config)
    assert probe == {"code": 2, "loaded": []}, output
    assert output == ""
    from splitkeeper.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["status", "--config", str(config)]) == 2
    assert err.getvalue().startswith(
        "splitkeeper status: [STATE_ERROR] pipeline 'orders-kafka' has no state folder at "
        f"{tmp_path / 'state'} (state.path in {config}): nothing to show. Check the path for a typo"
    ), err.getvalue()
    assert not (tmp_path / "state").exists() and not (tmp_path / "sink").exists()


def test_next_epoch_of_a_pipeline_never_run_is_1_without_a_state_folder(tmp_path: Path) -> None:
    """The demo's and the DAGs' fault injection asks for the next epoch before the first run: a
    missing state folder is not an error there (status refuses it as a likely typo)."""
    from splitkeeper.airflow import tasks
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config

    config = _config(tmp_path)
    assert tasks.next_epoch(str(config)) == 1
    (tmp_path / "state").mkdir()
    assert services.next_epoch(load_config(config)) == 1
    assert not (tmp_path / "sink").exists()


def test_status_names_the_lease_holder(tmp_path: Path) -> None:
    config = _config(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        command = "splitkeeper run --config orders-kafka.yaml"
        owner = LeaseOwner(socket.gethostname(), holder.pid, command, process_identity(holder.pid))
        PipelineLease(StateTables(str(tmp_path / "state")), "orders-kafka").take(owner, ttl_s=600)
        before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "state").rglob("*"))
        probe, output, _ = _status(config)
        assert probe == {"code": 0, "loaded": []}, output
        assert f"lease: 'splitkeeper run --config orders-kafka.yaml' (pid {holder.pid} on" in output, output
        probe, output, _ = _status(config, "--json")
        lease = json.loads(output)["lease"]
        assert f"pid {holder.pid}" in lease["holder"] and lease["released"] is False
        assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "state").rglob("*")) == before
    finally:
        holder.kill()
        holder.wait()


def test_status_shows_lag_per_split_phase_times_and_why_regions_failed_within_2_seconds(
    tmp_path: Path,
) -> None:
    """Issue 23: an on-call engineer reads each split's lag, each checkpoint's phases and the cause of
    every failed region from status (a demo-sized state: 40 attempts, 9 splits, 3 readers)."""
    from splitkeeper.app import services
    from splitkeeper.config.settings import load_config
    from tests.report.states import DECLINE, TIMEOUT, incident_state, phases_of

    config = _config(tmp_path)
    end = 100_000
    incident_state(
        tmp_path, checkpoints=40, end=end, regional_at=30, aborted_at=35, keep=10, pipeline="orders-kafka"
    )
    # the sink records the latest checkpoint's epoch (without it status says BLOCKED: a run would refuse)
    from splitkeeper.sinks.delta.sink import DeltaSink

    sink = DeltaSink(str(tmp_path / "sink"), "orders-kafka")
    sink.operator_commit(
        40, {"kind": "reset", "split": "orders-0", "from": 0, "forward": True}, expected=None, attempt_id="a"
    )

    started = time.monotonic()
    result = services.status(load_config(config), last=12)
    in_process = time.monotonic() - started
    # 39 completed checkpoints; region 1 (splits 1, 4, 7) declined once: its splits advanced 38 times
    expected = {f"orders-{i}": end - 10 * (i + 1) * (38 if i % 3 == 1 else 39) for i in range(9)}
    assert [(s.split, s.lag) for s in result.splits] == sorted(expected.items(), key=lambda kv: -kv[1])
    # each split's backlog boundary is its end: all still in backlog
    assert all(s.owner == int(s.split[-1]) % 3 and s.backlog is True for s in result.splits)
    assert {s.split: s.position + s.lag for s in result.splits if s.lag is not None} == dict.fromkeys(
        expected, end
    )
    lines = {t.id: t for t in result.timeline}
    assert lines[30].failures == (DECLINE.line(),) and lines[35].failures == (TIMEOUT.line(),)
    assert lines[40].phases_ms == {**phases_of(40), "commit": lines[40].phases_ms["commit"]}
    assert lines[29].phases_ms.keys() == {"plan", "read", "sink", "commit"}  # archived by retention: kept
    assert in_process < 2.0, f"status took {in_process:.2f}s"

    probe, output, elapsed = _status(config, "--last", "12", "--splits", "3")
    assert probe == {"code": 0, "loaded": []}, output
    table = [line.split() for line in output.splitlines() if line.startswith("    orders-")]
    top = sorted(expected.items(), key=lambda kv: -kv[1])[:3]
    assert [(row[0], row[4]) for row in table] == [(sid, f"{lag:,}") for sid, lag in top]
    assert "... 6 more" in output
    assert 'region 1 decline SplitReadError at split "orders-1" offset 120: ValueError: not JSON' in output
    assert "region 2 timeout Timeout: no result within 12s" in output
    assert (
        f"plan={phases_of(40)['plan']}ms read={phases_of(40)['read']}ms sink={phases_of(40)['sink']}ms"
        in output
    )
    probe, output, _ = _status(config, "--json")
    splits = json.loads(output)["splits"]
    assert {s["split"]: s["lag"] for s in splits} == expected
    print(f"status: {in_process:.2f}s in process, {elapsed:.2f}s as a fresh CLI process")
