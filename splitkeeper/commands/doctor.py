"""``splitkeeper doctor``: is this machine ready to run splitkeeper?

Checks Java, pyspark (and that pyspark-client did not overwrite it), delta-spark and the
Delta jar for this Spark, the Spark Kafka connector jars, Airflow, Great Expectations and
confluent-kafka. In a source checkout it also checks what only a checkout has: Maven (the
set-up's jar fetch), the Kafka broker jars of ``scripts/kafka.sh`` and splitkeeper's local
file system jar. Prints a table, or JSON with ``--json``; exits 1 when a required piece is
missing, each with the command that fixes it, for the audience at hand: ``bash
scripts/setup.sh`` in a checkout, ``pip install`` / ``splitkeeper jars fetch`` for an
installed wheel (it has no scripts/).

Nothing is imported from Airflow or Great Expectations (versions come from package
metadata), so the command answers in about a second.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from splitkeeper.errors import EnvironmentNotReadyError
from splitkeeper.resources import checkout_root
from splitkeeper.spark import jars as jarlib

MIN_JAVA = 17


def in_checkout() -> bool:
    """splitkeeper runs from a source checkout (editable install or PYTHONPATH), not a wheel."""
    return checkout_root() is not None


def install_fix(extra: str) -> str:
    """The command that installs the Python packages of ``extra``: set-up in a checkout, pip otherwise."""
    if in_checkout():
        return jarlib.SETUP_FIX
    return f'pip install "splitkeeper[{extra}]"'


def jars_fix(root: Path | None) -> str:
    """The command that fills the Spark jar group: ``splitkeeper jars fetch`` for a wheel."""
    return jarlib.setup_fix(jarlib.JarGroup.SPARK, root)


def lockstep_pin() -> str | None:
    """The one version splitkeeper's ``airflow`` extra pins pyspark and pyspark-client to, if any."""
    for req in metadata.requires("splitkeeper") or ():
        match = re.match(r"^pyspark-client\s*==\s*([0-9][^;\s]*)", req)
        if match:
            return match.group(1)
    return None


class CheckStatus(enum.Enum):
    OK = "ok"
    WARN = "warn"  # works, with a caveat, or an optional piece is missing
    FAIL = "fail"  # a required piece is missing or wrong


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One row of the report. ``fix`` is a command or instruction, empty when OK."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
    required: bool = True

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "status": self.status.value}


def _not_ready(err: EnvironmentNotReadyError) -> str:
    folder = err.params.get("folder")
    return f"missing: {folder}" if folder else err.message


