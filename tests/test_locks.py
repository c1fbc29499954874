"""The hashed lock files of locks/, what set-up installs from them, and the version ranges.

locks/bootstrap.txt (the installer uv and setuptools), locks/runtime.txt (every extra but airflow
and dev), locks/airflow.txt (every extra but dev, plus Airflow's PostgreSQL drivers),
locks/executor.txt (a Spark executor's imports, for the Spark image) and locks/test.txt (the dev
extra alone) are written by ``scripts/lock.sh`` with ``uv pip compile --universal
--generate-hashes`` (locks/README.md). Reading files only: the install of the locks into a fresh
venv with the system's bundled pip is tests/test_setup_fresh.py; the wheel in fresh venvs is
tests/test_install_airflow.py, a slow variant.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "locks"
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^ ;\\]+)")


def _lock(name: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of one hashed lock file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (LOCKS / name).read_text(encoding="utf-8").splitlines():
        if m := _PIN.match(line):
            current = canonicalize_name(m[1])
            assert current not in entries, f"{name}: {current} pinned twice"
            entries[current] = (m[2], [])
        elif (h := line.strip()).startswith("--hash=sha256:"):
            entries[current][1].append(h.removeprefix("--hash=sha256:").rstrip(" \\"))
        else:
            assert not line.strip() or line.lstrip().startswith("#"), f"{name}: unexpected line {line!r}"
    return entries


def _pins(entries: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    return {name: version for name, (version, _) in entries.items()}


RUNTIME, AIRFLOW, TEST = _lock("runtime.txt"), _lock("airflow.txt"), _lock("test.txt")
BOOTSTRAP, EXECUTOR = _lock("bootstrap.txt"), _lock("executor.txt")
LOCK_NAMES = ["bootstrap.txt", "runtime.txt", "airflow.txt", "executor.txt", "test.txt"]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PYPROJECT["project"]["optional-dependencies"]


@pytest.mark.parametrize("name", LOCK_NAMES)
def test_every_pin_of_every_lock_carries_sha256_hashes(name: str) -> None:
    entries = _lock(name)
    assert entries
    bare = [pkg for pkg, (_, hashes) in entries.items() if not hashes]
    assert bare == [], f"locks/{name}: pins without a hash (pip --require-hashes refuses them): {bare}"
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for _, hashes in entries.values() for h in hashes)


def test_the_locks_agree_with_each_other() -> None:
    runtime, airflow, test, executor = _pins(RUNTIME), _pins(AIRFLOW), _pins(TEST), _pins(EXECUTOR)
    # one version of a package whichever lock brings it (uv installs airflow.txt and test.txt together)
    assert {n: v for n, v in runtime.items() if airflow.get(n) != v} == {}
    assert {n: v for n, v in test.items() if n in airflow and airflow[n] != v} == {}
    assert {n: v for n, v in executor.items() if runtime.get(n) != v} == {}
    assert not (ROOT / "requirements.lock").exists(), "one source of truth: the hashed locks of locks/"


def test_the_installer_is_pinned_and_hashed_and_set_up_installs_exactly_the_locks() -> None:
    """The bundled pip of any venv installs only the bootstrap lock; uv installs the rest, hashes
    checked, no dependency resolution: nothing released after the lock can change or break it."""
    assert set(_pins(BOOTSTRAP)) == {"uv", "setuptools"}
    # the universal lock carries a wheel for every platform uv ships, not only this one
    assert len(BOOTSTRAP["uv"][1]) > 10
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "-m pip install --require-hashes --no-deps \\\n        -r locks/bootstrap.txt" in setup
    assert 'pip install --no-config --python "$VENV/bin/python" --require-hashes --no-deps' in setup
    assert "uv_install locks/airflow.txt" in setup and "uv_install locks/test.txt" in setup
    for name in LOCK_NAMES:  # universal: markers, not this machine's Python and platform
        text = (LOCKS / name).read_text(encoding="utf-8")
        assert "--python-version" not in text  # no header naming one interpreter
    assert "python_full_version" in (LOCKS / "airflow.txt").read_text(encoding="utf-8")


def test_each_lock_holds_its_part_and_test_tools_only_the_test_lock() -> None:
    tools = {canonicalize_name(Requirement(r).name) for r in EXTRAS["dev"]}
    assert tools <= set(_pins(TEST)) and "setuptools" in _pins(BOOTSTRAP)
    # jsonschema is also a runtime dependency (Great Expectations, altair); the others are tools only
    assert tools & set(_pins(AIRFLOW)) == {"jsonschema"}, "a test tool in locks/airflow.txt"
    assert "apache-airflow" not in _pins(TEST) and "pyspark" not in _pins(TEST)
    assert {"pyspark", "delta-spark", "deltalake", "confluent-kafka", "great-expectations"} <= set(
        _pins(RUNTIME)
    )
    assert "apache-airflow" not in _pins(RUNTIME)
    assert {"apache-airflow", "pyspark-client", "psycopg2-binary", "asyncpg"} <= set(_pins(AIRFLOW))
    assert _pins(AIRFLOW)["pyspark-client"] == _pins(AIRFLOW)["pyspark"]  # they share the pyspark/ folder
    # a Spark executor needs the record path's libraries and the package's own dependencies only
    assert {"pyarrow", "numpy", "confluent-kafka", "fastavro", "pydantic"} <= set(_pins(EXECUTOR))
    assert not {"pyspark", "apache-airflow", "great-expectations"} & set(_pins(EXECUTOR))


def test_every_lock_pin_is_inside_the_declared_ranges() -> None:
    declared = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    for reqs in EXTRAS.values():
        declared += [Requirement(r) for r in reqs if not r.startswith("splitkeeper")]
    union = {**_pins(AIRFLOW), **_pins(TEST)}
    outside = [
        f"{r} (locked {union[canonicalize_name(r.name)]})"
        for r in declared
        if not r.specifier.contains(union[canonicalize_name(r.name)], prereleases=True)
    ]
    assert outside == []


def test_floors_are_honest_and_every_range_is_capped() -> None:
    declared = {
        canonicalize_name(Requirement(r).name): Requirement(r).specifier
        for reqs in [PYPROJECT["project"]["dependencies"], *EXTRAS.values()]
        for r in reqs
        if not r.startswith("splitkeeper")
    }
    # Airflow: the oldest and newest tested releases (tests/test_install_airflow.py), nothing untested
    airflow = declared["apache-airflow"]
    assert airflow.contains("3.1.8") and airflow.contains("3.3.2")
    assert not airflow.contains("3.0.6") and not airflow.contains("3.4.0")
    # pyspark: only releases whose jars the shipped manifest has (tests/runtime/test_jars_fetch.py)
    spark_extra = {Requirement(r).name: Requirement(r).specifier for r in EXTRAS["spark"]}
    assert spark_extra["pyspark"].contains("4.1.3") and not spark_extra["pyspark"].contains("4.1.4")
    # pyspark-client (the Spark provider's) overwrites pyspark's code: the airflow extra pins both alike
    airflow_extra = {Requirement(r).name: str(Requirement(r).specifier) for r in EXTRAS["airflow"]}
    assert airflow_extra["pyspark-client"] == airflow_extra["pyspark"] == f"=={_pins(AIRFLOW)['pyspark']}"
    # floors from the APIs used (pyproject.toml says which), not the lock's own versions
    for name, floor, below in [
        ("pydantic", "2.5.0", "2.4.2"),
        ("structlog", "21.5.0", "21.4.0"),
        ("rich", "10.0.0", "9.13.0"),
    ]:
        assert declared[name].contains(floor) and not declared[name].contains(below), name
    uncapped = [name for name, spec in declared.items() if not any(s.operator in ("<", "==") for s in spec)]
    assert uncapped == []


def test_setup_installs_the_demos_needs_by_default_and_the_test_tools_with_dev() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "uv_install locks/airflow.txt" in setup.split("step_python()")[1].split("step_devpython()")[0]
    assert "uv_install locks/test.txt" in setup.split("step_devpython()")[1]
    assert "steps=(python jars)" in setup  # no chromium, docker-compose, Go build or test tools
    assert "--dev) steps+=(otelcol python jars devpython browser compose)" in setup
    test_sh = (ROOT / "scripts" / "test.sh").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/setup\.sh --dev\b", test_sh, re.M)
    run_sh = (ROOT / "scripts" / "run.sh").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/setup\.sh$", run_sh, re.M)
