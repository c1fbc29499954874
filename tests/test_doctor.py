"""``splitkeeper doctor``: every check reported, JSON mode, a fix for each missing piece."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from splitkeeper.cli import main
from splitkeeper.commands import doctor
from splitkeeper.commands.doctor import CheckResult, CheckStatus
from splitkeeper.spark import jars as jarlib

ROOT = Path(__file__).resolve().parents[1]

#: what a wheel needs; a checkout adds CHECKOUT_CHECKS
PRODUCT_CHECKS = [
    "java",
    "pyspark",
    "delta-spark (python)",
    "delta jar",
    "spark kafka connector",
    "spark classpath",
    "airflow",
    "great-expectations",
    "confluent-kafka",
    "prometheus-client",
]
CHECKOUT_CHECKS = ["maven", "kafka broker jars", "local file system jar"]
EXPECTED_CHECKS = PRODUCT_CHECKS + CHECKOUT_CHECKS


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "splitkeeper.cli", "doctor", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_doctor_reports_every_check_ready_on_a_set_up_checkout():
    result = _doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["check", "status"]
    for name in EXPECTED_CHECKS:
        row = next((line for line in lines if line.startswith(name + " ")), None)
        assert row is not None, f"no row for {name}"
        assert " OK " in row or " WARN " in row, row
    assert lines[-1] == "ready"


def test_doctor_json_mode_parses_and_lists_each_check_with_status_and_fix():
    result = _doctor("--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["ready"] is True
    assert [c["name"] for c in report["checks"]] == EXPECTED_CHECKS
    for check in report["checks"]:
        assert set(check) == {"name", "status", "detail", "fix", "required"}
        assert check["status"] in {"ok", "warn", "fail"}
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["pyspark"]["detail"].startswith("4.1.1")
    assert "delta-spark_4.1_2.13-" in by_name["delta jar"]["detail"]
    assert by_name["maven"]["required"] is False
    assert by_name["local file system jar"]["status"] == "ok"  # setup.sh builds it
    assert by_name["local file system jar"]["required"] is False


def test_doctor_without_jars_exits_1_with_a_fix_line_per_missing_piece(tmp_path):
    result = _doctor(env={"SPLITKEEPER_JARS_DIR": str(tmp_path / "empty")})
    assert result.returncode == 1
    fixes = [line for line in result.stdout.splitlines() if line.startswith("fix ")]
    # SPLITKEEPER_JARS_DIR names a folder of the user's: `jars fetch` fills it; the broker is the
    # checkout's (setup.sh builds it)
    assert fixes == [
        "fix delta jar: splitkeeper jars fetch",
        "fix spark kafka connector: splitkeeper jars fetch",
        "fix kafka broker jars: bash scripts/setup.sh",
    ]
    report = json.loads(_doctor("--json", env={"SPLITKEEPER_JARS_DIR": str(tmp_path / "empty")}).stdout)
    assert report["ready"] is False
    assert {c["name"] for c in report["checks"] if c["status"] == "fail"} == {
        "delta jar",
        "spark kafka connector",
        "kafka broker jars",
    }


def test_delta_jar_for_another_spark_version_fails_the_delta_check(tmp_path):
    spark_dir = tmp_path / "spark"
    spark_dir.mkdir()
    (spark_dir / "delta-spark_3.5_2.13-3.3.0.jar").write_bytes(b"")
    results = {r.name: r for r in doctor.check_delta(tmp_path)}
    assert results["delta jar"].status is CheckStatus.FAIL
    assert "no delta-spark_4.1_2.13 for Spark 4.1.1" in results["delta jar"].detail
    assert "delta-spark_3.5_2.13-3.3.0.jar" in results["delta jar"].detail


def test_spark_jar_duplicating_a_pyspark_jar_fails_the_classpath_check(tmp_path):
    spark_dir = tmp_path / "spark"
    spark_dir.mkdir()
    for name in ("spark-sql-kafka-0-10_2.13-4.1.1.jar", "scala-library-2.13.16.jar"):
        (spark_dir / name).write_bytes(b"")
    results = {r.name: r for r in doctor.check_kafka_connector(tmp_path)}
    assert results["spark classpath"].status is CheckStatus.FAIL
    assert (
        "scala-library-2.13.16.jar duplicates pyspark's scala-library-2.13.17.jar"
        in results["spark classpath"].detail
    )
    assert results["spark kafka connector"].status is CheckStatus.FAIL
    assert "kafka-clients" in results["spark kafka connector"].detail


def test_java_below_17_fails_with_the_install_command(tmp_path):
    fake = tmp_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    result = doctor.check_java(str(fake))
    assert result.status is CheckStatus.FAIL
    assert result.detail.startswith("11 at ")
    assert "openjdk-17" in result.fix


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_parse_java_version(text, major):
    assert doctor.parse_java_version(text) == major


def test_optional_failures_do_not_block_readiness():
    results = [
        CheckResult("java", CheckStatus.OK, "17"),
        CheckResult("maven", CheckStatus.WARN, "not found", "apt-get install -y maven", False),
    ]
    assert doctor.is_ready(results)
    assert not doctor.is_ready([*results, CheckResult("delta jar", CheckStatus.FAIL, "missing", "x")])


def test_doctor_is_reachable_through_the_cli_dispatcher(capsys):
    assert main(["doctor", "--json", "--jars-dir", str(Path("/nonexistent-splitkeeper-jars"))]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ready"] is False


@pytest.fixture
def as_a_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """splitkeeper as an installed wheel: no checkout above the package."""
    monkeypatch.setattr(doctor, "checkout_root", lambda: None)
    monkeypatch.setattr(jarlib, "checkout_root", lambda: None)


def test_a_wheel_user_gets_no_checkout_check_and_only_commands_they_have(as_a_wheel, tmp_path):
    """No FAIL for the broker jars a wheel does not ship, and no advice to run scripts/setup.sh."""
    results = doctor.run_checks(root=tmp_path / "empty")
    # (no jars folder at all: the classpath check has nothing to compare)
    assert [r.name for r in results] == [c for c in PRODUCT_CHECKS if c != "spark classpath"]
    fixes = {r.name: r.fix for r in results if r.status is CheckStatus.FAIL}
    assert fixes == {"delta jar": "splitkeeper jars fetch", "spark kafka connector": "splitkeeper jars fetch"}
    assert all("scripts/" not in r.fix for r in results)
    assert doctor.install_fix("metrics") == 'pip install "splitkeeper[metrics]"'


def test_pyspark_overwritten_by_another_pyspark_client_names_a_pair_that_exists(as_a_wheel, monkeypatch):
    """pyspark 4.1.4's metadata over pyspark-client 4.1.3's code: the fix reinstalls both at the one
    release splitkeeper's airflow extra pins them to (published for both), not at 4.1.4 (no client)."""
    versions = {"pyspark": "4.1.4", "pyspark-client": "4.1.3"}
    monkeypatch.setattr(doctor.metadata, "version", lambda dist: versions[dist])
    result = doctor.check_pyspark()
    assert result.status is CheckStatus.FAIL
    assert "metadata 4.1.4 but code 4.1.1" in result.detail  # the code here is the lock's 4.1.1
    pin = doctor.lockstep_pin()
    assert pin == "4.1.1"
    assert result.fix == f"pip install --force-reinstall --no-deps pyspark=={pin} pyspark-client=={pin}"