def parse_java_version(text: str) -> int | None:
    """The major version in ``java -version`` output (``1.8.0_x`` -> 8, ``17.0.15`` -> 17)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):
        return int(match.group(2))
    return major


def check_java(java: str | None = None) -> CheckResult:
    fix = "apt-get install -y openjdk-17-jdk-headless (or set JAVA_HOME to a JDK >= 17)"
    exe = java or jarlib.java_executable()
    if shutil.which(exe) is None and not Path(exe).exists():
        return CheckResult("java", CheckStatus.FAIL, "not found", fix)
    try:
        out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return CheckResult("java", CheckStatus.FAIL, f"{exe} -version failed: {err}", fix)
    version = parse_java_version(out.stderr + out.stdout)
    if version is None:
        return CheckResult("java", CheckStatus.FAIL, f"cannot read the version of {exe}", fix)
    if version < MIN_JAVA:
        return CheckResult("java", CheckStatus.FAIL, f"{version} at {exe}; need >= {MIN_JAVA}", fix)
    return CheckResult("java", CheckStatus.OK, f"{version} ({shutil.which(exe) or exe})")


def check_maven() -> CheckResult:
    path = shutil.which("mvn")
    if path is None:
        return CheckResult(
            "maven",
            CheckStatus.WARN,
            "not found (only setup needs it)",
            "apt-get install -y maven",
            required=False,
        )
    return CheckResult("maven", CheckStatus.OK, path, required=False)


def check_pyspark() -> CheckResult:
    """pyspark's package metadata and its importable code must be the same version.

    They differ when pyspark-client of another version overwrote pyspark's files (both install
    into ``pyspark/``; the Airflow Spark provider requires pyspark-client). The fix names a
    version both are published in: the one splitkeeper's ``airflow`` extra pins them to.
    """
    name = "pyspark"
    try:
        dist = metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return CheckResult(name, CheckStatus.FAIL, "not installed", install_fix("spark"))
    client = _dist_version("pyspark-client")
    pin = lockstep_pin() or (client if client else dist)
    realign = (
        f"pip install --force-reinstall --no-deps pyspark=={pin} pyspark-client=={pin}"
        if client
        else f"pip install --force-reinstall --no-deps pyspark=={dist}"
    )
    try:
        import pyspark
    except Exception as err:  # a broken install raises anything from ImportError to AttributeError
        return CheckResult(name, CheckStatus.FAIL, f"{dist} installed but import fails: {err}", realign)
    code = getattr(pyspark, "__version__", "?")
    if code != dist:
        return CheckResult(
            name,
            CheckStatus.FAIL,
            f"metadata {dist} but code {code} (pyspark-client {client} overwrote it?)",
            realign,
        )
    if client not in (None, dist):
        return CheckResult(name, CheckStatus.FAIL, f"{dist}, but pyspark-client is {client}", realign)
    return CheckResult(name, CheckStatus.OK, f"{dist} ({Path(pyspark.__file__).parent})")


def check_delta(root: Path | None) -> list[CheckResult]:
    """delta-spark (Python) and the Delta jar built for the installed Spark's major.minor."""
    results = []
    py_version = _dist_version("delta-spark")
    if py_version is None:
        results.append(
            CheckResult("delta-spark (python)", CheckStatus.FAIL, "not installed", install_fix("spark"))
        )
    else:
        results.append(CheckResult("delta-spark (python)", CheckStatus.OK, py_version))
    spark_version = _dist_version("pyspark")
    if spark_version is None:
        results.append(
            CheckResult(
                "delta jar", CheckStatus.FAIL, "pyspark missing: cannot choose the jar", install_fix("spark")
            )
        )
        return results
    wanted = jarlib.delta_artifact(spark_version)
    try:
        jars = jarlib.list_jars(jarlib.JarGroup.SPARK, root)
    except EnvironmentNotReadyError as err:
        results.append(CheckResult("delta jar", CheckStatus.FAIL, _not_ready(err), jars_fix(root)))
        return results
    jar = jarlib.find_jar(jars, wanted)
    if jar is None:
        others = [j.path.name for j in jars if j.artifact.startswith("delta-spark")]
        detail = f"no {wanted} for Spark {spark_version}" + (
            f" (found {', '.join(others)})" if others else ""
        )
        results.append(CheckResult("delta jar", CheckStatus.FAIL, detail, jars_fix(root)))
    elif py_version and _major_minor(jar.version) != _major_minor(py_version):
        results.append(
            CheckResult(
                "delta jar",
                CheckStatus.WARN,
                f"{jar.path.name}, but delta-spark (python) is {py_version}",
                f"pip install --no-deps delta-spark=={jar.version}"
                if not in_checkout()
                else "align delta.version in jvm/pom.xml with locks/runtime.txt, then bash scripts/setup.sh",
            )
        )
    else:
        results.append(CheckResult("delta jar", CheckStatus.OK, str(jar.path)))
    return results


def check_kafka_connector(root: Path | None) -> list[CheckResult]:
    """The Spark Kafka connector of the installed Spark version and its runtime jars,
    and that nothing in ``<root>/spark`` duplicates a jar pyspark ships."""
    name = "spark kafka connector"
    spark_version = _dist_version("pyspark")
    try:
        jars = jarlib.list_jars(jarlib.JarGroup.SPARK, root)
    except EnvironmentNotReadyError as err:
        return [CheckResult(name, CheckStatus.FAIL, _not_ready(err), jars_fix(root))]
    needed = [
        jarlib.kafka_connector_artifact(),
        "spark-token-provider-kafka-0-10_2.13",
        "kafka-clients",
        "commons-pool2",
    ]
    missing = [a for a in needed if jarlib.find_jar(jars, a) is None]
    connector = jarlib.find_jar(jars, jarlib.kafka_connector_artifact())
    results = []
    if missing:
        results.append(CheckResult(name, CheckStatus.FAIL, f"missing {', '.join(missing)}", jars_fix(root)))
    elif connector is not None and spark_version and connector.version != spark_version:
        results.append(
            CheckResult(
                name,
                CheckStatus.FAIL,
                f"{connector.path.name} does not match Spark {spark_version}",
                jars_fix(root),
            )
        )
    else:
        found = [jarlib.find_jar(jars, a) for a in needed]
        results.append(CheckResult(name, CheckStatus.OK, ", ".join(j.path.name for j in found if j)))
    try:
        bundled = [jarlib.JarFile.parse(p) for p in sorted(jarlib.pyspark_jars_dir().glob("*.jar"))]
    except EnvironmentNotReadyError as err:
        results.append(CheckResult("spark classpath", CheckStatus.FAIL, _not_ready(err), jars_fix(root)))
        return results
    dups = jarlib.duplicate_jars(jars, bundled)
    if dups:
        detail = "; ".join(f"{a.path.name} duplicates pyspark's {b.path.name}" for a, b in dups)
        fix = (
            "add them to excludeArtifactIds in jvm/pom.xml, then bash scripts/setup.sh jars"
            if in_checkout()
            else f"remove them from {jars[0].path.parent}, then splitkeeper jars fetch"
        )
        results.append(CheckResult("spark classpath", CheckStatus.FAIL, detail, fix))
    else:
        results.append(
            CheckResult(
                "spark classpath", CheckStatus.OK, f"{len(jars)} extra jars, none duplicates pyspark's"
            )
        )
    return results


