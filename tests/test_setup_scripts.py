"""scripts/setup.sh, scripts/test.sh, .ci/run and README agree and behave.

Maven is replaced by a recording fake on PATH, so these tests never download and
can count how often setup.sh calls mvn.
"""

from __future__ import annotations

import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_MVN = r"""#!/usr/bin/env bash
# Records each call; "fetches" minimal jars into -Dsplitkeeper.jars.out.
echo "$*" >> "$FAKE_MVN_LOG"
offline=0; out=""; pom=""
prev=""
for a in "$@"; do
  case "$a" in
    --offline) offline=1 ;;
    -Dsplitkeeper.jars.out=*) out="${a#-Dsplitkeeper.jars.out=}" ;;
  esac
  [[ "$prev" == "-f" ]] && pom="$a"
  prev="$a"
done
if [[ "${FAKE_MVN_REFUSE:-0}" == 1 ]]; then echo "fake mvn: this test expects no Maven call" >&2; exit 3; fi
if [[ $offline == 1 && "${FAKE_MVN_OFFLINE_FAILS:-0}" == 1 ]]; then exit 1; fi
mkdir -p "$out"
case "$pom" in
  *kafka-broker.xml) touch "$out/kafka_2.13-4.1.1.jar" "$out/kafka-clients-4.1.1.jar" ;;
  *) touch "$out/delta-spark_4.1_2.13-4.4.0.jar" "$out/delta-storage-4.4.0.jar" \
           "$out/spark-sql-kafka-0-10_2.13-4.1.1.jar" "$out/kafka-clients-3.9.1.jar" ;;
esac
"""


@pytest.fixture
def fake_mvn(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text(FAKE_MVN)
    mvn.chmod(0o755)
    log = tmp_path / "mvn.log"
    log.touch()
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_MVN_LOG": str(log),
        "SPLITKEEPER_JARS_DIR": str(tmp_path / "jars"),
        "SPLITKEEPER_BROWSER_TESTS": "0",
    }


def _mvn_calls(env: dict[str, str]) -> list[str]:
    return Path(env["FAKE_MVN_LOG"]).read_text().splitlines()


def _setup(env: dict[str, str], *steps: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), *steps],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_setup_jars_fetches_once_then_the_stamp_skips_maven(fake_mvn, tmp_path):
    first = _setup(fake_mvn, "jars")
    assert first.returncode == 0, first.stderr
    calls = _mvn_calls(fake_mvn)
    assert len(calls) == 2  # one offline attempt per group, which the warm fake satisfies
    assert all("--offline" in c and "dependency:copy-dependencies" in c for c in calls)
    assert any("-f jvm/pom.xml" in c for c in calls) and any("-f jvm/kafka-broker.xml" in c for c in calls)
    assert (tmp_path / "jars" / "spark" / "delta-spark_4.1_2.13-4.4.0.jar").exists()
    assert (tmp_path / "jars" / "kafka" / "kafka_2.13-4.1.1.jar").exists()
    # the local file system is compiled with javac against pyspark's Hadoop, no Maven
    with zipfile.ZipFile(tmp_path / "jars" / "localfs" / "splitkeeper-localfs.jar") as jar:
        assert "dev/splitkeeper/hadoop/NioLocalFileSystem.class" in jar.namelist()
    assert "jars/localfs: built" in first.stdout
    assert not list((tmp_path / "jars").glob("*.partial"))

    second = _setup(fake_mvn, "jars")
    assert second.returncode == 0, second.stderr
    assert len(_mvn_calls(fake_mvn)) == 2  # no new mvn call
    assert "jars/spark: up to date" in second.stdout
    assert "jars/kafka: up to date" in second.stdout
    assert "jars/localfs: up to date" in second.stdout


def test_setup_refetches_only_the_group_whose_stamp_is_stale(fake_mvn, tmp_path):
    assert _setup(fake_mvn, "jars").returncode == 0
    (tmp_path / "jars" / ".kafka.stamp").write_text("stale\n")
    again = _setup(fake_mvn, "jars")
    assert again.returncode == 0, again.stderr
    new_calls = _mvn_calls(fake_mvn)[2:]
    assert len(new_calls) == 1 and "-f jvm/kafka-broker.xml" in new_calls[0]
    assert "jars/spark: up to date" in again.stdout


def test_setup_falls_back_to_the_network_when_offline_maven_fails(fake_mvn):
    env = {**fake_mvn, "FAKE_MVN_OFFLINE_FAILS": "1"}
    result = _setup(env, "jars")
    assert result.returncode == 0, result.stderr
    calls = _mvn_calls(env)
    assert [("--offline" in c) for c in calls] == [True, False, True, False]
    assert "downloading from https://repo.maven.apache.org/maven2" in result.stdout


def test_setup_rejects_jars_that_duplicate_pyspark(fake_mvn, tmp_path):
    script = Path(fake_mvn["PATH"].split(os.pathsep)[0]) / "mvn"
    script.write_text(
        FAKE_MVN.replace(
            '"$out/kafka-clients-3.9.1.jar" ;;',
            '"$out/kafka-clients-3.9.1.jar" "$out/scala-library-2.13.16.jar" ;;',
        )
    )
    result = _setup(fake_mvn, "jars")
    assert result.returncode != 0
    assert "scala-library-2.13.16.jar (ours) vs scala-library-2.13.17.jar (pyspark)" in result.stdout
    assert "excludeArtifactIds" in result.stderr


