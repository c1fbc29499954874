"""``splitkeeper simulate`` through the real entry point: JSON keys, exit codes, bad-input messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitkeeper.cli import main

SMALL = ["--readers", "3", "--splits", "12", "--steps", "80", "--failure-rate", "0.3", "--seed", "5"]
DOCUMENTED_KEYS = {
    "splits_lost",
    "splits_duplicated",
    "records_lost",
    "records_duplicated",
    "max_imbalance",
    "max_ref_chain_depth",
    "checkpoints",
    "moves_per_failover",
    "violations",
    "event_log",
    "shortest_failing_sequence",
}


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object], str]:
    code = main(["simulate", *args, "--json"])
    captured = capsys.readouterr()
    payload = json.loads(captured.out)  # exactly one JSON document on stdout
    assert isinstance(payload, dict)
    return code, payload, captured.err


def test_json_output_is_one_object_with_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, err = run_json(capsys, *SMALL, "--strategy", "round-robin")
    assert code == 0 and err == ""
    assert set(payload) >= DOCUMENTED_KEYS
    checkpoints = payload["checkpoints"]
    assert isinstance(checkpoints, dict) and set(checkpoints) == {"global", "regional", "aborted"}
    assert sum(checkpoints.values()) > 0
    assert (
        payload["ok"] is True and payload["violations"] == [] and payload["shortest_failing_sequence"] is None
    )
    assert payload["records_lost"] == 0 and payload["records_duplicated"] == 0
    assert isinstance(payload["moves_per_failover"], float)
    assert payload["config"]["strategy"] == "round-robin"  # type: ignore[index]
    assert len(payload["event_log"]) == 81  # type: ignore[arg-type]  # the start plus one line per step


def test_json_output_depends_only_on_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    first = run_json(capsys, *SMALL)[1]
    second = run_json(capsys, *SMALL)[1]
    assert first == second
    other = run_json(capsys, *SMALL[:-1], "6")[1]
    assert other["event_log"] != first["event_log"]


def test_the_documented_invocation_runs_clean(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, _ = run_json(
        capsys,
        "--readers", "16", "--splits", "256", "--steps", "200", "--failure-rate", "0.1",
        "--seed", "1", "--strategy", "least-loaded", "--max-consecutive-failures", "2",
    )  # fmt: skip
    assert code == 0 and payload["ok"] is True
    assert payload["max_imbalance"] <= 1  # type: ignore[operator]
    assert payload["max_ref_chain_depth"] <= 2  # type: ignore[operator]
    assert payload["config"]["max_consecutive_failures"] == 2  # type: ignore[index]


def test_a_broken_invariant_exits_1_with_the_shortest_sequence_in_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, payload, _ = run_json(capsys, *SMALL, "--inject-bug", "leaky-sink")
    assert code == 1 and payload["ok"] is False
    assert payload["violations"]
    shortest = payload["shortest_failing_sequence"]
    assert isinstance(shortest, dict)
    assert shortest["kind"] in ("offset_duplicate", "offset_unexpected")
    assert 1 <= len(shortest["events"]) <= 3 < shortest["original_events"]
    assert payload["records_duplicated"] > 0 or payload["records_unexpected"] > 0  # type: ignore[operator]


def test_a_broken_invariant_exits_1_and_prints_the_shortest_sequence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["simulate", *SMALL, "--inject-bug", "drop-split-on-add-back"])
    out = capsys.readouterr().out
    assert code == 1
    assert "result: FAILED" in out
    assert "shortest failing sequence for not_owned" in out
    assert "step 1:" in out and "neither pooled nor owned" in out


def test_summary_and_progress_lines_without_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", *SMALL, "--progress-every", "20"])
    captured = capsys.readouterr()
    assert code == 0
    assert "result: OK" in captured.out and "checkpoints" in captured.out and "steps/s" in captured.out
    progress = captured.err.strip().splitlines()
    assert [line.split(":")[0] for line in progress] == [f"step {n}/80" for n in (20, 40, 60, 80)]


def test_legacy_readers_and_a_broken_driver(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, _ = run_json(capsys, *SMALL, "--legacy-readers")
    assert code == 0 and payload["config"]["legacy_readers"] is True  # type: ignore[index]
    code, payload, _ = run_json(
        capsys, "--readers", "5", "--splits", "28", "--steps", "60", "--failure-rate", "0", "--seed", "4",
        "--inject-bug", "per-region-progress",
    )  # fmt: skip
    assert code == 1 and payload["shortest_failing_sequence"]["kind"] == "offset_duplicate"  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--readers", "0"], "--readers=0 is not allowed: an integer >= 1"),
        (["--readers", "-3"], "--readers=-3 is not allowed: an integer >= 1"),
        (["--failure-rate", "1.5"], "--failure-rate=1.5 is not allowed: a number from 0 to 1"),
        (["--failure-rate", "-0.1"], "--failure-rate=-0.1 is not allowed: a number from 0 to 1"),
        (["--failure-rate", "nan"], "--failure-rate=nan is not allowed: a number from 0 to 1"),
        (
            ["--strategy", "hash"],
            "--strategy='hash' is not allowed: one of least-loaded, legacy-hash, round-robin, weighted",
        ),
        (
            ["--max-consecutive-failures", "-1"],
            "--max-consecutive-failures=-1 is not allowed: an integer >= 0",
        ),
        (["--splits", "-1"], "--splits=-1 is not allowed: an integer >= 0"),
        (["--inject-bug", "gremlin"], "--inject-bug='gremlin' is not allowed: one of drop-split-on-add-back"),
    ],
)
def test_bad_input_exits_2_naming_the_value_and_what_is_allowed(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["simulate", *args, "--json"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert message in captured.err
    assert captured.err.startswith("splitkeeper simulate: [INVALID_PARAMETER]")


def test_a_non_numeric_option_is_rejected_by_the_parser_with_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--readers", "many"])
    assert exc.value.code == 2
    assert "argument --readers: invalid int value: 'many'" in capsys.readouterr().err


def test_json_mode_writes_nothing_to_stderr_even_when_the_driver_logs() -> None:
    """A weighted run rebalances and drops a removed subscription's splits: the driver logs both."""
    args = ["--readers", "8", "--splits", "64", "--steps", "300", "--failure-rate", "0.1"]
    command = [
        sys.executable,
        "-m",
        "splitkeeper",
        "simulate",
        *args,
        "--strategy",
        "weighted",
        "--seed",
        "1",
    ]
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo}
    plain = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert plain.returncode == 0 and "rebalanced by measured throughput" in plain.stderr  # it does log
    quiet = subprocess.run([*command, "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout)["ok"] is True