def check_kafka_broker(root: Path | None) -> CheckResult:
    name = "kafka broker jars"
    try:
        jars = jarlib.list_jars(jarlib.JarGroup.KAFKA, root)
        jarlib.kafka_classpath(root)
    except EnvironmentNotReadyError as err:
        return CheckResult(name, CheckStatus.FAIL, _not_ready(err), jarlib.SETUP_FIX)
    broker = jarlib.find_jar(jars, "kafka_2.13")
    assert broker is not None  # kafka_classpath checked it
    return CheckResult(
        name, CheckStatus.OK, f"Kafka {broker.version}, {len(jars)} jars in {broker.path.parent}"
    )


def check_local_file_system(root: Path | None) -> CheckResult:
    """splitkeeper's Hadoop local file system (optional: without it local commits are slower)."""
    name = "local file system jar"
    try:
        jar = jarlib.localfs_jar(root)
    except EnvironmentNotReadyError as err:  # no jars root: an installed package without SPLITKEEPER_JARS_DIR
        return CheckResult(name, CheckStatus.WARN, _not_ready(err), jarlib.SETUP_FIX, required=False)
    if jar is None:
        return CheckResult(
            name,
            CheckStatus.WARN,
            f"not built: {jarlib.group_dir(jarlib.JarGroup.LOCALFS, root) / jarlib.LOCALFS_JAR}",
            "install a JDK with javac (apt-get install -y openjdk-17-jdk-headless), "
            "then bash scripts/setup.sh jars",
            required=False,
        )
    return CheckResult(name, CheckStatus.OK, str(jar), required=False)


def check_python_package(
    name: str, dist: str, module: str, extra: str, min_major: int | None = None
) -> CheckResult:
    """Installed (metadata) and importable (module found; not imported, to stay fast)."""
    version = _dist_version(dist)
    if version is None or importlib.util.find_spec(module) is None:
        return CheckResult(name, CheckStatus.FAIL, "not installed", install_fix(extra))
    if min_major is not None and int(version.split(".")[0]) < min_major:
        return CheckResult(name, CheckStatus.FAIL, f"{version}; need >= {min_major}", install_fix(extra))
    return CheckResult(name, CheckStatus.OK, version)


def run_checks(root: Path | None = None, java: str | None = None) -> list[CheckResult]:
    """Every check, in report order. ``root`` overrides the jars root. The checks of what only a
    source checkout has (Maven, the broker jars, the local file system jar) run only in one."""
    checks: list[Callable[[], CheckResult | list[CheckResult]]] = [
        lambda: check_java(java),
        check_pyspark,
        lambda: check_delta(root),
        lambda: check_kafka_connector(root),
        lambda: check_python_package("airflow", "apache-airflow", "airflow", "airflow", min_major=3),
        lambda: check_python_package(
            "great-expectations", "great-expectations", "great_expectations", "quality", min_major=1
        ),
        lambda: check_python_package("confluent-kafka", "confluent-kafka", "confluent_kafka", "kafka"),
        lambda: check_python_package(
            "prometheus-client", "prometheus-client", "prometheus_client", "metrics"
        ),
    ]
    if in_checkout():
        checks += [check_maven, lambda: check_kafka_broker(root), lambda: check_local_file_system(root)]
    results: list[CheckResult] = []
    for check in checks:
        outcome = check()
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results


def is_ready(results: Sequence[CheckResult]) -> bool:
    return all(r.status is not CheckStatus.FAIL for r in results if r.required)


def render_table(results: Sequence[CheckResult]) -> str:
    rows = [("check", "status", "version / path", "fix")]
    rows += [(r.name, r.status.value.upper(), r.detail, r.fix) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(3)] + [row[3]]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ---")
    return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--jars-dir", type=Path, default=None, help="jars root (default: .jars or $SPLITKEEPER_JARS_DIR)"
    )


def run(args: argparse.Namespace) -> int:
    results = run_checks(root=args.jars_dir)
    ready = is_ready(results)
    if args.json:
        print(json.dumps({"ready": ready, "checks": [r.to_json() for r in results]}, indent=2))
    else:
        print(render_table(results))
        failed = [r for r in results if r.required and r.status is CheckStatus.FAIL]
        if failed:
            print()
            for r in failed:
                print(f"fix {r.name}: {r.fix}")
        else:
            print("\nready")
    return 0 if ready else 1


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