def test_full_setup_on_this_checkout_is_a_fast_no_op(fake_mvn):
    # test.sh ran setup.sh before pytest, so every stamp is current: nothing to do. The real
    # jars folder is in play here, so the fake Maven refuses to run: a stale stamp fails this
    # test instead of replacing the checkout's jars with the fake's empty files.
    env = {**fake_mvn, "FAKE_MVN_REFUSE": "1"}
    env.pop("SPLITKEEPER_JARS_DIR")
    result = _setup(env, "--dev")
    assert result.returncode == 0, result.stderr
    assert "python packages: up to date" in result.stdout
    assert "devpython: up to date" in result.stdout
    assert "jars/spark: up to date" in result.stdout
    assert "jars/kafka: up to date" in result.stdout
    assert "jars/localfs: up to date" in result.stdout
    assert "browser: skipped (SPLITKEEPER_BROWSER_TESTS=0)" in result.stdout
    assert "otelcol: up to date" in result.stdout
    assert _mvn_calls(env) == []


def test_setup_rejects_an_unknown_step(fake_mvn):
    result = _setup(fake_mvn, "everything")
    assert result.returncode == 1
    assert "unknown step 'everything'; choose from: --dev python jars devpython" in result.stderr


def _ci_command() -> str:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [ln for ln in lines if ln and not ln.startswith("#")]
    return commands[-1]


def test_ci_run_is_strict_bash_that_calls_scripts_test_sh():
    ci = ROOT / ".ci" / "run"
    text = ci.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert _ci_command() == "bash scripts/test.sh"
    assert os.access(ci, os.X_OK)


def test_readme_test_command_is_exactly_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    commands = {ln.strip() for block in blocks for ln in block.splitlines()}
    assert _ci_command() in commands
    assert "bash scripts/run.sh" in commands


def test_test_sh_runs_setup_then_pytest_with_arguments_passed_through():
    text = (ROOT / "scripts" / "test.sh").read_text()
    setup_at = text.index("bash scripts/setup.sh")
    pytest_at = text.index('-m pytest "$@"')
    assert setup_at < pytest_at


def test_test_sh_fails_loudly_when_pytest_collects_nothing():
    env = {**os.environ, "SPLITKEEPER_BROWSER_TESTS": "0"}
    result = subprocess.run(
        [
            "bash",
            "scripts/test.sh",
            "tests/test_setup_scripts.py",
            "-k",
            "no_test_has_this_name",
            "-p",
            "no:cacheprovider",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 5
    assert "pytest collected no tests (exit code 5)" in result.stderr


def test_kafka_sh_rejects_an_unknown_action():
    result = subprocess.run(["bash", "scripts/kafka.sh", "restart"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: bash scripts/kafka.sh start|stop|status" in result.stderr


def test_cluster_sh_rejects_an_unknown_action():
    argv = ["bash", "scripts/cluster.sh", "restart"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage: bash scripts/cluster.sh up|status|down" in result.stderr


def test_setup_cluster_step_is_on_request_only():
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert (
        "steps=(python jars)" in text
    )  # the default run (the demo's) builds neither the cluster nor dev tools
    assert "--dev) steps+=(otelcol python jars devpython browser compose)" in text
    assert "cluster) step_cluster ;;" in text
    assert "fetch_jars s3a jvm/s3a.xml" in text


@pytest.mark.parametrize(
    "script",
    [
        "scripts/setup.sh",
        "scripts/test.sh",
        "scripts/check.sh",
        "scripts/kafka.sh",
        "scripts/cluster.sh",
        "docker/spark/daemon.sh",
        ".ci/run",
    ],
)
def test_shell_scripts_parse_and_are_strict(script):
    path = ROOT / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "set -euo pipefail" in path.read_text()


def test_the_locks_pin_the_chosen_versions():
    pins = {}
    for lock in ("airflow.txt", "test.txt"):
        for line in (ROOT / "locks" / lock).read_text().splitlines():
            if m := re.match(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)", line):
                pins[m[1].lower().replace("_", "-")] = m[2]
    assert pins["pyspark"] == "4.1.1"
    assert pins["pyspark-client"] == pins["pyspark"]  # they share the pyspark/ folder
    assert pins["delta-spark"] == "4.4.1"
    assert pins["apache-airflow"] == "3.1.8"
    assert pins["great-expectations"] == "1.24.1"
    assert int(pins["pandas"].split(".")[0]) < 3
    assert {
        "confluent-kafka",
        "apache-airflow-providers-apache-spark",
        "pytest",
        "hypothesis",
        "ruff",
        "mypy",
    } <= set(pins)
    assert "splitkeeper" not in pins


def test_jvm_poms_pin_spark_and_delta_to_the_installed_python_packages():
    from importlib import metadata

    pom = (ROOT / "jvm" / "pom.xml").read_text()
    spark = metadata.version("pyspark")
    assert f"<spark.version>{spark}</spark.version>" in pom
    assert f"<spark.binary.version>{'.'.join(spark.split('.')[:2])}</spark.binary.version>" in pom
    delta_jvm = re.search(r"<delta.version>([^<]+)</delta.version>", pom)
    assert delta_jvm is not None
    assert delta_jvm.group(1).split(".")[:2] == metadata.version("delta-spark").split(".")[:2]
